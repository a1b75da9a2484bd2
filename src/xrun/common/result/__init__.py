"""A node's result and its reports: each rank's outcome, the exit-code rule, the failure report, the summary,
the hints, and ranks' stacks as data with their merged view.

May import ``launch.procs`` and ``launch.output``.
"""
