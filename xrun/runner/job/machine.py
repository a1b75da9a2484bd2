"""The head's job state machine: pure, events in, actions out, and at the end the job's verdict.

It holds no socket, reads no clock and prints nothing: ``xrun.runner.job.server`` turns what arrives (agents'
messages, dropped connections, backend sessions that end, signals, time passing) into the events of
``xrun.runner.job.events``, feeds each with the current ``monotonic()`` time, and carries out the actions that
come back.

``Job`` is the facade; its rules live beside it: each node's state and the counts the rules read
(``xrun.runner.job.nodes``), the start barrier (``xrun.runner.job.barrier``: a static job holds every node until all
are ready or ``--join_timeout`` passes; ``--elastic`` starts each node as soon as it is ready), and what counts as a
failure, which one is the root cause and the exit code (``xrun.runner.job.verdict``). Here: the hellos, the
keepalive, lost nodes (``--elastic`` leaves one to torch while at least ``--min_nodes`` remain, issue 6) and the
stop. The first failure stops every other node; SIGINT/SIGTERM/SIGHUP stop every node gracefully, a second SIGINT
with SIGKILL. A node that neither finishes nor answers by the stop deadline counts as lost.

What a hello gets back is a ``HelloPolicy``'s answer (``xrun.runner.job.hellos``: the spec, a refusal, a stray).
With ``JobConfig.verdict_to_nodes`` (pod mode) the verdict, once fixed, is also sent to every node still connected, and
a node's hello may come late or, with ``--max_restarts``, after its agent was lost (``xrun.runner.job.rejoin``).

The job's exit code is decided once every node is over (``RootCause.fix``); ``Job.verdict`` then stays the same
whatever arrives during the last linger.
"""

from __future__ import annotations

import signal
from typing import Any, Callable, ClassVar

from xrun.channel import DEAD_AFTER, PING_INTERVAL
from xrun.launch.procs.posix import signal_name
from xrun.runner.job.attempts import Attempts, Ending, restart_actions, seated_specs
from xrun.runner.job.barrier import Barrier
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import (
    AGENT_EVENTS,
    Action,
    AgentError,
    AgentEvent,
    ConnectionLost,
    Done,
    Drop,
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
    SendStop,
    SendVerdict,
    SessionEnded,
    ShowJoined,
    ShowLine,
    SignalReceived,
    Tick,
    Verdict,
)
from xrun.runner.job.hellos import HelloPolicy, SendSpecs, on_hello
from xrun.runner.job.hellos import Refusal as Refusal  # re-exported: the hello policies (pod mode) name them here
from xrun.runner.job.hellos import Stray as Stray
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.precheck import decide_with_spares, passed_line
from xrun.runner.job.rejoin import rejoins, unawaited_nodes
from xrun.runner.job.spares import Spares
from xrun.runner.job.verdict import (
    RootCause,
    agent_failure,
    done_failure,
    hang_failure,
    lost_failure,
    rank_failure,
    session_failure,
)

LINGER = 3.0  # after every agent is done: time for the sessions to deliver the last output and exit
STOP_GRACE = 5.0  # beyond the agents' own shutdown deadline before a node counts as not stopping


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
        self.now = now
        self.sigints = 0
        self.stopping = False
        self.stop_deadline: float | None = None
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
        if self.all_over_at is None and self.nodes.all_over(stopping=self.stopping) and not self._restarted():
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
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
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
            if self._elastic_survivable():
                self._say(f"{failure.reason}; the elastic job goes on without it")
            else:
                self._fail(failure)

    def _signal(self, event: SignalReceived) -> None:
        if event.signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints > 1:  # second Ctrl-C: do not wait for the graceful deadline
                self._stop(signal.SIGKILL, "second SIGINT")
                return
        self.cause.interrupted(event.signum)
        name = signal_name(event.signum)
        self._say(f"got {name}; stopping every node")
        self._stop(signal.SIGTERM, f"xrun got {name}")

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
        if self.stop_deadline is not None and self.now >= self.stop_deadline:
            for node in self.nodes:
                if not node.over:
                    self._mark_lost(node, "did not stop before the deadline")

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

    # -- the job --------------------------------------------------------------------------------------------

    def _fail(self, failure: Failure) -> None:
        self.cause.failed(failure, self.now)
        self._stop(signal.SIGTERM, failure.reason)

    def _lose(self, node: Node, reason: str) -> None:
        self._mark_lost(node, reason)
        if self._elastic_survivable():
            left = self.nodes.left()
            self._say(f"lost node {node.host}: {reason}; {left} node(s) left, they re-rendezvous without it")
        elif not self.stopping or self.failure is None:
            self._fail(lost_failure(node.host, reason))

    def _mark_lost(self, node: Node, reason: str) -> None:
        if node.state is NodeState.DONE:
            return
        node.state = NodeState.LOST
        if self.stopping:
            self._say(f"{node.host}: {reason}")
        if node.connected:
            node.connected = False
            self._out.append(Drop(node.agent))

    def _stop(self, signum: int, reason: str) -> None:
        first = not self.stopping
        self.stopping = True
        if first or signum == signal.SIGKILL:
            deadline = self.config.shutdown_timeout
            self.stop_deadline = self.now + deadline + STOP_GRACE
            targets = self.nodes.reachable()
            if targets:
                self._out.append(SendStop(targets, int(signum), deadline, reason))

    def _restarted(self) -> bool:
        """--max_restarts: the attempt just over is followed by another (decided in xrun.runner.job.attempts), or
        waits for spares still joining to decide."""
        if not self.config.restart.restarts:
            return False
        # lost, or failed its preflight: a spare on standby may take its place (pod mode: a lost node other than
        # node 0 may come back instead, xrun.runner.job.rejoin)
        faulty = unawaited_nodes(self.nodes, self.config) if rejoins(self.config) else self.nodes.faulty()
        if faulty and self._joining(short=len(faulty) > len(self.spares.ready())):
            return True  # not over yet: decided once they joined (or stand by) or are lost, at the latest a tick
        ending = self.attempts.over(self.cause, self.barrier.started_at, self.now,
                                    lost=tuple(n.host for n in faulty), spares=len(self.spares.ready()))
        if ending is not Ending.RESTART:
            return False
        attempt = self.attempts.begin_next(self.now)
        self.attempts.replaced, seating = self.spares.seat_all(self.nodes, faulty, attempt)
        self._out += seating
        self._out += restart_actions(self.config, self.nodes, attempt, self.failure, self.attempts.replaced)
        self.cause.next_attempt()
        self.stopping, self.stop_deadline = False, None
        self.barrier = Barrier(self.config, self.nodes, t0=self.now, attempt=attempt)
        return True

    def _joining(self, *, short: bool) -> bool:
        """A failure to restart, within --join_timeout of the job's start, while nodes are still to join (they join
        the next attempt) or, ``short`` of spares, spares are still to stand by: what follows waits for them."""
        failure = self.failure
        if failure is None or failure.final or self.cause.interrupted_by is not None or self.config.verdict_to_nodes:
            return False  # pod mode: nodes that join late or come back are xrun.runner.job.rejoin's
        if self.now >= self.attempts.t0 + self.config.join_timeout:
            return False
        return any(n.state is NodeState.WAITING for n in self.nodes) or (short and self.spares.joining())

    def _elastic_survivable(self) -> bool:
        """--elastic: enough nodes are still running or may still join for torch to carry on."""
        rule = self.config.elastic
        return rule is not None and not self.stopping and self.nodes.left() >= rule.min_nodes

    def _say(self, text: str) -> None:
        self._out.append(ShowLine(text))


def _precheck_done(job: Job, event: PrecheckDone) -> None:
    """--precheck is over (issue 24): the ranks start, hot spares that passed take bad nodes' places (issue 23), or
    the job ends, as ``precheck.decide_with_spares`` says (outside the class: its bound)."""
    if job.stopping:
        return  # a node was lost or a signal came meanwhile: the job is ending already
    standing = job.spares.ready()
    bad_spares, outcome = decide_with_spares(event.result, world=job.nodes.by_agent, spares=[s.agent for s in standing])
    for bad in bad_spares:
        spare = job.spares.standing.get(bad.rank)
        if spare is not None:
            job._out += job.spares.lose(spare, f"precheck: {bad.describe()}")
    if outcome is None:
        job._out += job.barrier.precheck_passed(passed_line(event.result), job.now)
    elif isinstance(outcome, Failure):
        job._fail(outcome)
    else:
        job._say(outcome.line)
        _replace_now(job, [(job.nodes.by_agent[node], spare) for node, spare in outcome.pairs])
        job.barrier.reopen(job.now)


def _nodes_faulty(job: Job, event: NodesFaulty) -> None:
    """These nodes are bad (the seam for any check before the start, issue 24): while the start barrier holds, each
    is replaced at once by a spare on standby (not a restart; the barrier waits for the spares), if there are
    enough; otherwise, or once the ranks run, they are lost nodes: the job stops, and with --max_restarts the next
    attempt runs on spares or the job ends naming every lost node."""
    nodes = job.nodes
    bad = [nodes[r] for r in dict.fromkeys(event.node_ranks) if 0 <= r < len(nodes) and not nodes[r].over]
    standing = job.spares.ready()
    if job.barrier.holding(stopping=job.stopping) and len(bad) <= len(standing):
        _replace_now(job, [(node, spare.agent) for node, spare in zip(bad, standing)])
        return
    for node in bad:
        job._mark_lost(node, event.reason)
    if bad:
        job._fail(lost_failure(", ".join(n.host for n in bad), event.reason))


def _replace_now(job: Job, pairs: list[tuple[Node, int]]) -> None:
    """Before any rank of the attempt started: each spare (an agent id) runs its node from now on, and is sent the
    node's spec (its preflight and ready follow; the barrier holds until then)."""
    for node, spare in pairs:
        replacement, actions = job.spares.seat(job.nodes, node, job.attempts.number, spare)
        job.attempts.replaced += (replacement,)
        job._out += actions
    job._out += seated_specs(job.config, [node for node, _ in pairs])


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
    NodesFaulty: _nodes_faulty,
    Tick: Job._tick,
    PrecheckDone: _precheck_done,
}
