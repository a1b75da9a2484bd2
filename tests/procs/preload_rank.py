"""A rank for tests/test_preload_run.py: prints one JSON line (``{"rank": ...}``) with its rank, pid, attempt, CPU
affinity and where ``preload_mark`` was imported (pid, time: the helper's when it was preloaded), then acts on its
``key=value`` arguments: ``kill_helper=R``: rank R SIGKILLs the helper it was forked from; ``fail=R``: rank R exits 3
in the first attempt (after the others printed); ``sleep=S``: every rank sleeps S seconds (after ``up`` files in
``dir=D``); ``membind=1`` adds numactl's view of its memory policy."""
import json
import os
import signal
import subprocess
import sys
import time

import preload_mark

opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
report = {"rank": rank, "pid": os.getpid(), "attempt": attempt, "mark_pid": preload_mark.PID, "mark_t": preload_mark.T,
          "cpus": sorted(os.sched_getaffinity(0)), "mark": os.environ.get("XRUN_TEST_MARK")}
if opts.get("membind"):
    shown = subprocess.run(["numactl", "--show"], capture_output=True, text=True).stdout.splitlines()
    report["policy"] = [line for line in shown if line.startswith(("policy", "membind"))]
print(json.dumps(report), flush=True)
if opts.get("dir"):
    open(os.path.join(opts["dir"], f"up-{rank}-{attempt}"), "w").close()
if opts.get("kill_helper") == str(rank) and attempt == 0:
    os.kill(preload_mark.PID, signal.SIGKILL)
    time.sleep(1.0)  # the agent sees it go while this rank still runs
if opts.get("fail") == str(rank) and attempt == 0:
    time.sleep(0.5)
    sys.exit(3)
time.sleep(float(opts.get("sleep", "0")))
