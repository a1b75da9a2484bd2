"""The hang doctor on a node: live ranks' stacks with py-spy, the silence watch, stacks on demand and at a failure.

It plugs into a rank group (``launch.ranks``), so it sits above it: may import ``launch.procs``,
``launch.preload``, ``launch.telemetry``, ``launch.ranks`` and ``xrun.common``.
"""
