"""Pod mode: every node starts xrun itself (Kubernetes, PAI, Volcano, a batch system, a person on each node).

Placement from the platform's variables, the shared secret, node 0's server and the hello policy, and the run's
head-layer part (``run``): each node's own part, node 0's included, is the node layer's agent
(``xrun.launch.session``), handed a ``PodNode``.
May import ``runner.hosts``, ``runner.job``, the head's plan modules, ``xrun.common`` and ``xrun.channel``; and
``runtime``, which runs this node's agent in the same process, ``xrun.launch.session`` (test_layers' COMPOSITION).
"""
