"""A node's result and its reports: each rank's outcome, the exit-code rule, the failure report, the summary,
the hints, and ranks' stacks as data with their merged view; the views the head computes from every node's
(``collectiveview``, ``stragglers``) and the dump file both write (``dumpfile``).

May import ``common.procs``, ``common.output`` and ``common.telemetry``.
"""
