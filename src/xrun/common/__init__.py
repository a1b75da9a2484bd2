"""The shared layer, below both the head (``xrun.runner``) and the node (``xrun.launch``), which never import
each other (issue 38 §2): what both need. Imports neither layer; may import ``xrun.channel`` and ``xrun``'s shared
top-level modules.

Folders, lowest first (``tests/test_layers.py`` holds the order): ``procs`` (signals, posix helpers), ``output``
(line records, rendering, log files, the status line), ``telemetry`` (the records that cross the channel),
``network`` (the ranks' interface, the probe's terms), ``preload`` (a python command line as python
reads it, the dry run's module check), ``result`` (a node's result, its report, the summary, stacks and the views
of many ranks), ``ranks`` (each rank's devices and CPU set). Modules: ``spec`` (the node spec), ``rdzv``
(rendezvous settings), ``rankplan`` (every rank's argv and env from the world), ``command`` (the agent's command
lines), ``preflight`` (what must hold on a node before any rank starts), ``agent_cli`` (the agent's flags, also
``xrun``'s).
"""
