"""Head-node layer: command line -> hosts -> selection -> plan -> backend -> job. Never imports ``xrun.launch``:
the runs that join the head and a node in one process (the local run, a pod node) are ``xrun.joined``, above
both, handed to ``cli`` as ``InProcess`` (``backends.base``).

Folders, lowest first; each imports only those before it (``tests/test_layers.py`` holds the order):
``hosts`` (where the nodes come from); then the request and its plan (``plan``, ``remote_options``,
``envpass``, pod mode's flags and placement, and the backend registry ``backends/__init__``, which the planner
asks for traits); ``job`` (the state machine, control server, relay, status); ``pod`` (every node starts xrun
itself); ``backends`` (how the agents are started). At the top: ``cli`` parses and wires, ``planner`` turns the
request into the plan (hosts, backend, plan), ``dryrun``/``validate`` show and check the plan, ``check`` is ``xrun
check``.
"""
