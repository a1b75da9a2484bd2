"""What a node shows: rank output (the ``[host:rank]`` prefix, per-rank logs, de-duplication, where the console
goes) and xrun's own lines (``status``: ``say``, the join's status line).

Shared: the head's merged console and status line are rendered here too. May import ``common.procs``.
"""
