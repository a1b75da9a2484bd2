"""A training-like step loop: import torch, join a gloo group, then ``steps`` steps of a small matmul and an
all-reduce of 4096 float32 (one collective a step, as a data-parallel step's gradient bucket), timed inside.

``key=value`` arguments: ``dir=RUN_DIR``, ``steps=N`` (default 2000), ``warmup=N`` (default 50). Writes
``RUN_DIR/ranks/<pid>`` at start and ``RUN_DIR/ok/<pid>``: the median step time in seconds, the whole loop's
time, and the rank's peak RSS (KiB), space-separated.
"""
import os
import resource
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
run_dir = opts["dir"]
steps, warmup = int(opts.get("steps", "2000")), int(opts.get("warmup", "50"))
with open(os.path.join(run_dir, "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {os.environ.get('RANK', '?')}\n")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
grad = torch.ones(4096)
a = torch.randn(128, 128)


def step() -> None:
    (a @ a).sum()
    dist.all_reduce(grad)


for _ in range(warmup):
    step()
dist.barrier()
times = []
loop0 = time.perf_counter()
for _ in range(steps):
    s = time.perf_counter()
    step()
    times.append(time.perf_counter() - s)
loop_s = time.perf_counter() - loop0
dist.destroy_process_group()
times.sort()
rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(os.path.join(run_dir, "ok", str(os.getpid())), "w") as f:
    f.write(f"{times[len(times) // 2]!r} {loop_s!r} {rss_kib}\n")
