"""A module whose import fails (tests/test_preload.py)."""
raise RuntimeError("refusing to load here")
