"""``--launcher ssh``: native SSH (paramiko), one connection per host opened in parallel.

Each node runs ``PYTHON -u -m xrun.launch --connect=HEAD:PORT --node_rank=K --token=-`` and reads the run
token from the session's stdin, so the token is in no argv on any machine. Everything else travels over the
control channel (``xrun.runner.job.control_server``). Connection settings: ``xrun.runner.ssh_connections``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xrun.net import route_source
from xrun.runner.backends import Invocation, NodeCommand, Traits
from xrun.runner.backends.base import InProcess
from xrun.runner.backends.channel import Endpoint, Endpoints, agent_connect_argv, run_over_channel
from xrun.runner.job.relay import StreamLines
from xrun.runner.plan import Plan
from xrun.runner.ssh_connections import Connected, HostConnectError, close_all, connect_all
from xrun.shell import render


def ssh_commands(plan: Plan, endpoints: Mapping[str, Endpoint] | None = None) -> tuple[NodeCommand, ...]:
    """Pure: the remote command of every agent, the world's nodes' then the hot spares' (placeholders for the
    endpoint when it is not open yet; with ``endpoints``, the hosts that have one). An agent's id is its node rank,
    or for a spare the next after the world's."""
    python = plan.request.launch.python
    return tuple(
        NodeCommand(
            host=host,
            argv=agent_connect_argv(python, endpoints[host] if endpoints else None, str(agent), token_on_stdin=True),
        )
        for agent, host in enumerate(plan.agent_hosts)
        if endpoints is None or host in endpoints
    )


class SshBackend:
    name = "ssh"
    traits = Traits(uses_channel=True, extra_fds_per_node=3, spares=True)

    def render(self, plan: Plan) -> Invocation:
        return Invocation(
            backend=self.name,
            commands=ssh_commands(plan),
            note="native ssh (paramiko): one connection per host, in parallel; the run token goes to the "
            "agent's stdin; spec, env and args travel over the control channel",
        )

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        results = connect_all(list(plan.agent_hosts), plan.request.remote.ssh)  # the hot spares' too: standby
        try:
            connected = [r for r in results if isinstance(r, Connected)]
            failed = [r for r in results if not isinstance(r, Connected)]
            if any(r.host not in plan.spares for r in failed):  # a spare that cannot be reached is only not one
                raise HostConnectError(failed)
            override = plan.request.remote.control_addr
            # Per host: our end of the TCP connection to it is the address it can reach us on.
            addrs = {c.host: override or c.local_address or route_source(c.address) for c in connected}
            return run_over_channel(plan, addrs,
                                    lambda endpoints: SshSessions.start(connected, plan, endpoints, failed))
        finally:
            close_all(results)


class SshSessions:
    """The exec channels that carry the agents; what their stdout and stderr carry (the agents' ranks' lines come
    over the control channel) is relayed in whole lines onto the job's console (xrun.runner.job.relay)."""

    def __init__(self, connected: list[Any], commands: tuple[NodeCommand, ...], endpoints: Endpoints) -> None:
        self.clients = {c.host: c for c in connected}
        self.commands = commands
        self.endpoints = endpoints
        self.channels: dict[str, Any] = {}
        self.ended: set[str] = set()
        self.streams: dict[tuple[str, int], StreamLines] = {}
        self.unreachable: list[Any] = []  # hot spares ssh could not reach: the job goes on without them

    @classmethod
    def start(cls, connected: list[Any], plan: Plan, endpoints: Endpoints, unreachable: Sequence[Any] = ()
              ) -> SshSessions:
        """Run every agent's command on its connection (in parallel) and hand each its token; the hot spares that
        could not be reached are reported as sessions that ended (the job drops them, one line each)."""
        sessions = cls(connected, ssh_commands(plan, endpoints), endpoints)
        sessions.unreachable = list(unreachable)
        with ThreadPoolExecutor(max_workers=min(64, len(sessions.commands)), thread_name_prefix="xrun-exec") as pool:
            opened = list(pool.map(sessions._exec, sessions.commands))
        sessions.channels = dict(zip((c.host for c in sessions.commands), opened))
        return sessions

    def _exec(self, command: NodeCommand) -> Any:
        chan = self.clients[command.host].transport.open_session()
        chan.exec_command(render(command.argv))
        chan.sendall((self.endpoints[command.host].token + "\n").encode("ascii"))
        chan.shutdown_write()
        return chan

    def register(self, loop: Any) -> None:
        for host, chan in self.channels.items():
            for fd in (1, 2):
                self.streams[host, fd] = StreamLines(loop.console, ("ssh", host, fd), fd)
            loop.add_reader(chan, lambda h=host, c=chan: self._relay(loop, h, c))
        for failed in self.unreachable:
            loop.session_ended(failed.host, None, f"ssh cannot reach it: {failed.reason}")

    def _relay(self, loop: Any, host: str, chan: Any) -> None:
        while chan.recv_ready():
            self.streams[host, 1].feed(chan.recv(65536))
        while chan.recv_stderr_ready():
            self.streams[host, 2].feed(chan.recv_stderr(65536))
        if chan.exit_status_ready() or chan.closed or not chan.get_transport().is_active():
            if chan.recv_ready() or chan.recv_stderr_ready():
                return
            self._end(host)
            loop.remove_reader(chan)
            self.ended.add(host)
            code = chan.recv_exit_status() if chan.exit_status_ready() else None
            loop.session_ended(host, code if code != -1 else None, "" if code is not None else "ssh connection lost")

    def finished(self, lost: set[str]) -> bool:
        return all(host in self.ended or host in lost for host in self.channels)

    def _end(self, host: str) -> None:
        """``host``'s streams ended: their last lines, even without a newline."""
        for fd in (1, 2):
            stream = self.streams.get((host, fd))
            if stream is not None:
                stream.flush()

    def terminate(self) -> None:
        for chan in self.channels.values():
            chan.close()
        for stream in self.streams.values():  # before the report: every node's last lines come first
            stream.flush()
