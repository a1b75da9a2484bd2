"""What every remote backend shares: its options, the control endpoint, and the tiny agent command line.

A remote backend's only job is to start ``PYTHON -u -m xrun.launch --connect=HEAD:PORT --node_rank=K
--token=...`` once per node; everything else (ranks, argv, env, cwd) reaches the agent over the control
channel. ``agent_connect_argv`` is the one place that command is built, for --dry-run and for real.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from xrun.argsplit import spellings
from xrun.errors import UsageError

if TYPE_CHECKING:
    from xrun.runner.plan import JobRequest

DEFAULT_FANOUT = 1024  # pdsh -f: DeepSpeed's value; pdsh's own default (32) would serialise big clusters
DEFAULT_JOIN_TIMEOUT = 1800.0  # 30 min: nodes may pull images or mount filesystems before the agent runs
CHANNEL_BACKENDS = frozenset({"ssh", "pdsh", "openmpi", "mpich", "impi", "mvapich", "slurm"})


@dataclass(frozen=True)
class RemoteOptions:
    """Flags of remote runs, typed (built by the CLI, read by the backends)."""

    ssh_port: int | None = None
    ssh_config: str | None = None
    accept_new_hosts: bool = False
    fanout: int = DEFAULT_FANOUT
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    control_addr: str | None = None
    exports: tuple[str, ...] = ()
    no_ssh: bool = False
    node_rank: int | None = None  # --no_ssh: this node's rank, given by hand
    launcher_args: tuple[str, ...] = ()  # --launcher_args, shell-split: extra arguments for mpirun/srun


@dataclass(frozen=True)
class Endpoint:
    """Where agents reach the runner and how they prove they belong to this run."""

    addr: str
    port: int
    token: str

    @property
    def connect(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"{host}:{self.port}"


# What --dry-run shows: the server is opened only when the job really starts.
PLACEHOLDER_CONNECT = "HEAD_ADDR:PORT"
PLACEHOLDER_TOKEN = "TOKEN"  # noqa: S105 - a placeholder shown by --dry-run


def master_placeholder(first_host: str) -> str:
    """MASTER_ADDR in the plan of a channel backend: node 0's agent reports the real address at the barrier."""
    return f"<{first_host} address>"


def agent_connect_argv(
    python: str, endpoint: Endpoint | None, node_rank: str, *, token_on_stdin: bool
) -> tuple[str, ...]:
    """The whole remote agent command. ``node_rank`` is a number, or pdsh's ``%n``."""
    connect = endpoint.connect if endpoint is not None else PLACEHOLDER_CONNECT
    if token_on_stdin:
        token = "-"  # noqa: S105 - "read it from stdin"
    else:
        token = endpoint.token if endpoint is not None else PLACEHOLDER_TOKEN
    return (python, "-u", "-m", "xrun.launch", f"--connect={connect}", f"--node_rank={node_rank}", f"--token={token}")


def route_source(addr: str, port: int = 22) -> str:
    """The local address the kernel would use to reach ``addr`` (a UDP ``connect`` sends no packet)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((addr, port))
        return str(probe.getsockname()[0])


def resolve(host: str) -> str:
    """First address of ``host`` (the control address is chosen from routes, so names must resolve here)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        reason = f"cannot resolve {host!r} ({err.strerror}); pass --control_addr ADDR"
        raise UsageError("--control_addr", reason) from None
    return str(infos[0][4][0])


def control_addresses(peer_addrs: dict[str, str], override: str | None) -> dict[str, str]:
    """host -> the head address that host should connect to: the source address of the route to it."""
    if override is not None:
        return {host: override for host in peer_addrs}
    return {host: route_source(addr) for host, addr in peer_addrs.items()}


# ---------------------------------------------------------------------------------------------------------------
# Command line (the runner's CLI adds these; check reuses them).


def add_remote_flags(parser: argparse.ArgumentParser, *, job: bool = True) -> None:
    add = parser.add_argument
    add(*spellings("--ssh_port"), type=int, metavar="PORT", help="ssh port on every node (default: ssh config, 22)")
    add(*spellings("--ssh_config"), metavar="PATH",
        help="OpenSSH client config to use (default ~/.ssh/config; paramiko does not read ssh_config.d drop-ins)")
    add(*spellings("--ssh_accept_new_hosts"), action="store_true",
        help="accept host keys missing from known_hosts (this run only); a changed key is always refused")
    add(*spellings("--control_addr"), metavar="ADDR",
        help="the address nodes connect back to (default: this machine's address on the route to them)")
    if not job:
        return
    add(*spellings("--fanout"), type=int, default=DEFAULT_FANOUT, metavar="N",
        help=f"pdsh: at most N ssh connections at once (default {DEFAULT_FANOUT})")
    add(*spellings("--join_timeout"), type=float, default=DEFAULT_JOIN_TIMEOUT, metavar="SECONDS",
        help="start barrier: how long to wait for every node's agent (default 1800)")
    add("--export", action="append", default=[], metavar="NAME[=VALUE]",
        help="also send this variable to remote nodes (repeatable); see README for what travels by default")
    add(*spellings("--no_ssh"), action="store_true",
        help="do not fan out: run this node's share only (start xrun on every node yourself, with --node_rank)")
    add(*spellings("--node_rank"), type=int, metavar="K",
        help="with --no_ssh or --pod: this node's index in the hostfile")
    add(*spellings("--launcher_args"), default="", metavar="ARGS",
        help="extra arguments for the MPI/Slurm engine, shell-split, e.g. '--mca btl_tcp_if_include eth1'")


def remote_options(ns: argparse.Namespace) -> RemoteOptions:
    if ns.ssh_port is not None and not 0 < ns.ssh_port < 65536:
        raise UsageError("--ssh_port", f"{ns.ssh_port} is not a TCP port")
    if ns.fanout < 1:
        raise UsageError("--fanout", f"must be at least 1, not {ns.fanout}")
    if ns.join_timeout <= 0:
        raise UsageError("--join_timeout", f"must be > 0 seconds, not {ns.join_timeout:g}")
    if ns.no_ssh and ns.launcher is not None:
        raise UsageError("--no_ssh", "cannot be combined with --launcher")
    try:
        launcher_args = tuple(shlex.split(ns.launcher_args))
    except ValueError as err:
        raise UsageError("--launcher_args", f"{ns.launcher_args!r}: {err} (it is split like a shell would)") from None
    return RemoteOptions(
        launcher_args=launcher_args,
        ssh_port=ns.ssh_port,
        ssh_config=ns.ssh_config,
        accept_new_hosts=ns.ssh_accept_new_hosts,
        fanout=ns.fanout,
        join_timeout=ns.join_timeout,
        control_addr=ns.control_addr,
        exports=tuple(ns.export),
        no_ssh=ns.no_ssh,
        node_rank=ns.node_rank,
    )


def with_exports(request: JobRequest) -> JobRequest:
    """Collect the environment for remote nodes (reads os.environ and the env files: I/O at the edge)."""
    from xrun.runner import envpass

    cwd = request.cwd or os.getcwd()
    env = envpass.collect(
        os.environ,
        exports=request.remote.exports,
        files=envpass.env_files(os.environ.get("HOME"), cwd),
        cwd=cwd,
    )
    return replace(request, env=env)
