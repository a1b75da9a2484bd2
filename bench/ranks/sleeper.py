"""A rank that sleeps; one chosen rank may fail early. Used by the failure, signal and memory scenarios.

``key=value`` arguments: ``dir=RUN_DIR`` (pid file ``RUN_DIR/ranks/<pid>`` with the start time),
``sleep=SECONDS`` for everyone, ``fail_rank=R`` (global rank that fails, -1 for none), ``fail_after=SECONDS``,
``code=N``; or ``fail_host=NAME`` (the rank with LOCAL_RANK 0 on that host fails instead). The failing rank
writes ``RUN_DIR/fail_ts`` (time.time(), CLOCK_REALTIME) right before ``os._exit(code)`` so the bench can time
everything from the moment it died.
"""
import os
import socket
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
run_dir = opts["dir"]
rank = int(os.environ.get("RANK", "-1"))
with open(os.path.join(run_dir, "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {rank}\n")
on_host = opts.get("fail_host") == socket.gethostname() and os.environ.get("LOCAL_RANK") == "0"
if rank == int(opts.get("fail_rank", "-1")) or on_host:
    time.sleep(max(0.0, t0 + float(opts.get("fail_after", "1")) - time.time()))
    with open(os.path.join(run_dir, "fail_ts.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.rename(os.path.join(run_dir, "fail_ts.tmp"), os.path.join(run_dir, "fail_ts"))
    os._exit(int(opts.get("code", "7")))
time.sleep(float(opts.get("sleep", "30")))
