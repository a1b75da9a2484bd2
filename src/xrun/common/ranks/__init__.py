"""Each rank's devices and CPU set, computed the same by the head (the dry run, this machine's pool) and by
every node's agent. Each rank's environment and argv, and supervising the ranks, are ``xrun.launch.ranks``.
"""
