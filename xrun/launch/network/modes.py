"""``--network_interface``'s words and the variables it sets: what every run reads, without the kernel readers.

Kept apart from ``interfaces`` so a local run (one node: nothing to choose) loads neither ``ipaddress`` nor
``fcntl`` nor the route table's dataclasses (issue 25 §4: nothing on the start path that the start does not need).
"""

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
AUTO = "auto"
NONE = "none"
