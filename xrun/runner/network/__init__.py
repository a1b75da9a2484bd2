"""``xrun check --network``: find the slow or unreachable node before a job does (issue 24).

Pure in the middle: ``rounds`` plans the pairwise rounds (DLRover's scheme), ``verdict`` names each node ok,
slow or unreachable from literal figures. ``coordinate`` runs the rounds against any ``Prober`` (something that
runs directed probes between nodes: today the probe processes that ``remote`` starts over ssh, later the
agents of a job for ``--precheck``); ``report`` prints the table or the JSON. The node side is
``xrun.launch.network``. Imports ``remote_options`` at most at module level; ssh itself loads when used.
"""
