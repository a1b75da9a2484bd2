"""A module whose import leaves a native thread running that no fork handler stops: faulthandler's watchdog thread
(tests/test_preload.py)."""
import faulthandler

faulthandler.dump_traceback_later(3600)
