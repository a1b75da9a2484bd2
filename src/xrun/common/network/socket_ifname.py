"""``--network_interface NAME|auto|none``: the ``*_SOCKET_IFNAME`` variables a node gives its ranks (issue 24).

``auto`` (the default) sets them only when the job spans several nodes (one node talks over loopback whatever
the variables say), to this node's interface on the route to the master address (``interfaces``); ``NAME`` sets
them to NAME on every node (a node without it stops with one line naming its interfaces, exit 2:
``MissingInterface``); ``none`` sets nothing. A value the user set (``NCCL_SOCKET_IFNAME=^docker,lo``) always stays.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence

from xrun.common.network import interfaces
from xrun.errors import UsageError

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
AUTO = "auto"
NONE = "none"


class MissingInterface(UsageError):
    """``--network_interface NAME`` on a node that lacks NAME: bad input (exit 2), not a node failure; its agent
    says so to the runner with that exit code (``xrun.launch.session.driver``), so the job ends with 2 as well."""

    def __init__(self, host: str, name: str, names: tuple[str, ...]) -> None:
        super().__init__("--network_interface", f"{host} has no interface {name!r}; it has: {', '.join(names)}")


def check_mode(flag: str, value: str) -> str:
    """The flag's value as given; a NAME is checked on each node, not here (names may differ per node)."""
    if not value or any(c.isspace() for c in value) or "," in value:
        raise UsageError(flag, f"{value!r} is not an interface name; use NAME, {AUTO} or {NONE}")
    return value


def check_interface_name(host: str, name: str, names: Sequence[str]) -> None:
    """``--network_interface NAME`` on a node that lacks it: one line naming the node and what it has."""
    if name not in names:
        raise MissingInterface(host, name, tuple(names))


def interface_variables(interface: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the ``*_SOCKET_IFNAME`` variables to add; a value the user set stays as it is."""
    if not interface:
        return {}
    return {name: interface for name in VARIABLES if name not in env}


def gloo_trap(host: str, nodes: int) -> str | None:
    """One line when this host's name resolves to a loopback address while the job spans several nodes."""
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
    if mode != AUTO:
        check_interface_name(host, mode, interfaces.interface_names())
        return interface_variables(mode, env)
    master = env["MASTER_ADDR"]
    choice = interfaces.interface_toward(master)
    if choice.interface is None:
        print(f"xrun: {host}: no route to the master address {master}; GLOO_SOCKET_IFNAME and "
              "NCCL_SOCKET_IFNAME left to the libraries", file=sys.stderr)
    return interface_variables(choice.interface, env)
