"""Which interface a node's ranks should use: the one on the route to the master address (issue 24).

NCCL picks the first interface not matching ``^lo,docker`` and Gloo binds whatever ``gethostname()`` resolves to
(a host that maps its name to 127.0.1.1 breaks it, pytorch/gloo #223), so on a host with several networks both
need ``*_SOCKET_IFNAME``. The choice, in order (``select_interface``, pure):

1. the master address is one of this node's own: the interface holding it (the kernel's route to a local
   address is ``lo``, which no peer can reach);
2. the kernel's source address toward the master (a UDP ``connect`` sends nothing) is held by an interface:
   that one (this follows policy routing too);
3. the longest matching prefix of ``/proc/net/route`` (lowest metric on a tie).

The readers (``read_routes``, ``read_addresses``) are the only code that touches the kernel. What the ranks are
given from the choice (``--network_interface``) is ``socket_ifname``'s.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_SIOCGIFADDR = 0x8915  # netdevice(7): an interface's primary IPv4 address

Addresses = Mapping[str, Sequence[str]]  # interface name -> its addresses


@dataclass(frozen=True)
class Route:
    """One line of /proc/net/route (IPv4, main table); ``interface`` '*' is an unreachable/blackhole route."""

    interface: str
    network: int
    mask: int
    metric: int = 0

    @property
    def prefix(self) -> int:
        return bin(self.mask).count("1")


def _hex_le(field: str) -> int:
    """/proc/net/route writes addresses as host-order (little-endian here) hex: 00004D0A is 10.77.0.0."""
    return int.from_bytes(bytes.fromhex(field), "little")


def parse_routes(text: str) -> tuple[Route, ...]:
    """The routes of /proc/net/route's text (header line skipped, malformed lines ignored)."""
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            routes.append(Route(fields[0], _hex_le(fields[1]), _hex_le(fields[7]), int(fields[6])))
        except ValueError:
            continue
    return tuple(routes)


def holder(address: str, addresses: Addresses) -> str | None:
    """The interface that holds ``address``, if any."""
    for name, held in addresses.items():
        if address in held:
            return name
    return None


def route_interface(dest: str, routes: Sequence[Route]) -> str | None:
    """The longest matching prefix of the route table (lowest metric on a tie); None when no route or '*'."""
    try:
        ip = int(ipaddress.IPv4Address(dest))
    except ValueError:
        return None
    matching = [r for r in routes if ip & r.mask == r.network & r.mask]
    if not matching:
        return None
    best = max(matching, key=lambda r: (r.prefix, -r.metric))
    return None if best.interface == "*" else best.interface


def select_interface(dest: str, source: str | None, routes: Sequence[Route], addresses: Addresses) -> str | None:
    """Pure: the interface toward ``dest`` given the kernel's ``source`` address for it, routes and addresses."""
    return holder(dest, addresses) or (holder(source, addresses) if source else None) or route_interface(dest, routes)


def read_routes(path: str = "/proc/net/route") -> tuple[Route, ...]:
    try:
        with open(path, encoding="ascii") as f:
            return parse_routes(f.read())
    except OSError:
        return ()


def read_addresses(*, wide: bool = False) -> dict[str, tuple[str, ...]]:
    """Every interface and its primary IPv4 address from the kernel (``SIOCGIFADDR``, stdlib); ``wide``: psutil's
    view instead when installed (secondary and IPv6 addresses too; it costs an import at agent start)."""
    if wide:
        wider = _psutil_addresses()
        if wider is not None:
            return wider
    return {name: _primary_ipv4(name) for _, name in socket.if_nameindex()}


def _psutil_addresses() -> dict[str, tuple[str, ...]] | None:
    try:
        import psutil  # optional: widens the view, never required

        found = psutil.net_if_addrs()
    except Exception:  # noqa: BLE001 - no psutil, or it cannot read: the caller keeps the stdlib view
        return None
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: tuple(a.address.split("%")[0] for a in addrs if a.family in families)
            for name, addrs in found.items()}


def _primary_ipv4(name: str) -> tuple[str, ...]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address
            return ()
    return (socket.inet_ntoa(packed[20:24]),)


def resolvable(host: str) -> str | bytes:
    """An ASCII host name as bytes: ``getaddrinfo`` then takes it as it is instead of loading the ``idna`` codec
    (about 1 ms of every node's start), and a malformed name is a resolver error (an ``OSError``), not a
    ``UnicodeError``."""
    return host.encode("ascii") if host.isascii() else host


def resolve(host: str) -> str | None:
    """``host``'s first IPv4 (else IPv6) address as this node resolves it; None when it does not."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0]) if infos else None


def _source_toward(dest: str) -> str | None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in dest else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((dest, 9))  # a UDP connect only asks the kernel for a route: nothing is sent
            return str(probe.getsockname()[0])
    except OSError:
        return None


@dataclass(frozen=True)
class Choice:
    """The interface toward a host, and this node's address on that route (what its peers connect to)."""

    interface: str | None
    source: str | None


def interface_toward(host: str) -> Choice:
    """Ask the kernel: the interface on this node's route to ``host`` (a name or an address)."""
    dest = resolve(host)
    if dest is None:
        return Choice(None, None)
    source = _source_toward(dest)
    addresses = read_addresses()
    if holder(dest, addresses) is None and (source is None or holder(source, addresses) is None):
        addresses = read_addresses(wide=True)  # a secondary or IPv6 address: only psutil lists those
    chosen = select_interface(dest, source, read_routes(), addresses)
    if holder(dest, addresses) is not None:
        source = dest  # the master's own node: peers reach it at the master address, not over lo
    return Choice(chosen, source)


def interface_names() -> tuple[str, ...]:
    return tuple(name for _, name in socket.if_nameindex())


def hostname_is_loopback(hostname: str) -> str | None:
    """The loopback address ``hostname`` resolves to (the Gloo trap), else None."""
    addr = resolve(hostname)
    return addr if addr is not None and ipaddress.ip_address(addr).is_loopback else None
