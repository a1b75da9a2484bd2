"""Node layer (every node): turns one node spec into supervised rank processes. Never imports ``xrun.runner``;
what it shares with the head (the spec, the rank plan, the agent's flags and command lines, the console, the
result views) is ``xrun.common``, below both.

Folders, lowest first; each imports only those before it (``tests/test_layers.py`` holds the order):
``procs`` (the ``/proc`` table, the watchdog), ``network`` (the probes), ``telemetry`` (reading the ranks),
``preload`` (the helper that forks ranks) and ``store`` (the TCPStore rank 0's node hosts for each attempt) at the
bottom; ``ranks`` (supervision: spawn, teardown, the reaper), ``doctor`` (py-spy stacks and the silence watch),
``elastic`` (torch's agent). Above them the pipeline: ``agent`` (run a node's ranks), ``engine_env``; beside it
``check_probe``, what ``xrun check`` asks of a node (``python -m xrun.launch.check_probe``).
At the top ``session``: the agent of a multi-node run, its state machine and the one driver that runs it
(``python -m xrun.launch --connect``, pod mode's every node, a one-node job's). ``__main__`` is no module of this
layer but a process's entry, a root that nothing imports: its dispatch hands ``--connect`` to ``session`` and the
stand-alone agent to a one-node job above both layers (``xrun.joined.standalone``).
"""
