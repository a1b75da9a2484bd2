"""A realistic rank: import torch, join a gloo process group (env://), one all-reduce, clean shutdown.

``key=value`` arguments: ``dir=RUN_DIR``; writes ``RUN_DIR/ranks/<pid>`` at start and ``RUN_DIR/ok/<pid>``
when the all-reduce returned WORLD_SIZE.
"""
import os
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
run_dir = opts["dir"]
with open(os.path.join(run_dir, "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {os.environ.get('RANK', '?')}\n")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
dist.destroy_process_group()
if int(x.item()) == int(os.environ["WORLD_SIZE"]):
    with open(os.path.join(run_dir, "ok", str(os.getpid())), "w") as f:
        f.write(f"{time.time()!r}\n")
