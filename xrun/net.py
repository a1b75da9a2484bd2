"""Socket questions both layers ask the kernel: a free TCP port, and the local address on the route to a peer.

Stdlib only and free to import: the head (``xrun.runner``), the node agent (``xrun.launch``) and
``xrun.discovery`` may all use it.
"""

from __future__ import annotations

import socket


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def free_port(addr: str, *, every_address: bool = False) -> int:
    """A TCP port the kernel reports free on ``addr`` (``every_address``: on every address of ``addr``'s family).

    The port is released before this returns, so another process may take it before its user binds it; the
    control channel therefore agrees on one port per run (node 0 picks, everyone is told) instead of guessing.
    """
    with socket.socket(_family(addr), socket.SOCK_STREAM) as sock:
        sock.bind(("" if every_address else addr, 0))
        return int(sock.getsockname()[1])


def route_source(addr: str, port: int = 22) -> str:
    """The local address the kernel would use to reach ``addr`` (a UDP ``connect`` sends no packet).

    Raises OSError when there is no route.
    """
    with socket.socket(_family(addr), socket.SOCK_DGRAM) as probe:
        probe.connect((addr, port))
        return str(probe.getsockname()[0])
