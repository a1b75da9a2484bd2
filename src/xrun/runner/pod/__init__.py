"""Pod mode: every node starts xrun itself (Kubernetes, PAI, Volcano, a batch system, a person on each node).

Placement from the platform's variables, the shared secret, node 0's server and the hello policy: the head
layer's part. Each node's runtime (``xrun.joined.pod``, above both layers) joins them to the node's own part, node
0's included: the node layer's agent (``xrun.launch.session``), handed a ``PodNode``.
May import ``runner.hosts``, ``runner.job``, the head's plan modules, ``xrun.common`` and ``xrun.channel``.
"""
