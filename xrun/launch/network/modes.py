"""``--network_interface``'s words and the variables it sets: what every run reads, without the kernel readers.

Kept apart from ``interfaces`` so a local run (one node: nothing to choose) loads neither ``ipaddress`` nor
``fcntl`` nor the route table's dataclasses (issue 25 §4: nothing on the start path that the start does not need).
"""

from xrun.errors import UsageError

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
AUTO = "auto"
NONE = "none"


class MissingInterface(UsageError):
    """``--network_interface NAME`` on a node that lacks NAME: bad input (exit 2), not a node failure; its agent
    says so to the runner with that exit code (``xrun.launch.session.machine``), so the job ends with 2 as well."""

    def __init__(self, host: str, name: str, names: tuple[str, ...]) -> None:
        super().__init__("--network_interface", f"{host} has no interface {name!r}; it has: {', '.join(names)}")
