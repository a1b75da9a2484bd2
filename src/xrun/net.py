"""Socket questions both layers ask the kernel: a free TCP port, the master port a job will use, and the local
address on the route to a peer.

Stdlib only and free to import: the head (``xrun.runner``), the node agent (``xrun.launch``) and
``xrun.discovery`` may all use it. ``port_holder`` imports psutil, and only on the error path.

``master_port`` is node 0's one decision about rank 0's store port (issue 17): a port the user gave must be free
(else ``PortBusyError`` naming host, port and holder, before any rank starts); a default one is kept when free
and replaced by a kernel-chosen free port when taken, so a busy 29500 never kills a job.
"""

from __future__ import annotations

import errno
import random
import socket

from xrun.errors import PortBusyError


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def free_port(addr: str, *, every_address: bool = False, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port the kernel reports free on ``addr`` (``every_address``: on every address of ``addr``'s family).

    The port is drawn from ``pick_window(ephemeral)`` (``ephemeral``: the kernel's range, read from /proc when
    None), and from ``bind(0)`` only where the ephemeral range leaves no window. The port is released before this
    returns, so another process may take it before its user binds it; the control channel therefore agrees on one
    port per run (node 0 picks, everyone is told) instead of guessing.
    """
    family, host = _family(addr), "" if every_address else addr
    window = pick_window(ephemeral_range() if ephemeral is None else ephemeral)
    for _ in range(64 if window else 0):  # outside the ephemeral range: no outgoing connection is given it meanwhile
        port = random.choice(window)  # noqa: S311 - spreads, not secret
        if _bindable(family, host, port):
            return port
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# A port from bind(0) is an ephemeral one: between its release and rank 0's bind, the kernel may hand it to any
# outgoing connection as its source port, even a rank's own connect to that very port (a TCP self-connect),
# and rank 0's store then fails with EADDRINUSE. Ports outside the ephemeral range are never handed out so.
PICK_FROM = 20000
PORT_MAX = 65535


def pick_window(ephemeral: tuple[int, int]) -> range:
    """The ports ``free_port`` draws from, given the kernel's ephemeral range ``(low, high)``: ``PICK_FROM`` up to
    ``low`` (Linux's default 32768-60999 gives 20000-32767), else, where the range starts at or below
    ``PICK_FROM``, the ports above ``high``; empty where the range covers both (``bind(0)`` is all that is left).
    """
    low, high = ephemeral
    if low > PICK_FROM:
        return range(PICK_FROM, low)
    return range(max(high + 1, PICK_FROM), PORT_MAX + 1)


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (ip(7) ``ip_local_port_range``); the whole port space where unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            low, high = (int(word) for word in f.read().split()[:2])
    except (OSError, ValueError):
        return (1, PORT_MAX)
    return (low, high)


def _bindable(family: int, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def route_source(addr: str, port: int = 22) -> str:
    """The local address the kernel would use to reach ``addr`` (a UDP ``connect`` sends no packet).

    Raises OSError when there is no route.
    """
    with socket.socket(_family(addr), socket.SOCK_DGRAM) as probe:
        probe.connect((addr, port))
        return str(probe.getsockname()[0])


def port_in_use(port: int) -> bool:
    """Whether binding ``port`` on every address would fail as rank 0's store would (EADDRINUSE).

    SO_REUSEADDR as torch's TCPStore sets it: a port left in TIME_WAIT by an earlier job counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def port_holder(port: int) -> str | None:
    """``pid 123 (python)``: the process listening on ``port``, where the system says (psutil reads /proc; another
    user's process shows no pid), else None."""
    try:
        import psutil  # lazy: the error path only, psutil stays off the launch path

        conns = psutil.net_connections(kind="tcp")
    except Exception:  # noqa: BLE001 - no psutil, or psutil.AccessDenied: the system does not say
        return None
    for conn in conns:
        if conn.status == "LISTEN" and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                name = psutil.Process(conn.pid).name()
            except Exception:  # noqa: BLE001 - gone meanwhile, or not ours to read
                return f"pid {conn.pid}"
            return f"pid {conn.pid} ({name})"
    return None


def master_port(host: str, port: int, *, pick: bool, near: str = "0.0.0.0") -> int:  # noqa: S104 - see below
    """Rank 0's store port on this node (node 0), decided before any rank starts.

    ``pick``: ``port`` is only a preference (0: none): kept when free, else a kernel-chosen free port on every
    address of ``near``'s family (rank 0's store listens on all of them). Otherwise ``port`` was given and must
    be free: ``PortBusyError`` names the host, the port and its holder.
    """
    if port and not port_in_use(port):
        return port
    if pick:
        return free_port(near, every_address=True)
    raise PortBusyError(host, port, port_holder(port))
