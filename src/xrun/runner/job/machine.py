"""The head's job state machine: pure, events in, actions out, and at the end the job's verdict.

It holds no socket, reads no clock and prints nothing: the control server (``xrun.runner.job.control_server``)
turns what arrives (agents' messages, dropped connections, backend sessions that end, signals, time passing) into
the events of ``xrun.runner.job.events``, feeds each with the current ``monotonic()`` time, and carries out the
actions that come back.

``Job`` holds the rules, read top to bottom: what the agents say (a hello, ready, a rank's exit, done, an error, a
dropped connection), what happens around them (a backend session that ends, a signal, a hang, time passing), the
nodes found bad before a start (``--precheck``), the end of an attempt (the next one with ``--max_restarts``, or
the verdict), and pod mode's late and returning nodes. It owns the collaborators that are concepts of their own and
asks them: each node's state and the counts the rules read (``xrun.runner.job.nodes``), the start barrier
(``xrun.runner.job.barrier``: a static job holds every node until all are ready or ``--join_timeout`` passes;
``--elastic`` starts each node as soon as it is ready), the stop that a failure, a signal or a lost node begins
(``xrun.runner.job.stop``), what counts as a failure, which one is the root cause and the exit code
(``xrun.runner.job.verdict``), what follows an attempt (``xrun.runner.job.attempts``), the hot spares
(``xrun.runner.job.spares``) and what a hello is answered (``xrun.runner.job.hello_policy``: the spec, a refusal,
a stray).

Restarts (``--max_restarts``, issue 23): once every node of an attempt is over, the next attempt begins, waits for
nodes still joining, or the job ends. A lost node (or one that failed its preflight) may have its place taken by a
hot spare on standby; a failure within ``--join_timeout`` of the job's start, while nodes (or, short of spares,
spares) are still joining, waits for them: they join the next attempt. The next attempt gets every node back, a
fresh root cause, no stop, and a new start barrier.

Nodes found bad before the start (``--precheck``'s result, ``NodesFaulty``, issue 24): while the barrier holds each
is replaced at once by a hot spare on standby (not a restart: no rank has started; the barrier waits for the
spare's preflight and ready); without enough spares, or once the ranks run, bad nodes are lost nodes. This is the
one way a spare is used without ``--max_restarts`` (``--precheck --spares N``, issue 33): a node lost after the
start then ends the job as without spares, and the end line says that ``--max_restarts`` would have let a spare
take its place.

Pod mode (``JobConfig.verdict_to_nodes``): the verdict, once fixed, is also sent to every node still connected,
and a node's hello can come when the job no longer waits for it:

* **late**: it never joined and the job is already stopping: it is admitted only to be told how the job ends (a
  stop, or the verdict once fixed), so it exits with the job's code;
* **back** (with ``--max_restarts``): a node other than node 0 whose agent is gone (its pod evicted and re-created
  with the same index, its xrun killed and started again) proves the secret again. Its old connection must be gone
  first (``Nodes``: a node has one connection; the pod server reopens the place only then), so at any moment one
  live agent at most holds a node's place. While the attempt that lost it is still ending, or after its own part
  of an attempt is over, it is admitted and *parked* (DONE and connected: pinged, never counted live, told the
  next ``restart`` or the verdict like the others); once the next attempt's barrier is open it joins it as any node
  does. One back with another plan digest is turned away, named (its place stays open for the right one until
  ``--join_timeout``), where a node that joins the first attempt so is refused and ends the job with exit 2. The
  next attempt waits for every lost node but node 0 (it hosts the channel), unless it was already awaited at the
  barrier of the attempt just over and did not come (``Nodes.faulty(rejoin=True)``): that one ends the job, named.

The job's exit code is decided once every node is over (``RootCause.fix``); ``Job.verdict`` then stays the same
whatever arrives during the last linger.
"""

from __future__ import annotations

import signal
from typing import Any, Callable, ClassVar

from xrun import __version__
from xrun.channel import DEAD_AFTER, PING_INTERVAL
from xrun.runner.job.attempts import Attempts, Ending, restart_actions, seated_specs
from xrun.runner.job.barrier import Barrier
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import (
    AGENT_EVENTS,
    Action,
    Admit,
    AgentError,
    AgentEvent,
    ConnectionLost,
    Done,
    Event,
    Failure,
    GroupFailed,
    GroupRestarted,
    GroupStopped,
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
    TurnAway,
    Verdict,
)
from xrun.runner.job.groups import Groups
from xrun.runner.job.hello_policy import HelloPolicy, Refusal, SendSpecs, Stray
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.spares import Spares
from xrun.runner.job.stop import Stop
from xrun.runner.job.verdict import (
    RootCause,
    agent_failure,
    done_failure,
    hang_failure,
    lost_failure,
    precheck_failure,
    rank_failure,
    refused_failure,
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
        # --spares: agent ids after the world's
        self.spares = Spares(config.spares, first_agent=len(config.hosts), role=config.spare_role)
        # --replica_groups: each group's restarts, for a lost node's groups moved to a spare (issue 39 §2)
        self.groups = Groups(config.groups, self.nodes, self.spares) if config.groups is not None else None
        self.barrier = Barrier(config, self.nodes, t0=now, spares=self.spares)
        self.cause = RootCause(elastic=config.elastic is not None, keep_survivors=config.keep_survivors,
                               world_size=config.world_size)
        self.stop = Stop(config, self.nodes, self.cause)  # the first failure, a signal, a lost node: every node stops
        self.now = now
        self.all_over_at: float | None = None
        self.next_ping = now
        self._out: list[Action] = []
        self.strays = 0  # hellos the policy turned away
        # --max_restarts: attempt over -> the next, or the end
        self.attempts = Attempts(config.restart, t0=now, groups=config.groups is not None)

    # -- the interface --------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at time ``now``; return what to do about it, in order."""
        self.now = now
        if not isinstance(event, AGENT_EVENTS) or self._from_world(event):
            self._HANDLERS[type(event)](self, event)
        if self.all_over_at is None and self.nodes.all_over(stopping=self.stopping):
            self._attempt_over()
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

    # -- a hello --------------------------------------------------------------------------------------------

    def _hello(self, event: HelloReceived) -> None:
        """An agent proved its key: a stray is turned away, a spare's hello goes to the spares, a node joins the
        job (or, a second agent for it or one late for a job that is stopping, is turned away)."""
        answer = self.policy.answer(event)
        if isinstance(answer, Stray):
            self.strays += 1
            self._out.append(TurnAway(event.conn))
            return
        node = self.nodes.by_agent.get(event.node)
        if node is None:  # a hot spare's agent (--spares), or a replaced node's: the spares answer
            self._out += self.spares.hello(event, self.now, ending=self.cause.fixed is not None)
            return
        refused = answer.reason if isinstance(answer, Refusal) else None
        if self.config.verdict_to_nodes and self._pod_hello(node, event, refused):
            return
        # --max_restarts: a node joining an attempt that is stopping (before the verdict) joins the job: it is told to
        # stop right after its spec, says done, and waits for the next attempt with the others
        joins_next = self.stopping and self.config.restart.restarts and self.cause.fixed is None \
            and not self.config.verdict_to_nodes  # head mode: pod mode's are _pod_hello's
        if node.state is not NodeState.WAITING or (self.stopping and not joins_next):
            if node.state is NodeState.WAITING:  # its first agent, late: not a second one
                self._say(f"turned away node {node.rank} ({node.host})'s agent from {event.peer}: it came after the "
                          "job began stopping")
            else:
                self._say(f"ignored a second agent for node {node.rank} ({node.host}) from {event.peer}")
            self._out.append(TurnAway(event.conn))
            return
        self._join(node, event, answer, joins_next=joins_next)

    def _join(self, node: Node, event: HelloReceived, answer: Action | Refusal, *, joins_next: bool) -> None:
        """``node``'s agent is admitted and sent the policy's answer (its spec, head mode), or the job ends with
        the policy's refusal; ``joins_next``: the attempt is stopping, so it is told to stop at once."""
        self.nodes.join(node, event.addr, self.now, name=event.host if self.config.numbered else None)
        self._out.append(Admit(node.agent, event.conn))
        if event.xrun_version != __version__:
            self._say(f"{node.host} runs xrun {event.xrun_version}, this is {__version__}")
        if isinstance(answer, Refusal):
            self._fail(refused_failure(node.host, answer.reason))
        else:
            self._out.append(answer)
        if joins_next:
            reason = self.failure.reason if self.failure is not None else "the attempt is stopping"
            self._out.append(SendStop((node.agent,), int(signal.SIGTERM), self.config.shutdown_timeout, reason))

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
        if self.stopping:
            return
        if self.groups is not None and self.barrier.started_at is not None:  # a spare has a lost node's groups
            self._out += self.groups.ready_late(node, self.barrier)
        else:
            self._out += self.barrier.ready(node, self.now)

    def _rank_exited(self, event: RankExited) -> None:
        failure = rank_failure(event, self.nodes.by_agent[event.node].host)
        lost = self.cause.keeps(event, failure)  # counts every exit, 0 too: keep tells the last rank by the count
        if failure is None:
            return
        if lost:  # --on_rank_exit keep: the others recover in place
            self._say(f"{failure.reason}; the other ranks go on (--on_rank_exit keep)")
        else:
            self._fail(failure)

    def _done(self, event: Done) -> None:
        node = self.nodes.by_agent[event.node]
        node.state, node.exit_code = NodeState.DONE, event.exit_code
        failure = done_failure(event, node.host)
        if self.groups is not None and not self.stopping:  # a restart across nodes waits no longer for it
            self._out += self.groups.over(node.rank, self.barrier)
        # --on_rank_exit keep: the node's ranks' own exits, heard one by one, decide (a lost rank is no failure)
        if failure is not None and not self.stopping and not self.config.keep_survivors:
            self._fail(failure)

    def _agent_error(self, event: AgentError) -> None:
        node = self.nodes.by_agent[event.node]
        self._fail(agent_failure(event, node.host))
        node.state = NodeState.LOST  # it said why it ends: its connection closing next is no news
        node.exit_code = event.exit_code  # what its agent exits with (a refusal's 2): pdsh's echo of it is no news

    def _heard(self, event: Heard) -> None:
        """Any other word (started, pong): ``_from_world`` noted the time."""

    def _group_restarted(self, event: GroupRestarted) -> None:
        """--replica_groups: a node restarted a group on its own; counted against the group's budget here too."""
        if self.groups is not None:
            self.groups.book.heard(event.group, event.restart)

    def _group_failed(self, event: GroupFailed) -> None:
        """--replica_groups: a rank of a group across nodes failed (xrun.runner.job.groups; nothing once the job
        stops: its stop reaches every rank)."""
        if self.groups is not None and not self.stopping:
            self._out += self.groups.failed(event)

    def _group_stopped(self, event: GroupStopped) -> None:
        """--replica_groups: the node's ranks of a group across nodes are gone (xrun.runner.job.groups)."""
        if self.groups is not None and not self.stopping:
            self._out += self.groups.stopped(self.nodes.by_agent[event.node].rank, event.group, self.barrier)

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
            failure = session_failure(event, node.host)
            why_not = self._why_groups_stay(node)
            if why_not is None:
                self._move_groups(node, failure.reason)
                continue
            failure = failure._replace(reason=failure.reason + why_not)
            node.state = NodeState.LOST
            if self.stopping:
                continue
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

    # -- nodes found bad before the start (--precheck, issue 24) ------------------------------------------------

    def _precheck_done(self, event: PrecheckDone) -> None:
        """--precheck is over (before any attempt: the first, or a restart's): the ranks start, hot spares that
        passed take bad nodes' places, or the job ends, as ``precheck_decision.decide_with_spares`` says."""
        if self.stopping or not self.barrier.prechecking:
            return  # a node was lost or a signal came meanwhile: the job is ending already (or no check runs)
        # only a --precheck job comes here: every other run's start (a local one's too) loads none of the check's
        # results and decisions (~5 ms of imports), as the head's check coordinator (control_server) is loaded
        from xrun.runner.network.precheck_decision import NodesBad, decide_with_spares, passed_line

        standing, attempt = self.spares.ready(), self.attempts.number
        bad_spares, outcome = decide_with_spares(event.result, world=self.nodes.by_agent,
                                                 spares=[s.agent for s in standing], attempt=attempt)
        for bad in bad_spares:
            spare = self.spares.standing.get(bad.rank)
            if spare is not None:
                self._out += self.spares.lose(spare, f"precheck: {bad.describe()}")
        if outcome is None:
            self._out += self.barrier.precheck_passed(passed_line(event.result, attempt=attempt), self.now)
        elif isinstance(outcome, NodesBad):
            self._fail(precheck_failure(outcome))
        else:
            self._say(outcome.line)
            self._seat_spares_now([(self.nodes.by_agent[node], spare) for node, spare in outcome.pairs])
            self.barrier.reopen(self.now)

    def _nodes_faulty(self, event: NodesFaulty) -> None:
        """These nodes are bad (the seam for any check before the start): replaced by spares on standby while the
        barrier holds and there are enough, else lost."""
        nodes = self.nodes
        bad = [nodes[r] for r in dict.fromkeys(event.node_ranks) if 0 <= r < len(nodes) and not nodes[r].over]
        standing = self.spares.ready()
        if self.barrier.holding(stopping=self.stopping) and len(bad) <= len(standing):
            self._seat_spares_now([(node, spare.agent) for node, spare in zip(bad, standing)])
            return
        for node in bad:
            self._out += self.stop.mark_lost(node, event.reason)
        if bad:
            self._fail(lost_failure(", ".join(n.host for n in bad), event.reason))

    def _seat_spares_now(self, pairs: list[tuple[Node, int]]) -> None:
        """Before any rank of the attempt started: each spare (an agent id) runs its node from now on, and is sent
        the node's spec (its preflight and ready follow; the barrier holds until then)."""
        for node, spare in pairs:
            replacement, actions = self.spares.seat(self.nodes, node, self.attempts.number, spare)
            self.attempts.replaced += (replacement,)
            self._out += actions
        self._out += seated_specs(self.config, [node for node, _ in pairs])

    # -- the end of an attempt: the next one, or the verdict ------------------------------------------------------

    def _attempt_over(self) -> None:
        """Every node of the attempt is over. With ``--max_restarts`` the next attempt may begin (hot spares in
        lost nodes' places), or what follows wait for nodes and spares still joining; otherwise the job is over:
        its verdict is fixed and, to agents that wait for it, sent.

        ``--spares`` without ``--max_restarts`` (with ``--precheck``, issue 33): the attempt is recorded as with
        restarts (the spares ``--precheck`` seated, for the summary), and a node lost ends the job however many
        spares stand by: no restart, so no spare takes its place; the end line says so, and names the flag that
        would have let one. The spares still standing are told the verdict (each exits 0)."""
        restarts = self.config.restart.restarts
        if restarts or self.config.spares:
            faulty = self.nodes.faulty(rejoin=self.config.rejoins)
            if restarts and faulty and self._waits_for_joining(short=len(faulty) > len(self.spares.ready())):
                return  # decided once they joined (or stand by) or are lost, at the latest a tick
            ending = self.attempts.over(self.cause, self.barrier.started_at, self.now,
                                        lost=tuple(n.host for n in faulty), spares=len(self.spares.ready()))
            if ending is Ending.RESTART:
                self._begin_next_attempt(faulty)
                return
        self.all_over_at = self.now
        verdict = self.cause.fix(self.nodes, self.now)
        spares = self.spares.release()
        if self.config.verdict_to_nodes or restarts:  # agents that wait for a restart
            self._out.append(SendVerdict((*(n.agent for n in self.nodes if n.connected), *spares), verdict))
        elif spares:  # the nodes' agents leave after their done; the spares wait for the word
            self._out.append(SendVerdict(spares, verdict))

    def _waits_for_joining(self, *, short: bool) -> bool:
        """A failure to restart, within --join_timeout of the job's start, while nodes are still to join (they join
        the next attempt) or, ``short`` of spares, spares are still to stand by: what follows waits for them."""
        failure = self.cause.failure
        if failure is None or failure.final or self.cause.interrupted_by is not None or self.config.verdict_to_nodes:
            return False  # pod mode: its nodes that join late or come back are _pod_hello's
        if self.now >= self.attempts.t0 + self.config.join_timeout:
            return False
        return any(n.state is NodeState.WAITING for n in self.nodes) or (short and self.spares.joining())

    def _begin_next_attempt(self, faulty: list[Node]) -> None:
        """Hot spares on standby take the ``faulty`` nodes' places; every node is told to prepare the next attempt
        (a seated spare is sent its node's spec); a fresh root cause, no stop, and a new start barrier."""
        attempt = self.attempts.begin_next(self.now)
        self.attempts.replaced, seating = self.spares.seat_all(self.nodes, faulty, attempt)
        self._out += seating
        self._out += restart_actions(self.config, self.nodes, attempt, self.cause.failure, self.attempts.replaced)
        self.cause.next_attempt()
        self.stop.next_attempt()
        self.barrier = Barrier(self.config, self.nodes, t0=self.now, attempt=attempt, spares=self.spares)  # --precheck

    # -- pod mode: late nodes, and lost nodes that come back -------------------------------------------------

    def _pod_hello(self, node: Node, event: HelloReceived, refused: str | None) -> bool:
        """A hello the head-mode rules do not cover: a node back after its agent was lost, or one late for a job
        that is stopping (``refused``: the hello policy's reason, if it refused it). False: not one of those."""
        if self._comes_back(node):
            if refused is not None:  # its place stays open for a node that runs this job, until --join_timeout
                self._out += [ShowLine(f"{refused}: turned away"), TurnAway(event.conn)]
                return True
            if node.over or self.stopping:
                self._park(node, event)
                return True
            return False  # the next attempt's barrier is open: it joins as any node does
        if self.stopping and node.state is NodeState.WAITING:
            self._tell_late_node_the_end(node, event)
            return True
        return False

    def _comes_back(self, node: Node) -> bool:
        """A node other than node 0 whose agent was lost in an earlier attempt, or in this one, says hello again."""
        return self.config.rejoins and node.rank != 0 and not node.connected and (
            node.over or (node.state is NodeState.WAITING and self.attempts.number > 0))

    def _park(self, node: Node, event: HelloReceived) -> None:
        """Admitted, DONE and connected until the next attempt's restart (or the verdict, once fixed)."""
        self.nodes.join(node, event.addr, self.now, name=event.host if self.config.numbered else None)
        node.state = NodeState.DONE  # parked: connected, pinged, never counted live
        self._out.append(Admit(node.rank, event.conn))
        fixed = self.cause.fixed
        if fixed is not None:
            self._out.append(SendVerdict((node.rank,), fixed))
        else:
            self._say(f"node {node.rank} ({node.host}) is back: it joins the next attempt")

    def _tell_late_node_the_end(self, node: Node, event: HelloReceived) -> None:
        """A node that joins a job already ending is told how it ends (it must exit with that code)."""
        node.state, node.connected, node.last_seen = NodeState.JOINED, True, self.now
        self._out.append(Admit(node.rank, event.conn))
        if self.cause.fixed is not None:
            self._out.append(SendVerdict((node.rank,), self.cause.fixed))
            return
        reason = self.failure.reason if self.failure is not None else "the job is stopping"
        self._out.append(SendStop((node.rank,), int(signal.SIGTERM), self.config.shutdown_timeout, reason))

    # -- the steps the handlers share ---------------------------------------------------------------------

    def _fail(self, failure: Failure) -> None:
        self._out += self.stop.fail(failure, self.now)

    def _lose(self, node: Node, reason: str) -> None:
        why_not = self._why_groups_stay(node)
        if why_not is None:
            self._move_groups(node, f"lost node {node.host}: {reason}")
        else:
            self._out += self.stop.lose(node, reason + why_not, self.now)

    def _why_groups_stay(self, node: Node) -> str | None:
        """--replica_groups: None when the lost ``node``'s groups move to a hot spare (xrun.runner.job.groups); else
        what its loss's reason adds ("" without groups or spares, or before the start)."""
        if self.groups is None or not self.config.spares or self.stopping or self.barrier.started_at is None:
            return ""  # without --spares (pod mode has none) a lost node is what it is without groups
        return self.groups.why_stay(node)

    def _move_groups(self, node: Node, reason: str) -> None:
        assert self.groups is not None
        replacement, actions = self.groups.move(node, reason, self.attempts.number)
        self.attempts.replaced += (replacement,)
        self._out += actions

    def _say(self, text: str) -> None:
        self._out.append(ShowLine(text))


Job._HANDLERS = {
    HelloReceived: Job._hello,
    Ready: Job._ready,
    RankExited: Job._rank_exited,
    Done: Job._done,
    AgentError: Job._agent_error,
    Heard: Job._heard,
    GroupRestarted: Job._group_restarted,
    GroupFailed: Job._group_failed,
    GroupStopped: Job._group_stopped,
    ConnectionLost: Job._connection_lost,
    SessionEnded: Job._session_ended,
    SignalReceived: Job._signal,
    Hung: Job._hung,
    NodesFaulty: Job._nodes_faulty,
    Tick: Job._tick,
    PrecheckDone: Job._precheck_done,
}
