"""A rank for the elastic scenario: in the first generation one rank fails, in the next everyone exits 0.

``key=value`` arguments: ``dir=RUN_DIR``, ``fail_rank=R``, ``fail_after=SECONDS``, ``code=N``, ``sleep=SECONDS``
(the first generation's survivors sleep until the agent stops them). Every rank writes
``RUN_DIR/ranks/<pid>`` = "start_time rank restart_count"; the failing one writes ``RUN_DIR/fail_ts`` right
before ``os._exit(code)``.
"""
import os
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
run_dir = opts["dir"]
rank = int(os.environ.get("RANK", "-1"))
generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.path.join(run_dir, "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {rank} {generation}\n")
if generation == 0:
    if rank == int(opts.get("fail_rank", "1")):
        time.sleep(max(0.0, t0 + float(opts.get("fail_after", "1")) - time.time()))
        with open(os.path.join(run_dir, "fail_ts.tmp"), "w") as f:
            f.write(repr(time.time()))
        os.rename(os.path.join(run_dir, "fail_ts.tmp"), os.path.join(run_dir, "fail_ts"))
        os._exit(int(opts.get("code", "7")))
    time.sleep(float(opts.get("sleep", "60")))
