"""The head's job state machine: pure, events in, actions out, and at the end the job's verdict.

It holds no socket, reads no clock and prints nothing: ``xrun.runner.job.server`` turns what arrives (agents'
messages, dropped connections, backend sessions that end, signals, time passing) into the events of
``xrun.runner.job.events``, feeds each with the current ``monotonic()`` time, and carries out the actions that
come back.

A node goes WAITING -> JOINED (its hello admitted) -> READY (its agent is ready) -> RUNNING (told to start) and
ends DONE or LOST. A static job holds every node at a start barrier until all are ready, or until
``--join_timeout`` passes, naming the missing hosts; ``--elastic`` starts each node as soon as it is ready (torch's
rendezvous is the barrier) and leaves a lost node to torch while at least ``--min_nodes`` remain (issue 6).
The first failure (a rank's own exit, an agent error, a lost node, a session that ended before its agent
connected, or ``Hung``: every node silent for --hang_timeout with --hang_action stop, exit code HANG_EXIT) is the
root cause and stops every other node; SIGINT/SIGTERM/SIGHUP stop every node gracefully, a
second SIGINT with SIGKILL. A node that neither finishes nor answers by the stop deadline counts as lost.

What a hello gets back is a ``HelloPolicy``: the head sends each node its spec (``SendSpecs``); a policy may
instead refuse a node (pod mode compares plan digests: ``xrun.runner.pod.hello``), which ends the job with exit
code 2, or find it a ``Stray`` (a wrong key), turned away without a word before it is admitted. With
``JobConfig.verdict_to_nodes`` (pod mode) the verdict, once fixed, is also sent to every node still connected.

The job's exit code is decided in one place, ``_exit_code``, through ``Job._decide`` once every node is over;
``Job.verdict`` then stays the same whatever arrives during the last linger.
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from xrun import __version__
from xrun.channel import DEAD_AFTER, PING_INTERVAL
from xrun.launch.procs.posix import signal_name
from xrun.launch.result.outcome import HANG_EXIT
from xrun.runner.job.events import (
    AGENT_EVENTS,
    Action,
    Admit,
    AgentError,
    ConnectionLost,
    Done,
    Drop,
    Event,
    Failure,
    Heard,
    HelloReceived,
    Hung,
    RankExited,
    Ready,
    SendPing,
    SendSpec,
    SendStart,
    SendStop,
    SendVerdict,
    SessionEnded,
    ShowJoined,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    SignalReceived,
    Tick,
    TurnAway,
    Verdict,
)

if TYPE_CHECKING:
    from xrun.runner.plan import Plan

LINGER = 3.0  # after every agent is done: time for the sessions to deliver the last output and exit
STOP_GRACE = 5.0  # beyond the agents' own shutdown deadline before a node counts as not stopping
STATUS_EVERY = 1.0  # the waiting-for-nodes status while the barrier holds
NODE_FAILURE_EXIT = 1  # lost node, join timeout, agent error: no rank exit code to pass on
REFUSED_EXIT = 2  # a node the hello policy refused: the job was started inconsistently (a usage error)


class NodeState(enum.Enum):
    WAITING = "waiting"
    JOINED = "joined"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    LOST = "lost"


_UP = (NodeState.READY, NodeState.RUNNING)  # running too: an elastic node starts as soon as it is ready
_OVER = (NodeState.DONE, NodeState.LOST)


@dataclass(frozen=True)
class ElasticRule:
    """--elastic: no barrier; the endpoint is the plan's (every node must know it before node 0 is up)."""

    min_nodes: int
    master_addr: str


@dataclass(frozen=True)
class JobConfig:
    hosts: tuple[str, ...]  # by node rank
    join_timeout: float
    shutdown_timeout: float  # the agents' own deadline to stop their ranks, sent with every stop
    world_size: int
    master_addr: str | None = None  # --master_addr; None: node 0's address as its agent saw it
    master_port: int = 0  # 0: node 0's agent picks a free one before the barrier
    pick_master_port: bool = False  # master_port is node 0's first try; its agent reports the port it will use
    elastic: ElasticRule | None = None
    verdict_to_nodes: bool = False  # pod mode: every node exits with the job's code, so it must be told

    @classmethod
    def from_plan(cls, plan: Plan, *, join_timeout: float) -> JobConfig:
        elastic = plan.nodes[0].elastic if plan.nodes else None
        return cls(
            hosts=tuple(node.host for node in plan.nodes),
            join_timeout=join_timeout,
            shutdown_timeout=plan.request.options.shutdown_timeout,
            world_size=plan.world_size,
            master_addr=plan.request.master_addr,
            master_port=plan.rendezvous.master_port,
            pick_master_port=plan.node0_picks_port,
            elastic=None if elastic is None else ElasticRule(elastic.min_nodes or 1, plan.rendezvous.master_addr),
        )


@dataclass(frozen=True)
class Refusal:
    """A hello policy's no: the job ends with ``REFUSED_EXIT``; ``reason`` names the node and why."""

    reason: str


@dataclass(frozen=True)
class Stray:
    """A hello policy's "not one of ours" (a wrong key): closed without a word, counted, never admitted."""


class HelloPolicy(Protocol):
    def answer(self, hello: HelloReceived) -> Action | Refusal | Stray:
        """What an admitted node is sent first, why it is refused, or that it is a stray."""


@dataclass(frozen=True)
class SendSpecs:
    """Head mode: every node gets its spec; node 0 checks rank 0's port (``master_port``) or picks one."""

    pick_master_port: bool
    master_port: int = 0  # node 0's port to check, or its first try when picking

    def answer(self, hello: HelloReceived) -> Action | Refusal | Stray:
        node0 = hello.node == 0
        return SendSpec(hello.node, pick_master_port=self.pick_master_port and node0,
                        master_port=self.master_port if node0 else 0)


def reachable(addr: str | None, host: str, nodes: int) -> str:
    """Node 0's address as its agent saw it on the route to the head; loopback only helps a one-node job."""
    if addr is None or (nodes > 1 and (addr.startswith("127.") or addr == "::1")):
        return host
    return addr


class _Tally:
    """How many nodes are in each state and how many are live (connected, not over), kept as nodes change.

    The rules read these counts after every message; scanning every node instead made the start barrier and a
    stop quadratic in the nodes (10,000 simulated agents took minutes to join: issue 15).
    """

    def __init__(self, nodes: int) -> None:
        self.states = dict.fromkeys(NodeState, 0)
        self.states[NodeState.WAITING] = nodes
        self.live = 0

    def count(self, states: tuple[NodeState, ...]) -> int:
        return sum(self.states[state] for state in states)

    def moved(self, old: tuple[NodeState, bool], new: tuple[NodeState, bool]) -> None:
        """One node went from (state, connected) ``old`` to ``new``."""
        self.states[old[0]] -= 1
        self.states[new[0]] += 1
        self.live += _live(*new) - _live(*old)


def _live(state: NodeState, connected: bool) -> int:
    return int(connected and state not in _OVER)


class _Node:
    """One node as the job sees it; ``state`` and ``connected`` keep the nodes' ``_Tally`` up to date."""

    __slots__ = ("rank", "host", "addr", "master_port", "exit_code", "last_seen", "_state", "_connected", "_tally")

    def __init__(self, rank: int, host: str, tally: _Tally) -> None:
        self.rank = rank
        self.host = host
        self.addr: str | None = None
        self.master_port: int | None = None
        self.exit_code: int | None = None
        self.last_seen = 0.0
        self._state = NodeState.WAITING
        self._connected = False
        self._tally = tally

    @property
    def state(self) -> NodeState:
        return self._state

    @state.setter
    def state(self, value: NodeState) -> None:
        self._tally.moved((self._state, self._connected), (value, self._connected))
        self._state = value

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        self._tally.moved((self._state, self._connected), (self._state, value))
        self._connected = value

    @property
    def over(self) -> bool:
        return self._state in _OVER


class _Nodes(list[_Node]):
    """The nodes by node rank, and the counts the rules read (from the tally: no scan per message)."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        self.tally = _Tally(len(hosts))
        super().__init__(_Node(rank, host, self.tally) for rank, host in enumerate(hosts))
        self.by_host: dict[str, list[_Node]] = {}
        for node in self:
            self.by_host.setdefault(node.host, []).append(node)

    def up(self) -> int:
        return self.tally.count(_UP)

    def running(self) -> int:
        return self.tally.states[NodeState.RUNNING]

    def missing(self) -> list[str]:
        """A scan: for the status line and the join timeout only."""
        return [n.host for n in self if n.state not in _UP]

    def left(self) -> int:
        """Still running, or may still join."""
        return len(self) - self.tally.count(_OVER)

    def reachable(self) -> tuple[int, ...]:
        """A scan: once per start, stop and ping round, not per message."""
        return tuple(n.rank for n in self if n.connected and not n.over)

    def all_over(self, *, stopping: bool) -> bool:
        """Nothing more to hear: once stopping, a node whose agent never connected will not."""
        return self.tally.live == 0 if stopping else self.tally.count(_OVER) == len(self)


class Job:
    """One run's nodes, from the first hello to the verdict. ``handle`` is the only way in."""

    _HANDLERS: ClassVar[dict[type, Callable[[Job, Any], None]]]  # filled in below the class

    def __init__(self, config: JobConfig, *, now: float, policy: HelloPolicy | None = None) -> None:
        self.config = config
        picks = config.pick_master_port or config.master_port == 0
        self.policy = policy if policy is not None else SendSpecs(picks, 0 if config.elastic else config.master_port)
        self.nodes = _Nodes(config.hosts)
        self.t0 = now
        self.now = now
        self.failure: Failure | None = None
        self.failure_at: float | None = None
        self.interrupted_by: int | None = None
        self.sigints = 0
        self.stopping = False
        self.started_at: float | None = None
        self.stop_deadline: float | None = None
        self.all_over_at: float | None = None
        self.next_ping = now
        self.next_status = now
        self._verdict: Verdict | None = None
        self._out: list[Action] = []
        self.strays = 0  # hellos the policy turned away

    # -- the interface --------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at time ``now``; return what to do about it, in order."""
        self.now = now
        if isinstance(event, AGENT_EVENTS):
            node = self.nodes[event.node]
            if not node.connected:
                return []  # the socket layer sends none; a late one from a dropped connection changes nothing
            node.last_seen = now
        self._HANDLERS[type(event)](self, event)
        if self.all_over_at is None and self.nodes.all_over(stopping=self.stopping):
            self.all_over_at = now
            self._verdict = self._decide()
            if self.config.verdict_to_nodes:
                self._out.append(SendVerdict(tuple(n.rank for n in self.nodes if n.connected), self._verdict))
        out, self._out = self._out, []
        return out

    def next_deadline(self) -> float:
        """When a ``Tick`` is next due, at the latest."""
        deadlines = [self.next_ping]
        if self._waiting_for_start():
            deadlines += [self.next_status, self.t0 + self.config.join_timeout]
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if self.all_over_at is not None:
            deadlines.append(self.all_over_at + LINGER)
        return min(deadlines)

    def linger_over(self, now: float) -> bool:
        """Every node is over and the sessions had their time to deliver the last output."""
        return self.all_over_at is not None and now >= self.all_over_at + LINGER

    def lost_hosts(self) -> set[str]:
        return {n.host for n in self.nodes if n.state is NodeState.LOST}

    def state(self, node: int) -> NodeState:
        return self.nodes[node].state

    def verdict(self) -> Verdict:
        return self._verdict if self._verdict is not None else self._decide()

    # -- what the agents say --------------------------------------------------------------------------------

    def _hello(self, event: HelloReceived) -> None:
        answer = self.policy.answer(event)
        if isinstance(answer, Stray):
            self.strays += 1
            self._out.append(TurnAway(event.conn))
            return
        node = self.nodes[event.node]
        if self.stopping and node.state is NodeState.WAITING and self.config.verdict_to_nodes:
            self._late(node, event)
            return
        if node.state is not NodeState.WAITING or self.stopping:
            self._say(f"ignored a second agent for node {node.rank} ({node.host}) from {event.peer}")
            self._out.append(TurnAway(event.conn))
            return
        node.state, node.connected, node.addr, node.last_seen = NodeState.JOINED, True, event.addr, self.now
        self._out.append(Admit(node.rank, event.conn))
        if event.xrun_version != __version__:
            self._say(f"{node.host} runs xrun {event.xrun_version}, this is {__version__}")
        if isinstance(answer, Refusal):
            self._fail(Failure(node.host, answer.reason, REFUSED_EXIT))
        else:
            self._out.append(answer)

    def _late(self, node: _Node, event: HelloReceived) -> None:
        """Pod mode: a node that joins a job already ending is told how it ends (it must exit with that code)."""
        node.state, node.connected, node.last_seen = NodeState.JOINED, True, self.now
        self._out.append(Admit(node.rank, event.conn))
        if self._verdict is not None:
            self._out.append(SendVerdict((node.rank,), self._verdict))
        else:
            reason = self.failure.reason if self.failure is not None else "the job is stopping"
            self._out.append(SendStop((node.rank,), int(signal.SIGTERM), self.config.shutdown_timeout, reason))

    def _ready(self, event: Ready) -> None:
        node = self.nodes[event.node]
        node.state, node.master_port = NodeState.READY, event.master_port
        self._out.append(ShowJoined(node.host, self.nodes.up(), len(self.nodes)))
        if self.stopping:
            return
        if self.config.elastic is not None:
            self._start_elastic(node, self.config.elastic)
        elif self.nodes.up() == len(self.nodes):
            self._start_all()

    def _rank_exited(self, event: RankExited) -> None:
        if event.stopped or (event.code == 0 and event.signal is None):
            return
        if event.signal is not None:
            code, how = 128 + event.signal, f"was killed by {signal_name(event.signal)}"
        else:
            code, how = NODE_FAILURE_EXIT if event.code is None else event.code, f"exited with code {event.code}"
        host = self.nodes[event.node].host
        reason = f"rank {event.rank} (local {event.local_rank}) on {host} {how}"
        self._fail(Failure(host, reason, code, rank=event.rank, tail=event.tail))

    def _done(self, event: Done) -> None:
        node = self.nodes[event.node]
        node.state, node.exit_code = NodeState.DONE, event.exit_code
        if event.exit_code != 0 and not self.stopping:
            self._fail(Failure(node.host, f"agent on {node.host} exited with code {event.exit_code}", event.exit_code))

    def _agent_error(self, event: AgentError) -> None:
        node = self.nodes[event.node]
        # name the host once: an error that names it already (a busy --master_port "in use on node1") stands alone
        named = re.search(rf"(?<![\w.-]){re.escape(node.host)}(?![\w.-])", event.message)
        reason = event.message if named else f"agent on {node.host}: {event.message}"
        self._fail(Failure(node.host, reason, event.exit_code))
        node.state = NodeState.LOST  # it said why it ends: its connection closing next is no news

    def _heard(self, event: Heard) -> None:
        pass  # handle() noted the time

    def _connection_lost(self, event: ConnectionLost) -> None:
        node = self.nodes[event.node]
        node.connected = False
        if not node.over:
            self._lose(node, f"its agent's connection dropped ({event.reason})")

    # -- what happens around them ---------------------------------------------------------------------------

    def _session_ended(self, event: SessionEnded) -> None:
        for node in self.nodes if event.host is None else self.nodes.by_host.get(event.host, []):
            if node.over or node.connected:
                continue  # a connected node's own connection tells how it ended
            node.state = NodeState.LOST
            if self.stopping:
                continue
            what = f"exited with code {event.code}" if event.code is not None else "ended"
            why = f"the session to {node.host} {what} before its agent connected"
            hint = f" ({event.detail})" if event.detail else " (see its output above)"
            if self._elastic_survivable():
                self._say(f"{why}{hint}; the elastic job goes on without it")
            else:
                self._fail(Failure(node.host, why + hint, event.code or NODE_FAILURE_EXIT))

    def _signal(self, event: SignalReceived) -> None:
        if event.signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints > 1:  # second Ctrl-C: do not wait for the graceful deadline
                self._stop(signal.SIGKILL, "second SIGINT")
                return
        if self.interrupted_by is None:
            self.interrupted_by = event.signum
        name = signal_name(event.signum)
        self._say(f"got {name}; stopping every node")
        self._stop(signal.SIGTERM, f"xrun got {name}")

    def _hung(self, event: Hung) -> None:
        self._fail(Failure("every node", event.reason, HANG_EXIT))

    def _tick(self, event: Tick) -> None:
        self._keepalive()
        if self._waiting_for_start():
            self._watch_join()
        if self.stop_deadline is not None and self.now >= self.stop_deadline:
            for node in self.nodes:
                if not node.over:
                    self._mark_lost(node, "did not stop before the deadline")

    def _keepalive(self) -> None:
        if self.now < self.next_ping:
            return
        self.next_ping = self.now + PING_INTERVAL
        alive = []
        for node in self.nodes:
            if not node.connected or node.over:
                continue
            if self.now - node.last_seen > DEAD_AFTER:
                self._lose(node, f"no word from its agent for {DEAD_AFTER:g} s (network cut or node down?)")
            else:
                alive.append(node.rank)
        if alive:
            self._out.append(SendPing(tuple(alive)))

    def _watch_join(self) -> None:
        if self.now - self.t0 >= self.config.join_timeout:
            missing = self.nodes.missing()
            timeout = f"not ready within --join_timeout {self.config.join_timeout:g} s: {', '.join(missing)}"
            self._fail(Failure(", ".join(missing), timeout, NODE_FAILURE_EXIT))
        elif self.now >= self.next_status:  # every tick comes here: the scan only once per status line
            self.next_status = self.now + STATUS_EVERY
            self._out.append(ShowWaiting(self.nodes.up(), tuple(self.nodes.missing()), self.now - self.t0))

    # -- the job --------------------------------------------------------------------------------------------

    def _start_all(self) -> None:
        node0 = self.nodes[0]
        master_addr = self.config.master_addr or reachable(node0.addr, node0.host, len(self.nodes))
        picked = self.config.pick_master_port or not self.config.master_port
        master_port = node0.master_port if picked and node0.master_port else self.config.master_port
        self.started_at = self.now
        elapsed = self.now - self.t0
        self._out.append(ShowStarted(len(self.nodes), self.config.world_size, elapsed, master_addr, master_port))
        for node in self.nodes:
            node.state = NodeState.RUNNING
        self._out.append(SendStart(self.nodes.reachable(), master_addr, master_port))

    def _start_elastic(self, node: _Node, rule: ElasticRule) -> None:
        node.state = NodeState.RUNNING
        self._out.append(SendStart((node.rank,), rule.master_addr, self.config.master_port))
        started = self.nodes.running()
        if self.started_at is None and started >= rule.min_nodes:
            self.started_at = self.now
        self._say(f"{node.host} up after {self.now - self.t0:.1f} s: its elastic agent joins the rendezvous "
                  f"({started}/{len(self.nodes)} nodes up, --min_nodes {rule.min_nodes})")

    def _fail(self, failure: Failure) -> None:
        if self.failure is None and self.interrupted_by is None:  # the first one is the root cause
            self.failure, self.failure_at = failure, self.now
        self._stop(signal.SIGTERM, failure.reason)

    def _lose(self, node: _Node, reason: str) -> None:
        self._mark_lost(node, reason)
        if self._elastic_survivable():
            left = self.nodes.left()
            self._say(f"lost node {node.host}: {reason}; {left} node(s) left, they re-rendezvous without it")
        elif not self.stopping or self.failure is None:
            self._fail(Failure(node.host, f"lost node {node.host}: {reason}", NODE_FAILURE_EXIT))

    def _mark_lost(self, node: _Node, reason: str) -> None:
        if node.state is NodeState.DONE:
            return
        node.state = NodeState.LOST
        if self.stopping:
            self._say(f"{node.host}: {reason}")
        if node.connected:
            node.connected = False
            self._out.append(Drop(node.rank))

    def _stop(self, signum: int, reason: str) -> None:
        first = not self.stopping
        self.stopping = True
        if first or signum == signal.SIGKILL:
            deadline = self.config.shutdown_timeout
            self.stop_deadline = self.now + deadline + STOP_GRACE
            targets = self.nodes.reachable()
            if targets:
                self._out.append(SendStop(targets, int(signum), deadline, reason))

    def _decide(self) -> Verdict:
        """The job's exit code and its root cause: the one place either is decided."""
        stopped_after = None
        if self.failure_at is not None and self.all_over_at is not None:
            stopped_after = self.all_over_at - self.failure_at
        code = _exit_code(self.nodes, self.failure, self.interrupted_by, elastic=self.config.elastic is not None)
        return Verdict(code, self.failure, self.interrupted_by, stopped_after)

    def _waiting_for_start(self) -> bool:
        return self.started_at is None and not self.stopping

    def _elastic_survivable(self) -> bool:
        """--elastic: enough nodes are still running or may still join for torch to carry on."""
        rule = self.config.elastic
        return rule is not None and not self.stopping and self.nodes.left() >= rule.min_nodes

    def _say(self, text: str) -> None:
        self._out.append(ShowLine(text))


def _exit_code(nodes: _Nodes, failure: Failure | None, interrupted_by: int | None, *, elastic: bool) -> int:
    """The signal that stopped the job, else the root cause's code, else what the nodes finished with."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    if failure is not None:
        return failure.exit_code or NODE_FAILURE_EXIT
    done = [n.exit_code or 0 for n in nodes if n.state is NodeState.DONE]
    if elastic and done:
        return max(done)  # a lost node was torch's to handle
    if any(n.state is NodeState.LOST for n in nodes):
        return NODE_FAILURE_EXIT
    return max((n.exit_code or 0 for n in nodes), default=0)


Job._HANDLERS = {
    HelloReceived: Job._hello,
    Ready: Job._ready,
    RankExited: Job._rank_exited,
    Done: Job._done,
    AgentError: Job._agent_error,
    Heard: Job._heard,
    ConnectionLost: Job._connection_lost,
    SessionEnded: Job._session_ended,
    SignalReceived: Job._signal,
    Hung: Job._hung,
    Tick: Job._tick,
}
