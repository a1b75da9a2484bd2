"""The supervised ranks: what each rank starts with (env, devices, core binding), their sessions, the reaper.

May import ``launch.procs``, ``launch.output``, ``launch.result`` and ``launch.spec``.
"""
