"""A realistic rank: import torch, join a gloo process group (env://), one all-reduce, clean shutdown.

``key=value`` arguments: ``dir=RUN_DIR``; writes ``RUN_DIR/ranks/<pid>`` ("start_time rank restart_count") at
start and ``RUN_DIR/ok/<pid>`` (the time) when the all-reduce returned WORLD_SIZE. ``hold=SECONDS``: stay that long
after it (the memory of a job at work). ``fail_rank=R``: in the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0)
rank R writes ``RUN_DIR/fail_ts`` after the all-reduce and exits 7, and the others wait to be stopped; the next
attempt's ranks do the all-reduce and exit 0.
"""
import os
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
run_dir = opts["dir"]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.path.join(run_dir, "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {os.environ.get('RANK', '?')} {attempt}\n")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
failing = "fail_rank" in opts and attempt == 0
if failing and int(os.environ["RANK"]) == int(opts["fail_rank"]):
    with open(os.path.join(run_dir, "fail_ts.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.rename(os.path.join(run_dir, "fail_ts.tmp"), os.path.join(run_dir, "fail_ts"))
    os._exit(7)
if failing:
    time.sleep(120)  # until the launcher stops this attempt
if int(x.item()) == int(os.environ["WORLD_SIZE"]):
    with open(os.path.join(run_dir, "ok", str(os.getpid())), "w") as f:
        f.write(f"{time.time()!r}\n")
time.sleep(float(opts.get("hold", "0")))
dist.destroy_process_group()
