"""What every channel backend (ssh, pdsh, MPI, Slurm) shares: the endpoint its agents connect back to and the
agent command pointing at it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xrun.launch.command import TOKEN_ON_STDIN, connect_argv, connect_target


@dataclass(frozen=True)
class Endpoint:
    """Where agents reach the runner and how they prove they belong to this run."""

    addr: str
    port: int
    token: str

    @property
    def connect(self) -> str:
        return connect_target(self.addr, self.port)


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
