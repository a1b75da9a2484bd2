"""Between the control server (``xrun.runner.job.server``) and the job state machine: events go in one at a time,
and each action that comes back is carried out.

An action becomes a message to agents over their admitted connections (a spec, ``start``, ``stop``, ``restart``,
the verdict, a ping), a connection admitted or dropped, a status line (``xrun.launch.output.status``), or the start of
``--precheck``'s network check (``xrun.runner.network.precheck_channel``). ``feed`` is not re-entered: an event raised
while actions are carried out (a send that fails loses its node) waits in the queue for the loop already feeding.
Pod mode's server replaces some doers (the barrier's status goes to every node: ``xrun.runner.pod.server``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Protocol

from xrun.channel import Kind, Message, message
from xrun.runner.job.connections import Conn
from xrun.runner.job.events import (
    Admit,
    Drop,
    Event,
    RunPrecheck,
    SendAccept,
    SendPing,
    SendRestart,
    SendSpec,
    SendStart,
    SendStop,
    SendVerdict,
    ShowJoined,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    TurnAway,
)
from xrun.runner.job.wire import verdict_message

if TYPE_CHECKING:
    from xrun.launch.output.status import PlainStatus
    from xrun.runner.job.machine import Job
    from xrun.runner.plan import Plan


class ExtrasView(Protocol):
    """What the actions ask of the server's extras (``xrun.runner.job.extras.Extras``)."""

    def failure_stacks(self) -> bool: ...

    def run_precheck(self, action: RunPrecheck) -> None: ...


class Server(Protocol):
    """What the dispatch reads and calls of its control server (``xrun.runner.job.server.ControlServer``)."""

    @property
    def job(self) -> Job: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def status(self) -> PlainStatus: ...

    @property
    def extras(self) -> ExtrasView: ...

    @property
    def conns(self) -> dict[int, Conn]: ...

    @property
    def node_conns(self) -> dict[int, Conn]: ...

    def admit(self, action: Admit) -> None: ...

    def drop(self, conn: Conn, *, failed: bool = False) -> None: ...

    def on_closed(self, conn: Conn, reason: str) -> None: ...

    def next_attempt(self) -> None: ...


class Dispatch:
    """One server's way to its machine: ``feed`` an event, the actions are done by ``doers``, by action type."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.events: deque[Event] = deque()
        self.feeding = False
        self.doers = self._table()

    def feed(self, event: Event) -> None:
        """Hand one event to the machine and carry out its actions; events those raise (a failed send) queue."""
        self.events.append(event)
        if self.feeding:
            return
        self.feeding = True
        try:
            while self.events:
                for action in self.server.job.handle(self.events.popleft(), time.monotonic()):
                    self.doers[type(action)](action)
        finally:
            self.feeding = False

    def _table(self) -> dict[type, Callable[[Any], None]]:
        """How each of the machine's actions is carried out."""
        server, status = self.server, self.server.status
        return {
            Admit: server.admit,
            TurnAway: lambda a: self._drop_if_open(server.conns.get(a.conn)),
            Drop: lambda a: self._drop_if_open(server.node_conns.get(a.node)),
            SendSpec: self._send_spec,
            SendAccept: lambda a: self.send(a.node, message(Kind.ACCEPT)),
            SendVerdict: lambda a: self.send_all(a.nodes, verdict_message(a.verdict)),
            SendStart: lambda a: self.send_all(a.nodes, message(Kind.START, master_addr=a.master_addr,
                                                                 master_port=a.master_port, restart_count=a.attempt)),
            SendRestart: self._send_restart,
            SendStop: self._send_stop,
            SendPing: lambda a: self.send_all(a.nodes, message(Kind.PING)),
            ShowLine: lambda a: status.line(a.text),
            ShowJoined: lambda a: status.joined(a.host, a.ready, a.total),
            ShowWaiting: lambda a: status.waiting(a.ready, list(a.missing), a.elapsed),
            ShowStarted: lambda a: status.started(a.nodes, a.ranks, a.elapsed, a.master_addr, a.master_port),
            RunPrecheck: lambda a: server.extras.run_precheck(a),
        }

    def send_all(self, nodes: Iterable[int], msg: Message) -> None:
        for node in nodes:
            self.send(node, msg)

    def send(self, node: int, msg: Message) -> None:
        """To the admitted agent ``node``, if still connected; a send that fails closes its connection."""
        conn = self.server.node_conns.get(node)
        if conn is None:
            return
        try:
            conn.send(msg)
        except OSError as err:
            self.server.on_closed(conn, f"send failed: {err.strerror or err}")

    def _drop_if_open(self, conn: Conn | None) -> None:
        if conn is not None:
            self.server.drop(conn)

    def _send_spec(self, action: SendSpec) -> None:
        """An agent's spec; a hot spare's (--spares) is the node's it stands by for or takes the place of (node 0's
        for its standby preflight), with its own host."""
        plan = self.server.plan
        spec = plan.nodes[0 if action.standby else action.node if action.node_rank is None else action.node_rank]
        host = plan.agent_hosts[action.node]
        spec = spec if spec.host == host else replace(spec, host=host)
        restarts = self.server.job.config.restart.max_restarts  # the agent waits for a restart after its done
        self.send(action.node, message(Kind.SPEC, spec=spec.to_json(), pick_master_port=action.pick_master_port,
                                       master_port=action.master_port, max_restarts=restarts, standby=action.standby))

    def _send_stop(self, action: SendStop) -> None:
        """After a failure the agents take their ranks' stacks before they stop them (``Extras.failure_stacks``)."""
        self.send_all(action.nodes, message(Kind.STOP, signal=action.signal, deadline=action.deadline,
                                            reason=action.reason, stacks=self.server.extras.failure_stacks()))

    def _send_restart(self, action: SendRestart) -> None:
        """--max_restarts: the next attempt (the server's extras begin anew)."""
        self.server.next_attempt()
        for node in action.nodes:
            node0 = node == action.node0
            self.send(node, message(Kind.RESTART, attempt=action.attempt, pick_master_port=node0 and
                                    action.pick_master_port, master_port=action.master_port if node0 else 0))
