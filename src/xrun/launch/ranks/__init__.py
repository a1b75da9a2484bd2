"""The supervised ranks: what each rank starts with (env, argv), their start, sessions, teardown, the reaper. Their
devices and CPU sets are ``xrun.common.ranks``: the head's dry run computes them too.

May import ``launch.procs``, ``launch.preload``, ``launch.telemetry`` and ``xrun.common``.
"""
