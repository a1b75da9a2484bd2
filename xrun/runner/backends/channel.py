"""What every channel backend (ssh, pdsh, MPI, Slurm) shares: the endpoint its agents connect back to, the
agent command pointing at it, and ``run_over_channel``, which opens the control server around the backend's
own way of starting the agents.

    addresses (xrun.runner.backends.routes) -> token -> ControlServer.listen -> start(endpoints) -> server.run(sessions)

A backend's ``execute`` does only what differs: choose the addresses, then start its sessions (pdsh: one
process; engines: one engine process; ssh: one exec channel per host) given the endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from xrun.channel import ChannelError
from xrun.errors import UsageError
from xrun.launch.command import TOKEN_ON_STDIN, connect_argv, connect_target

if TYPE_CHECKING:
    from xrun.runner.job.server import Sessions
    from xrun.runner.plan import Plan

TOKEN_BYTES = 32


@dataclass(frozen=True)
class Endpoint:
    """Where agents reach the runner and how they prove they belong to this run."""

    addr: str
    port: int
    token: str

    @property
    def connect(self) -> str:
        return connect_target(self.addr, self.port)


Endpoints = Mapping[str, Endpoint]  # host -> where that host's agent connects


def agent_connect_argv(
    python: str, endpoint: Endpoint | None, node_rank: str, *, token_on_stdin: bool
) -> tuple[str, ...]:
    """One node's agent command (ssh, pdsh): ``node_rank`` is a number or pdsh's ``%n``; the token comes on stdin
    or, where the launcher gives the remote command none (pdsh), on the command line. None: the placeholders."""
    if token_on_stdin:
        token: str | None = TOKEN_ON_STDIN
    else:
        token = endpoint.token if endpoint is not None else None
    connect = endpoint.connect if endpoint is not None else None
    return connect_argv(python, connect=connect, token=token, node_rank=node_rank)


def one_endpoint(plan: Plan, endpoints: Endpoints) -> Endpoint:
    """The endpoint of a backend that gives every node the same command (pdsh, the engines)."""
    return endpoints[plan.nodes[0].host]


def run_over_channel(plan: Plan, addrs: Mapping[str, str], start: Callable[[Endpoints], Sessions]) -> int:
    """Open the control server on ``addrs`` (host -> head address it connects to), start the agents with
    ``start`` and run the job to its exit code. The server is closed if starting fails."""
    import secrets  # noqa: PLC0415 - only a real run needs a token (a dry run prints placeholders)

    from xrun.runner.job.server import ControlServer  # noqa: PLC0415 - the server loads only for a real run

    token = secrets.token_hex(TOKEN_BYTES)
    server = ControlServer(plan, token, join_timeout=plan.request.remote.join_timeout)
    try:
        port = server.listen(dict.fromkeys(addrs.values()))  # each address once, in the nodes' order
    except ChannelError as err:  # e.g. a --control_addr that stopped being this machine's since validate()
        raise UsageError("--control_addr", f"cannot listen on {', '.join(dict.fromkeys(addrs.values()))}: "
                         f"{err.reason}") from None
    endpoints = {host: Endpoint(addr, port, token) for host, addr in addrs.items()}
    try:
        sessions = start(endpoints)
    except BaseException:
        server.close()
        raise
    return server.run(sessions)
