"""A module to preload that remembers the process that imported it (tests/test_preload_run.py): a rank forked from
the preload helper finds the helper's pid and import time here; a rank that imported it itself finds its own. ``PRELOAD_MARK_SLEEP=S``: its import takes S seconds more."""
import os
import time

PID = os.getpid()
T = time.time()
time.sleep(float(os.environ.get("PRELOAD_MARK_SLEEP", "0")))
