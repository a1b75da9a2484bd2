"""Node layer (every node): turns one node spec into supervised rank processes. Never imports ``xrun.runner``.

Folders, lowest first; each imports only those before it (``tests/test_layers.py`` holds the order):
``procs`` (the kernel's view of processes), ``output`` (prefix, logs, de-duplication, console route),
``result`` (outcomes, reports, summary, stacks as data), ``ranks`` (env, binding, devices, supervision),
``doctor`` (py-spy stacks and the silence watch), ``elastic`` (torch's agent). ``spec`` (the node spec the layer
is handed) and ``store`` (the TCPStore rank 0's node hosts for each attempt) sit at the bottom with ``procs``.
Above them the pipeline: ``agent_cli`` (the stand-alone agent's command line), ``command`` (both command lines
rendered), ``preflight``, ``engine_env``, ``agent`` (run a node's ranks); beside it ``check_probe``, what
``xrun check`` asks of a node (``python -m xrun.launch.check_probe``).
At the top ``session``: the agent of a multi-node run, its state machine and the one driver that runs it
(``python -m xrun.launch --connect``, pod mode's every node), and ``__main__``, the dispatch between the two.
"""
