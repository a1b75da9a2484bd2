"""Node layer (every node): turns one node spec into supervised rank processes. Never imports ``xrun.runner``.

Folders, lowest first; each imports only those before it (``tests/test_layers.py`` holds the order):
``procs`` (the kernel's view of processes), ``output`` (prefix, logs, de-duplication, console route),
``result`` (outcomes, reports, summary, stacks as data), ``ranks`` (env, binding, devices, supervision),
``doctor`` (py-spy stacks and the silence watch), ``elastic`` (torch's agent). ``spec`` (the node spec the layer
is handed) sits at the bottom with ``procs``. At the top, the pipeline: ``cli``/``connect`` (the agent's command
lines), ``agent`` (run a node), ``command``, ``preflight``, ``engine_env``.
"""
