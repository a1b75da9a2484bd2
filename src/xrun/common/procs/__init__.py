"""Signals and posix helpers both layers use: owned signals and their latch (``signals``), signal names and
``leave`` (``posix``). The node's process table and watchdog are ``xrun.launch.procs``.
"""
