"""A module whose import leaves a Python thread running (tests/test_preload.py)."""
import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="ticker", daemon=True).start()
