"""Rank output on a node: the ``[host:rank]`` prefix, per-rank logs, de-duplication, where the console goes.

May import ``launch.procs``; nothing else of the node layer.
"""
