"""The network check's node side (issue 24). Stdlib only; torch only in the all-reduce worker, a process of its
own. Which interface the ranks use, and the probe's terms the head asks with, are ``xrun.common.network``.

The probes, low to high: ``tcp_probe`` (the client that measures latency and throughput against a peer, and the echo
and sink it talks to), ``allreduce_pair`` (``--network=allreduce``: a pair's torch group, both sides; each rank is a
``python -m xrun.launch.network.allreduce_worker``), ``probe_server`` (the node's listening socket: a mode byte
picks one of those), ``probe_commands`` (the node's hello and one probe command, answered alike however asked).
Asked two ways: ``python -m xrun.launch.network`` (``__main__``) is the probe process that ``xrun check --network``
starts over ssh and drives with JSON lines; ``precheck_answers`` answers a job's ``--precheck`` over the control
channel while the agent waits for a start. The head's side is ``xrun.runner.network``.

May import ``xrun.errors``, ``xrun.channel`` and ``xrun.common.network``; nothing else of xrun.
"""
