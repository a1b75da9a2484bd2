"""``--network_interface NAME|auto|none``: the ``*_SOCKET_IFNAME`` variables a node gives its ranks (issue 24).

``auto`` (the default) sets them only when the job spans several nodes (one node talks over loopback whatever
the variables say), to this node's interface on the route to the master address; ``NAME`` sets them to NAME on
every node (a node without it stops with one line naming its interfaces, exit 2); ``none`` sets nothing. A value
the user set (``NCCL_SOCKET_IFNAME=^docker,lo``) always stays.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping

from xrun.errors import UsageError
from xrun.launch.network.modes import AUTO, NONE


def check_mode(flag: str, value: str) -> str:
    """The flag's value as given; a NAME is checked on each node, not here (names may differ per node)."""
    if not value or any(c.isspace() for c in value) or "," in value:
        raise UsageError(flag, f"{value!r} is not an interface name; use NAME, {AUTO} or {NONE}")
    return value


def gloo_trap(host: str, nodes: int) -> str | None:
    """One line when this host's name resolves to a loopback address while the job spans several nodes."""
    from xrun.launch.network import interfaces  # noqa: PLC0415 - a job of several nodes only

    name = socket.gethostname()
    addr = interfaces.hostname_is_loopback(name)
    if addr is None:
        return None
    return (f"xrun: {host}: this host's name {name!r} resolves to {addr} (loopback) while the job spans {nodes} "
            "nodes: Gloo binds that address unless GLOO_SOCKET_IFNAME names an interface (fix /etc/hosts)")


def rank_network_env(host: str, mode: str, env: Mapping[str, str], nodes: int) -> dict[str, str]:
    """The variables to add to every rank's ``env`` on this node (``nodes``: how many the job spans)."""
    if nodes > 1:
        trap = gloo_trap(host, nodes)
        if trap:
            print(trap, file=sys.stderr)
    if mode == NONE or (mode == AUTO and (nodes <= 1 or not env.get("MASTER_ADDR"))):
        return {}  # one node talks over loopback whatever the variables say
    from xrun.launch.network import interfaces  # noqa: PLC0415 - the kernel's routes: only when there is a choice

    if mode != AUTO:
        interfaces.check_interface_name(host, mode, interfaces.interface_names())
        return interfaces.interface_variables(mode, env)
    master = env["MASTER_ADDR"]
    choice = interfaces.interface_toward(master)
    if choice.interface is None:
        print(f"xrun: {host}: no route to the master address {master}; GLOO_SOCKET_IFNAME and "
              "NCCL_SOCKET_IFNAME left to the libraries", file=sys.stderr)
    return interfaces.interface_variables(choice.interface, env)
