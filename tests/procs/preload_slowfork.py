"""A module that makes every fork of the process that imports it slow, and says when one began: a file
``fork-PID`` in $PRELOAD_FORK_DIR (tests/test_preload.py kills the helper in that window)."""
import os
import time


def _slow() -> None:
    open(os.path.join(os.environ["PRELOAD_FORK_DIR"], f"fork-{os.getpid()}"), "w").close()
    time.sleep(0.5)


os.register_at_fork(after_in_child=_slow)
