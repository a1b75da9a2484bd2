"""What a node shows: rank output (the ``[host:rank]`` prefix, per-rank logs, de-duplication, where the console
goes) and xrun's own lines (``status``: ``say``, the join's status line).

May import ``launch.procs``; nothing else of the node layer.
"""
