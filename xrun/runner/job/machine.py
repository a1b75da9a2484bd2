"""The head's job state machine: pure, events in, actions out, and at the end the job's verdict.

It holds no socket, reads no clock and prints nothing: ``xrun.runner.job.server`` turns what arrives (agents'
messages, dropped connections, backend sessions that end, signals, time passing) into the events of
``xrun.runner.job.events``, feeds each with the current ``monotonic()`` time, and carries out the actions that
come back.

``Job`` is the facade: it takes the events, keeps the nodes' states, the keepalive and the end (the verdict, then a
last linger); its rules live beside it, one concept each: each node's state and the counts the rules read
(``xrun.runner.job.nodes``), the start barrier (``xrun.runner.job.barrier``: a static job holds every node until all
are ready or ``--join_timeout`` passes; ``--elastic`` starts each node as soon as it is ready), what counts as a
failure, which one is the root cause and the exit code (``xrun.runner.job.verdict``), the stop that a failure, a
signal or a lost node begins (``xrun.runner.job.stop``), what follows an attempt with ``--max_restarts``
(``xrun.runner.job.restart``, by ``xrun.runner.job.attempts``'s rules) and nodes found bad before the start
(``xrun.runner.job.faulty``: ``--precheck``, hot spares that take their places at once).

What a hello gets back is a ``HelloPolicy``'s answer (``xrun.runner.job.hellos``: the spec, a refusal, a stray).
With ``JobConfig.verdict_to_nodes`` (pod mode) the verdict, once fixed, is also sent to every node still connected, and
a node's hello may come late or, with ``--max_restarts``, after its agent was lost (``xrun.runner.job.rejoin``).

The job's exit code is decided once every node is over (``RootCause.fix``); ``Job.verdict`` then stays the same
whatever arrives during the last linger.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from xrun.channel import DEAD_AFTER, PING_INTERVAL
from xrun.runner.job.attempts import Attempts
from xrun.runner.job.barrier import Barrier
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import (
    AGENT_EVENTS,
    Action,
    AgentError,
    AgentEvent,
    ConnectionLost,
    Done,
    Event,
    Failure,
    Heard,
    HelloReceived,
    Hung,
    NodesFaulty,
    PrecheckDone,
    RankExited,
    Ready,
    SendPing,
    SendVerdict,
    SessionEnded,
    ShowJoined,
    ShowLine,
    SignalReceived,
    Tick,
    Verdict,
)
from xrun.runner.job.faulty import nodes_faulty, precheck_done
from xrun.runner.job.hellos import HelloPolicy, SendSpecs, on_hello
from xrun.runner.job.hellos import Refusal as Refusal  # re-exported: the hello policies (pod mode) name them here
from xrun.runner.job.hellos import Stray as Stray
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.restart import restarted
from xrun.runner.job.spares import Spares
from xrun.runner.job.stop import Stop
from xrun.runner.job.verdict import (
    RootCause,
    agent_failure,
    done_failure,
    hang_failure,
    rank_failure,
    session_failure,
)

LINGER = 3.0  # after every agent is done: time for the sessions to deliver the last output and exit


class Job:
    """One run's nodes, from the first hello to the verdict. ``handle`` is the only way in."""

    _HANDLERS: ClassVar[dict[type, Callable[[Job, Any], None]]]  # filled in below the class

    def __init__(self, config: JobConfig, *, now: float, policy: HelloPolicy | None = None) -> None:
        self.config = config
        picks = config.pick_master_port or config.master_port == 0
        self.policy = policy if policy is not None else SendSpecs(picks, 0 if config.elastic else config.master_port)
        self.nodes = Nodes(config.hosts)
        self.spares = Spares(config.spares, first_agent=len(config.hosts))  # --spares: agent ids after the world's
        self.barrier = Barrier(config, self.nodes, t0=now, spares=self.spares)
        self.cause = RootCause(elastic=config.elastic is not None)
        self.stop = Stop(config, self.nodes, self.cause)  # the first failure, a signal, a lost node: every node stops
        self.now = now
        self.all_over_at: float | None = None
        self.next_ping = now
        self._out: list[Action] = []
        self.strays = 0  # hellos the policy turned away
        self.attempts = Attempts(config.restart, t0=now)  # --max_restarts: attempt over -> the next, or the end

    # -- the interface --------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at time ``now``; return what to do about it, in order."""
        self.now = now
        if not isinstance(event, AGENT_EVENTS) or self._from_world(event):
            self._HANDLERS[type(event)](self, event)
        if self.all_over_at is None and self.nodes.all_over(stopping=self.stopping) and not restarted(self):
            self.all_over_at = now
            verdict = self.cause.fix(self.nodes, now)
            if self.config.verdict_to_nodes or self.config.restart.restarts:  # agents that wait for a restart
                told = (*(n.agent for n in self.nodes if n.connected), *self.spares.release())
                self._out.append(SendVerdict(told, verdict))
        out, self._out = self._out, []
        return out

    def next_deadline(self) -> float:
        """When a ``Tick`` is next due, at the latest."""
        deadlines = [self.next_ping]
        if self.barrier.holding(stopping=self.stopping):
            deadlines += self.barrier.deadlines()
        if self.stop.deadline is not None:
            deadlines.append(self.stop.deadline)
        if self.all_over_at is not None:
            deadlines.append(self.all_over_at + LINGER)
        return min(deadlines)

    def linger_over(self, now: float) -> bool:
        """Every node is over and the sessions had their time to deliver the last output."""
        return self.all_over_at is not None and now >= self.all_over_at + LINGER

    def lost_hosts(self) -> set[str]:
        return self.nodes.lost_hosts() | self.spares.gone

    def state(self, node: int) -> NodeState:
        return self.nodes[node].state

    def verdict(self) -> Verdict:
        fixed = self.cause.fixed
        return fixed if fixed is not None else self.cause.decide(self.nodes, self.all_over_at)

    @property
    def failure(self) -> Failure | None:
        """The root cause so far."""
        return self.cause.failure

    @property
    def failure_at(self) -> float | None:
        return self.cause.failure_at

    @property
    def stopping(self) -> bool:
        """The attempt is stopping: every node was told to stop (``xrun.runner.job.stop``)."""
        return self.stop.stopping

    # -- what the agents say --------------------------------------------------------------------------------

    def _from_world(self, event: AgentEvent) -> bool:
        """An admitted agent's word: a world node's goes on to the handlers; a spare's to the spares."""
        node = self.nodes.by_agent.get(event.node)
        if node is None:
            self._out += self.spares.heard(event, self.now)
            if self.barrier.holding(stopping=self.stopping):  # --precheck may wait for this spare
                self._out += self.barrier.poke(self.now)
            return False
        if not node.connected:
            return False  # the socket layer sends none; a late one from a dropped connection changes nothing
        node.last_seen = self.now
        return True

    def _ready(self, event: Ready) -> None:
        node = self.nodes.by_agent[event.node]
        node.state, node.master_port = NodeState.READY, event.master_port
        self._out.append(ShowJoined(node.host, self.nodes.up(), len(self.nodes)))
        if not self.stopping:
            self._out += self.barrier.ready(node, self.now)

    def _rank_exited(self, event: RankExited) -> None:
        failure = rank_failure(event, self.nodes.by_agent[event.node].host)
        if failure is not None:
            self._fail(failure)

    def _done(self, event: Done) -> None:
        node = self.nodes.by_agent[event.node]
        node.state, node.exit_code = NodeState.DONE, event.exit_code
        failure = done_failure(event, node.host)
        if failure is not None and not self.stopping:
            self._fail(failure)

    def _agent_error(self, event: AgentError) -> None:
        node = self.nodes.by_agent[event.node]
        self._fail(agent_failure(event, node.host))
        node.state = NodeState.LOST  # it said why it ends: its connection closing next is no news
        node.exit_code = event.exit_code  # what its agent exits with (a refusal's 2): pdsh's echo of it is no news

    def _connection_lost(self, event: ConnectionLost) -> None:
        node = self.nodes.by_agent[event.node]
        node.connected = False
        if not node.over:
            self._lose(node, f"its agent's connection dropped ({event.reason})")

    # -- what happens around them ---------------------------------------------------------------------------

    def _session_ended(self, event: SessionEnded) -> None:
        self._out += self.spares.session_ended(event.host, event.detail)
        for node in self.nodes if event.host is None else self.nodes.by_host.get(event.host, []):
            if node.over or node.connected:
                continue  # a connected node's own connection tells how it ended
            node.state = NodeState.LOST
            if self.stopping:
                continue
            failure = session_failure(event, node.host)
            if self.stop.elastic_survivable():
                self._say(f"{failure.reason}; the elastic job goes on without it")
            else:
                self._fail(failure)

    def _signal(self, event: SignalReceived) -> None:
        self._out += self.stop.signal(event.signum, self.now)

    def _hung(self, event: Hung) -> None:
        self._fail(hang_failure(event))

    def _tick(self, event: Tick) -> None:
        self._keepalive()
        if self.barrier.holding(stopping=self.stopping):
            failure = self.barrier.timed_out(self.now)
            if failure is not None:
                self._fail(failure)
            else:
                self._out += self.barrier.status(self.now)
        self._out += self.stop.overdue(self.now)

    def _keepalive(self) -> None:
        if self.now < self.next_ping:
            return
        self.next_ping = self.now + PING_INTERVAL
        # --max_restarts: agents done with an attempt wait connected for the next one: keep them alive too
        silent, alive = self.nodes.ping_round(self.now, DEAD_AFTER, done_too=self.config.restart.restarts)
        for node in silent:
            self._lose(node, f"no word from its agent for {DEAD_AFTER:g} s (network cut or node down?)")
        lost_spares, standing = self.spares.ping_round(self.now, DEAD_AFTER)
        self._out += lost_spares
        if alive or standing:
            self._out.append(SendPing((*alive, *standing)))

    # -- the steps the handlers share ---------------------------------------------------------------------

    def _fail(self, failure: Failure) -> None:
        self._out += self.stop.fail(failure, self.now)

    def _lose(self, node: Node, reason: str) -> None:
        self._out += self.stop.lose(node, reason, self.now)

    def _say(self, text: str) -> None:
        self._out.append(ShowLine(text))


Job._HANDLERS = {
    HelloReceived: on_hello,
    Ready: Job._ready,
    RankExited: Job._rank_exited,
    Done: Job._done,
    AgentError: Job._agent_error,
    Heard: lambda job, event: None,  # handle() noted the time
    ConnectionLost: Job._connection_lost,
    SessionEnded: Job._session_ended,
    SignalReceived: Job._signal,
    Hung: Job._hung,
    NodesFaulty: nodes_faulty,
    Tick: Job._tick,
    PrecheckDone: precheck_done,
}
