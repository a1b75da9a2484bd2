"""``python -u -m xrun.launch --connect=HEAD:PORT --fingerprint=SHA256 --node_rank=K --token=-``: the agent of a
multi-node run, from its command line to its exit code.

The backend (ssh, pdsh, MPI, Slurm) starts this tiny command on every node (rendered by
``xrun.common.command.connect_argv``, read here by ``parse_args``). Nothing on it lets another user of the node
take its place: the fingerprint of the runner's certificate (which the agent pins) is public, and the key it
proves (never on a command line, which every user of the node can read) comes from elsewhere:
``--token=-`` reads the run token from the first line of stdin (the ssh backend sends it there);
``--token=env:NAME`` from the variable NAME, removed from the environment at once (MPI and Slurm export it by
name: ``mpirun -x``, hydra ``-genvlist``, ``srun --export``), so no rank inherits it; ``--token=announce`` makes a
one-time key and announces it on stderr, which pdsh carries to the head over its ssh session
(xrun.channel.announce).

The node rank: ``--node_rank=K``, or ``--node_rank_from=VAR[,VAR...]`` where the engine numbers its processes
itself (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``SLURM_PROCID``): the first of those variables that is set.
Such an agent exits 0 to its engine once its last word reached the runner
(``xrun.launch.session.machine.engine_exit_code``).

Then the connection (``xrun.launch.session.connection``) and the driver of the agent's state machine
(``xrun.launch.session.driver.run_head_mode``): the spec, the preflight, the barrier, the ranks, ``done``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple, NoReturn

from xrun.channel import ChannelError
from xrun.channel.announce import announce_line
from xrun.channel.link import TOKEN_ANNOUNCE, TOKEN_ENV_PREFIX, TOKEN_ON_STDIN, Credentials
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.errors import UsageError, XrunError
from xrun.fdlimit import raise_open_files_limit
from xrun.launch.engine_env import drop_engine_identity, restore_home
from xrun.launch.session.connection import CONNECT_TIMEOUT, Server
from xrun.launch.session.driver import run_head_mode
from xrun.printable import one_line
from xrun.strict_numbers import MAX_HOSTS, int_arg

EXIT_NO_RUNNER = 1


class AgentArgs(NamedTuple):
    """The connect-mode command line, read (a typed record; a NamedTuple for the reason of
    ``xrun.launch.session.events``: it is on every agent's start)."""

    connect: str
    node_rank: int | None
    node_rank_from: str | None
    fingerprint: str | None
    token: str

    def node_index(self, environ: Mapping[str, str]) -> int:
        """This node's index: --node_rank's, or the engine's variable --node_rank_from names."""
        if self.node_rank_from is not None:
            return node_rank_from(self.node_rank_from, environ)
        if self.node_rank is None:  # the parser requires one of the two flags: never reached from main
            raise UsageError("--node_rank", "missing: give --node_rank or --node_rank_from")
        return self.node_rank


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError("xrun.launch --connect", message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m xrun.launch --connect", add_help=True, allow_abbrev=False)
    parser.add_argument("--connect", required=True, metavar="HOST:PORT", help="the runner's control server")
    rank = parser.add_mutually_exclusive_group(required=True)
    rank.add_argument("--node_rank", "--node-rank", type=int_arg(high=MAX_HOSTS), help="this node's index")
    rank.add_argument("--node_rank_from", "--node-rank-from", metavar="VAR[,VAR...]",
                      help="read this node's index from the first of these variables that is set (MPI, Slurm)")
    parser.add_argument("--fingerprint", default=None, metavar="SHA256",
                        help="the SHA-256 of the runner's TLS certificate: any other server is refused")
    parser.add_argument("--token", default=TOKEN_ON_STDIN,
                        help="where the run's key comes from: '-' stdin's first line, 'env:NAME' variable NAME, "
                             "'announce' a one-time key announced on stderr (pdsh)")
    return parser


def parse_args(argv: Sequence[str]) -> AgentArgs:
    ns = build_parser().parse_args(list(argv))
    return AgentArgs(ns.connect, ns.node_rank, ns.node_rank_from, ns.fingerprint, ns.token)


def split_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6ADDR]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError("--connect", f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def node_rank_from(names: str, environ: Mapping[str, str]) -> int:
    """The node rank an engine gave this process: the first of ``names`` (comma-separated) that is set."""
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    for name in wanted:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise UsageError("--node_rank_from", f"{name}={value!r} is not a node index")
            return int(value)
    raise UsageError("--node_rank_from", f"none of {', '.join(wanted)} is set: was this agent started by the engine?")


def read_credentials(value: str, fingerprint: str | None, node_rank: int) -> Credentials:
    """The key this agent proves and the certificate it pins (``--token``, ``--fingerprint``)."""
    if fingerprint is None or len(fingerprint) != 64:
        raise UsageError("--fingerprint", "expected the SHA-256 (64 hex digits) of the runner's certificate")
    if value == TOKEN_ANNOUNCE:
        key_hex = os.urandom(32).hex()  # what secrets.token_hex(32) is, without secrets' imports (hmac, random)
        os.write(2, announce_line(node_rank, key_hex))  # the head reads it on the engine's stream, before the hello
        return Credentials(token_key(key_hex, HEAD_PURPOSE), fingerprint.lower())
    return Credentials(token_key(read_token(value), HEAD_PURPOSE), fingerprint.lower())


def read_token(value: str) -> str:
    if value.startswith(TOKEN_ENV_PREFIX):
        name = value[len(TOKEN_ENV_PREFIX) :]
        token = os.environ.pop(name, "")  # gone before any rank starts: no rank inherits it
        if not token:
            raise UsageError("--token", f"{name} is not set; the launcher exports it to every node by name")
        return token
    if value != TOKEN_ON_STDIN:
        raise UsageError("--token", "takes '-', 'env:NAME' or 'announce': a token on the command line is every "
                         "local user's to read")
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):
        raise UsageError("--token", "expected the run token on stdin (the runner sends it); got none")
    return line.strip().decode("ascii", "replace")


def main(argv: Sequence[str]) -> int:
    raise_open_files_limit()  # before the channel and the ranks' pipes: not the login's 1,024 (xrun.fdlimit)
    try:
        args = parse_args(argv)
        host, port = split_endpoint(args.connect)
        node_rank = args.node_index(os.environ)
        engine = args.node_rank_from is not None
        if engine:  # started by mpirun/mpiexec/srun: ranks must not look like its processes
            drop_engine_identity(os.environ)
            restore_home(os.environ)
        credentials = read_credentials(args.token, args.fingerprint, node_rank)
        return run_head_mode(Server(host, port, CONNECT_TIMEOUT), credentials, node_rank, engine=engine)
    except XrunError as err:
        print(f"xrun.launch: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except ChannelError as err:
        print(f"xrun.launch[{socket.gethostname()}]: {one_line(err.reason)}", file=sys.stderr)
        return EXIT_NO_RUNNER
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
