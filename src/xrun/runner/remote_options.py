"""The flags of remote runs, typed: ``RemoteOptions`` (built by the CLI, read by the planner and the backends)
and ``SshSettings``, the ssh part of them, which every ssh user shares (the ssh backend through paramiko,
pdsh and ``xrun check`` through OpenSSH's client: ``openssh_args``).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

from xrun.argsplit import spellings
from xrun.common.spec import DEFAULT_JOIN_TIMEOUT
from xrun.errors import UsageError
from xrun.strict_numbers import MAX_HOSTS, int_arg, port_arg, seconds_arg

DEFAULT_FANOUT = 1024  # pdsh -f: DeepSpeed's value; pdsh's own default (32) would serialise big clusters


@dataclass(frozen=True)
class SshSettings:
    port: int | None = None  # --ssh_port wins over the config's Port
    config_path: str | None = None
    accept_new_hosts: bool = False
    connect_timeout: float | None = None  # paramiko only (OpenSSH reads ConnectTimeout from its config)


def openssh_args(settings: SshSettings) -> tuple[str, ...]:
    """The same settings as OpenSSH client options (``ssh``, ``PDSH_SSH_ARGS_APPEND``)."""
    args: list[str] = []
    if settings.port is not None:
        args += ["-p", str(settings.port)]
    if settings.config_path is not None:
        args += ["-F", settings.config_path]
    if settings.accept_new_hosts:
        args += ["-o", "StrictHostKeyChecking=accept-new"]
    args += ["-o", "BatchMode=yes"]  # never prompt: a password prompt per host would hang a fan-out
    return tuple(args)


@dataclass(frozen=True)
class RemoteOptions:
    """Flags of remote runs, typed (built by the CLI, read by the backends)."""

    ssh_port: int | None = None
    ssh_config: str | None = None
    accept_new_hosts: bool = False
    fanout: int = DEFAULT_FANOUT
    join_timeout: float = DEFAULT_JOIN_TIMEOUT  # 30 min: nodes may pull images or mount filesystems first
    control_addr: str | None = None
    exports: tuple[str, ...] = ()
    no_ssh: bool = False
    node_rank: int | None = None  # --no_ssh: this node's rank, given by hand
    launcher_args: tuple[str, ...] = ()  # --launcher_args, shell-split: extra arguments for mpirun/srun
    precheck: bool = False  # --precheck: the network check across the nodes before any rank starts (issue 24)

    @property
    def ssh(self) -> SshSettings:
        return SshSettings(port=self.ssh_port, config_path=self.ssh_config, accept_new_hosts=self.accept_new_hosts)


# ---------------------------------------------------------------------------------------------------------------
# Command line (the runner's CLI adds these; ``xrun check`` adds the ssh ones).


def add_remote_flags(parser: argparse.ArgumentParser, *, job: bool = True) -> None:
    add = parser.add_argument
    add(*spellings("--ssh_port"), type=port_arg,
        metavar="PORT", help="ssh port on every node (default: ssh config, 22)")
    add(*spellings("--ssh_config"), metavar="PATH",
        help="OpenSSH client config to use (default ~/.ssh/config; paramiko does not read ssh_config.d drop-ins)")
    add(*spellings("--ssh_accept_new_hosts"), action="store_true",
        help="accept host keys missing from known_hosts (this run only); a changed key is always refused")
    add(*spellings("--control_addr"), metavar="ADDR",
        help="the address nodes connect back to (default: this machine's address on the route to them)")
    if not job:
        return
    add(*spellings("--fanout"), type=int_arg(high=MAX_HOSTS), default=DEFAULT_FANOUT, metavar="N",
        help=f"pdsh: at most N ssh connections at once (default {DEFAULT_FANOUT})")
    add(*spellings("--join_timeout"), type=seconds_arg(), default=DEFAULT_JOIN_TIMEOUT, metavar="SECONDS",
        help="start barrier: how long to wait for every node's agent (default 1800)")
    add("--export", action="append", default=[], metavar="NAME[=VALUE]",
        help="also send this variable to remote nodes (repeatable); docs/multinode.md says what travels by default")
    add(*spellings("--no_ssh"), action="store_true",
        help="do not fan out: run this node's share only (start xrun on every node yourself, with --node_rank)")
    add(*spellings("--node_rank"), type=int_arg(high=MAX_HOSTS), metavar="K",
        help="with --no_ssh or --pod: this node's index in the hostfile")
    add(*spellings("--launcher_args"), default="", metavar="ARGS",
        help="extra arguments for the MPI/Slurm engine, shell-split, e.g. '--mca btl_tcp_if_include eth1'")
    add("--precheck", action="store_true",
        help="once every node's agent is up, run the network check (xrun check --network) across the nodes "
             "before any rank starts (with --max_restarts, before every attempt); a slow or unreachable node ends "
             "the job, named (exit 1), or --spares replace it")


def ssh_settings(ns: argparse.Namespace) -> SshSettings:
    """The ssh flags (``add_remote_flags``, with or without the job ones)."""
    if ns.ssh_port is not None and not 0 < ns.ssh_port < 65536:
        raise UsageError("--ssh_port", f"{ns.ssh_port} is not a TCP port")
    return SshSettings(port=ns.ssh_port, config_path=ns.ssh_config, accept_new_hosts=ns.ssh_accept_new_hosts)


def remote_options(ns: argparse.Namespace) -> RemoteOptions:
    ssh = ssh_settings(ns)
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
        ssh_port=ssh.port,
        ssh_config=ssh.config_path,
        accept_new_hosts=ssh.accept_new_hosts,
        fanout=ns.fanout,
        join_timeout=ns.join_timeout,
        control_addr=ns.control_addr,
        exports=tuple(ns.export),
        no_ssh=ns.no_ssh,
        node_rank=ns.node_rank,
        precheck=ns.precheck,
    )
