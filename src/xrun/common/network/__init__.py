"""The ranks' network interface (``interfaces``, ``socket_ifname``) and the terms of a network probe
that the head asks with and the node measures by (``probe_terms``). The probes are ``xrun.launch.network``.
"""
