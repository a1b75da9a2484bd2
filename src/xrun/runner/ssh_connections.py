"""Native SSH connections (paramiko), one per host, opened in parallel.

What OpenSSH users expect is honoured: ``~/.ssh/config`` (or ``--ssh_config PATH``) for HostName, User,
Port, IdentityFile, ProxyJump / ProxyCommand and ConnectTimeout; ``--ssh_port``; ssh-agent and the default
keys; host keys checked against ``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts`` and the config's
UserKnownHostsFile / GlobalKnownHostsFile. An unknown host is refused unless ``--ssh_accept_new_hosts``
(then accepted for this run only; nothing is written to known_hosts).

paramiko does not read ``/etc/ssh/ssh_config`` drop-ins (``Include``), so pass ``--ssh_config`` when a
setting lives only there. Failures are data: ``connect_all`` returns one ``Connected`` or ``Unreachable`` per
host, and the caller closes what did connect when anything did not. ``SshSettings`` come from the command line
(``xrun.runner.remote_options``), where ``openssh_args`` renders the same settings for OpenSSH's client (pdsh,
``xrun check`` without paramiko: ``openssh_unless_paramiko`` makes that choice for both kinds of check).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from xrun.errors import UsageError, XrunError
from xrun.runner.remote_options import SshSettings

DEFAULT_CONNECT_TIMEOUT = 10.0
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
MAX_PARALLEL = 128


class HostConnectError(XrunError):
    """One or more hosts could not be reached or refused us; exit 255 like ssh."""

    exit_code = 255

    def __init__(self, failures: Sequence[Unreachable]) -> None:
        self.failures = tuple(failures)
        detail = "; ".join(f"{f.host}: {f.reason}" for f in failures)
        super().__init__(f"cannot start on {len(failures)} host(s): {detail}")


@dataclass
class Connected:
    host: str
    client: Any  # paramiko.SSHClient
    address: str  # the peer address of the TCP connection (None through a proxy)
    local_address: str | None  # our end of it: the head's address on the route to this host

    @property
    def transport(self) -> Any:
        return self.client.get_transport()


@dataclass(frozen=True)
class Unreachable:
    host: str
    reason: str


def import_paramiko() -> Any:
    try:
        import paramiko
    except ImportError:
        raise UsageError(
            "--launcher ssh",
            "needs paramiko: pip install 'xrun[ssh]' (or apt-get install pdsh and use --launcher pdsh)",
        ) from None
    return paramiko


def openssh_unless_paramiko() -> str | None:
    """The one choice of ssh client for ``xrun check`` and ``xrun check --network``: None when paramiko is
    installed (native connections, ``connect_all``), else the path of OpenSSH's ``ssh`` (run with
    ``openssh_args``); neither is a usage error."""
    try:
        import paramiko  # noqa: F401
    except ImportError:
        ssh = shutil.which("ssh")
        if ssh is None:
            raise UsageError("xrun check", "needs paramiko (pip install 'xrun[ssh]') or an ssh client") from None
        return ssh
    return None


def load_config(settings: SshSettings) -> Any:
    paramiko = import_paramiko()
    path = settings.config_path or os.path.expanduser("~/.ssh/config")
    if settings.config_path is not None and not os.path.exists(path):
        raise UsageError("--ssh_config", f"{path}: no such file")
    if os.path.exists(path):
        return paramiko.SSHConfig.from_path(path)
    return paramiko.SSHConfig()


def connect_all(hosts: Sequence[str], settings: SshSettings) -> list[Connected | Unreachable]:
    """Connect to every host at once (32 hosts cost about one handshake of wall time, not 32)."""
    config = load_config(settings)
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(hosts)), thread_name_prefix="xrun-ssh") as pool:
        return list(pool.map(lambda h: connect_one(h, settings, config), hosts))


def close_all(results: Sequence[Connected | Unreachable]) -> None:
    for result in results:
        if isinstance(result, Connected):
            result.client.close()


def connect_one(host: str, settings: SshSettings, config: Any, _depth: int = 0) -> Connected | Unreachable:
    paramiko = import_paramiko()
    entry = config.lookup(host)
    hostname = entry.get("hostname", host)
    port = settings.port or int(entry.get("port", 22))
    user = entry.get("user") or getpass.getuser()
    timeout = settings.connect_timeout or float(entry.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT))
    client = paramiko.SSHClient()
    try:
        _load_known_hosts(client, entry)
        client.set_missing_host_key_policy(
            paramiko.AutoAddPolicy() if settings.accept_new_hosts else paramiko.RejectPolicy()
        )
        sock, jump = _proxy_socket(entry, hostname, port, settings, config, timeout, _depth)
        keys = [os.path.expanduser(p) for p in entry.get("identityfile", []) if os.path.exists(os.path.expanduser(p))]
        client.connect(
            hostname,
            port=port,
            username=user,
            key_filename=keys or None,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=True,
            look_for_keys=True,
            sock=sock,
        )
        if jump is not None:
            client._xrun_jump = jump  # noqa: SLF001 - keep the jump connection alive as long as this one
        raw = client.get_transport().sock
        peer = local = None
        if isinstance(raw, socket.socket):
            peer, local = str(raw.getpeername()[0]), str(raw.getsockname()[0])
        return Connected(host=host, client=client, address=peer or hostname, local_address=local)
    except Exception as err:  # noqa: BLE001 - every failure becomes data naming the host
        client.close()
        return Unreachable(host, describe(err, host, hostname, port))


def _load_known_hosts(client: Any, entry: Any) -> None:
    files = [os.path.expanduser("~/.ssh/known_hosts"), SYSTEM_KNOWN_HOSTS]
    for key in ("userknownhostsfile", "globalknownhostsfile"):
        files += [os.path.expanduser(p) for p in entry.get(key, "").split()]
    for path in dict.fromkeys(files):
        if os.path.exists(path):
            client.load_system_host_keys(path)


def _proxy_socket(
    entry: Any, hostname: str, port: int, settings: SshSettings, config: Any, timeout: float, depth: int
) -> tuple[Any, Any]:
    """ProxyJump (first hop; chains of jumps are followed recursively) or ProxyCommand, else a direct socket."""
    paramiko = import_paramiko()
    jump_spec = entry.get("proxyjump")
    if jump_spec and jump_spec.lower() != "none":
        if depth > 4:
            raise OSError("ProxyJump chain deeper than 4 hops")
        first = jump_spec.split(",")[0]
        jump_user, _, jump_host = first.rpartition("@")
        jump_host, _, jump_port = jump_host.partition(":")
        jump_settings = SshSettings(
            port=int(jump_port) if jump_port else None, config_path=settings.config_path,
            accept_new_hosts=settings.accept_new_hosts, connect_timeout=settings.connect_timeout,
        )
        jumped = connect_one(jump_host, jump_settings, config, depth + 1)
        if isinstance(jumped, Unreachable):
            raise OSError(f"ProxyJump {first}: {jumped.reason}")
        _ = jump_user  # user@ in ProxyJump: the jump host's own config entry decides the user
        tunnel = jumped.transport.open_channel("direct-tcpip", (hostname, port), ("127.0.0.1", 0), timeout=timeout)
        return tunnel, jumped.client
    command = entry.get("proxycommand")
    if command and command.lower() != "none":
        return paramiko.ProxyCommand(command), None
    return socket.create_connection((hostname, port), timeout=timeout), None


def describe(err: BaseException, host: str, hostname: str, port: int) -> str:
    """One line: what failed and what to do."""
    paramiko = import_paramiko()
    where = f"{hostname}:{port}"
    if isinstance(err, paramiko.BadHostKeyException):
        return (f"HOST KEY MISMATCH for {where}: known_hosts has a different key (possible attack); "
                "check it before connecting")
    if isinstance(err, paramiko.SSHException) and "not found in known_hosts" in str(err):
        return (f"host key of {where} is not in known_hosts (~/.ssh/known_hosts, {SYSTEM_KNOWN_HOSTS}); "
                "verify it with 'ssh HOST' once, or pass --ssh_accept_new_hosts")
    if isinstance(err, paramiko.AuthenticationException):
        return f"authentication failed ({err}); check the User/IdentityFile in ~/.ssh/config or ssh-agent"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve {hostname!r} ({err.strerror})"
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"timed out connecting to {where}"
    if isinstance(err, paramiko.ssh_exception.NoValidConnectionsError):
        return f"cannot connect to {where}: {next(iter(err.errors.values())).strerror if err.errors else err}"
    if isinstance(err, OSError):
        return f"cannot connect to {where}: {err.strerror or err}"
    return f"{err.__class__.__name__}: {err}"
