"""The node's network, seen from the node (issue 24): which interface leads to the master, and a small TCP probe.

``interfaces`` picks the interface on the route to the master address (pure over literal route tables and
addresses, with thin readers of the kernel's) and turns it into ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` for
the ranks; ``probe`` is a stdlib echo/sink server and the client that measures latency and throughput against a
peer's server; ``python -m xrun.launch.network`` runs one probe process that the head (``xrun check --network``)
drives with JSON lines. Stdlib only (psutil, when installed, only widens the address list); imports ``spec``-level
modules at most, so any agent (and a later ``--precheck`` over the control channel) can use it.
"""
