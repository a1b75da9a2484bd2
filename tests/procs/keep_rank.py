"""A rank for ``--on_rank_exit keep`` (tests/test_on_rank_exit.py): ``keep_rank.py DIR CODE``.

Rank 1 leaves a daemon behind (a double fork and setsid, as NVRx's per-rank monitor does), then exits 1. Every
other rank waits until rank 1 is gone, gives xrun half a second to stop it (it must not), records whether rank 1's
daemon still runs, and exits with CODE (``hold``: waits for a signal instead). A SIGTERM to a rank leaves
``DIR/term.<rank>``.
"""

import os
import signal
import sys
import time

directory, code = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])


def wait(condition, limit=60.0):
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.005)


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def on_term(signum, frame):
    open(os.path.join(directory, f"term.{rank}"), "w").close()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
if rank == 1:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(directory, "daemon.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(directory, "daemon.tmp"), os.path.join(directory, "daemon"))
            time.sleep(120)
        os._exit(0)
    os.wait()
    wait(lambda: os.path.exists(os.path.join(directory, "daemon")))
    with open(os.path.join(directory, "rank1.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(directory, "rank1.tmp"), os.path.join(directory, "rank1"))
    sys.exit(1)
wait(lambda: os.path.exists(os.path.join(directory, "rank1")))
wait(lambda: gone(int(open(os.path.join(directory, "rank1")).read())))  # reaped by xrun, the ranks' subreaper
time.sleep(0.5)
daemon = int(open(os.path.join(directory, "daemon")).read())
if not gone(daemon):
    open(os.path.join(directory, f"daemon-alive.{rank}"), "w").close()
if code == "hold":
    open(os.path.join(directory, f"holding.{rank}"), "w").close()
    time.sleep(120)
sys.exit(int(code))
