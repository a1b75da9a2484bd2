"""Which address of this machine the nodes' agents connect back to (the control server listens only there).

``--control_addr`` wins. Otherwise it is the source address of the kernel's route to each node
(``xrun.net.route_source``). The ssh backend knows that per host from its own TCP connection; pdsh and the
engines give every node one command, so ``control_address`` needs one address that every node's route agrees
on, and says which nodes differ when they do not.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Sequence

from xrun.errors import UnknownHostError, UsageError
from xrun.net import route_source
from xrun.runner.remote_options import RemoteOptions, SshSettings, openssh_args

SSH_G_TIMEOUT = 10.0


def control_address(hosts: Sequence[str], remote: RemoteOptions) -> str:
    """The one head address for every host: ``--control_addr``, or the source of the route all hosts share."""
    if remote.control_addr:
        return remote.control_addr
    sources: dict[str, list[str]] = {}
    for host in hosts:
        sources.setdefault(route_source(peer_address(host, remote.ssh)), []).append(host)
    if len(sources) > 1:
        detail = "; ".join(f"{addr} for {', '.join(h)}" for addr, h in sources.items())
        raise UsageError("--control_addr", f"the nodes reach this machine on different addresses ({detail}); "
                         "pass --control_addr ADDR that every node can reach, or use --launcher ssh")
    return next(iter(sources))


def peer_address(host: str, ssh: SshSettings) -> str:
    """Resolve like ssh would: DNS / /etc/hosts first, else OpenSSH's own view (``ssh -G``: HostName aliases)."""
    address = address_of(host, ssh)
    if address is None:  # the user's host name is the problem, not a flag they never passed (issue 13)
        raise UnknownHostError(host, "does not resolve (DNS, /etc/hosts, ssh's HostName); check its name in the "
                               "hostfile, or pass --control_addr ADDR if ssh reaches it through a proxy")
    return address


def address_of(host: str, ssh: SshSettings) -> str | None:
    """``peer_address``, or None where it does not resolve."""
    return first_address(host) or first_address(_ssh_hostname(host, ssh) or "")


def first_address(name: str) -> str | None:
    if not name:
        return None
    try:
        return str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
    except socket.gaierror:
        return None


def _ssh_hostname(host: str, ssh: SshSettings) -> str | None:
    """The HostName OpenSSH's config gives ``host`` (``ssh -G`` prints the settings it would use), if any."""
    client = shutil.which("ssh")
    if client is None:
        return None
    out = subprocess.run([client, *openssh_args(ssh), "-G", host], capture_output=True, text=True,
                         timeout=SSH_G_TIMEOUT, check=False)
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value
    return None
