"""A module that takes a minute to import, and says so in the helper's command line (tests/test_preload.py)."""
import ctypes
import time

ctypes.CDLL(None).prctl(15, b"preload_slow", 0, 0, 0)  # PR_SET_NAME: a test waits for it in /proc/PID/comm
time.sleep(60)
