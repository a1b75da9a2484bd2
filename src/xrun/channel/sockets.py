"""The channel's sockets: how long a silent peer may stay silent, and the options that bound it.

A connection that does not open with a valid hello within ``HELLO_TIMEOUT`` is closed without a byte sent
back: a stray (or hostile) client learns nothing, not even which check failed.

Liveness: both ends set TCP keepalive (idle ``KEEPALIVE_IDLE`` s, then ``KEEPALIVE_COUNT`` probes
``KEEPALIVE_INTERVAL`` s apart) and ``TCP_USER_TIMEOUT`` so unacknowledged data fails the socket after
``USER_TIMEOUT`` s; the runner also pings every ``PING_INTERVAL`` s and declares an agent lost after
``DEAD_AFTER`` s of silence. A silent cut is therefore noticed within about 10 s on either side; a process
death (``kill -9``, node power-off with the kernel alive on the other end) is noticed at once through EOF.
"""

from __future__ import annotations

import socket

HELLO_TIMEOUT = 10.0

PING_INTERVAL = 2.0
DEAD_AFTER = 10.0
KEEPALIVE_IDLE = 2
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
USER_TIMEOUT = 10.0


def tune_socket(sock: socket.socket) -> None:
    """Low latency for small messages and a bounded time to notice a silent peer (see the module doc)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", int(USER_TIMEOUT * 1000)),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has all four; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
