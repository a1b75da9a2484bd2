"""What every channel backend (ssh, pdsh, MPI, Slurm) shares: the endpoint its agents connect back to, the
agent command pointing at it, and ``run_over_channel``, which opens the control server around the backend's
own way of starting the agents.

    addresses (xrun.runner.backends.routes) -> token -> ControlServer.listen -> start(endpoints) -> server.run(sessions)

A backend's ``execute`` does only what differs: choose the addresses, then start its sessions (pdsh: one
process; engines: one engine process; ssh: one exec channel per host) given the endpoints.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from xrun.channel import ChannelError
from xrun.channel.link import TOKEN_ANNOUNCE, TOKEN_ON_STDIN
from xrun.common.command import connect_argv, connect_target
from xrun.errors import UsageError
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys

if TYPE_CHECKING:
    from xrun.runner.job.control_server import Sessions
    from xrun.runner.plan import Plan

TOKEN_BYTES = 32


@dataclass(frozen=True)
class Endpoint:
    """Where agents reach the runner and how they prove they belong to this run."""

    addr: str
    port: int
    token: str
    fingerprint: str  # the head's certificate (SHA-256): public, pinned by every agent

    @property
    def connect(self) -> str:
        return connect_target(self.addr, self.port)


Endpoints = Mapping[str, Endpoint]  # host -> where that host's agent connects


def agent_connect_argv(
    python: str, endpoint: Endpoint | None, node_rank: str, *, token_on_stdin: bool
) -> tuple[str, ...]:
    """One node's agent command (ssh, pdsh): ``node_rank`` is a number or pdsh's ``%n``; the token comes on stdin,
    or, where the launcher gives the remote command none (pdsh), the agent makes a one-time key and announces it
    on its output, which only the head reads (never on the command line). None: the placeholders."""
    connect = endpoint.connect if endpoint is not None else None
    fingerprint = endpoint.fingerprint if endpoint is not None else None
    token = TOKEN_ON_STDIN if token_on_stdin else TOKEN_ANNOUNCE
    return connect_argv(python, connect=connect, token=token, fingerprint=fingerprint, node_rank=node_rank)


def one_endpoint(plan: Plan, endpoints: Endpoints) -> Endpoint:
    """The endpoint of a backend that gives every node the same command (pdsh, the engines)."""
    return endpoints[plan.nodes[0].host]


def run_over_channel(
    plan: Plan, addrs: Mapping[str, str], start: Callable[[Endpoints], Sessions], *, announced_keys: bool = False
) -> int:
    """Open the control server on ``addrs`` (host -> head address it connects to), start the agents with
    ``start`` and run the job to its exit code. The server is closed if starting fails. ``announced_keys``: each
    agent makes its own one-time key and announces it on its output stream (pdsh); else every agent proves the
    run's token, which the backend hands it privately (ssh stdin, an engine's environment)."""
    # Lazy: only a real run loads the server (a dry run, and reading the backends' traits, load none of it).
    from xrun.runner.job.control_server import ControlServer

    token = secrets.token_hex(TOKEN_BYTES)
    nodes = len(plan.agent_hosts)  # every agent's, the hot spares' included (--spares)
    keys = NodeKeys.announced(nodes) if announced_keys else NodeKeys.shared_secret(nodes, token)
    gate = Gate(keys, nodes=nodes, prove_server=False)
    server = ControlServer(plan, gate, join_timeout=plan.request.remote.join_timeout)
    try:
        port = server.listen(dict.fromkeys(addrs.values()))  # each address once, in the nodes' order
    except ChannelError as err:  # e.g. a --control_addr that stopped being this machine's since validate()
        raise UsageError("--control_addr", f"cannot listen on {', '.join(dict.fromkeys(addrs.values()))}: "
                         f"{err.reason}") from None
    endpoints = {host: Endpoint(addr, port, token, gate.fingerprint) for host, addr in addrs.items()}
    try:
        sessions = start(endpoints)
    except BaseException:
        server.close()
        raise
    return server.run(sessions)
