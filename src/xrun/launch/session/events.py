"""The node agent's state machine vocabulary (``xrun.launch.session.machine``): events in, actions out.

Every value here is a typed, immutable record of plain fields: no socket, no clock. They are ``NamedTuple``s rather
than frozen dataclasses (as ``xrun.channel.link.Credentials`` is, for the same reason): a class costs ~0.06 ms to
make against a frozen dataclass's ~0.4 ms, and these ~35 are on every node agent's start (issue 30 holds it to
within 15% of what it was). No ``from __future__ import annotations`` here: ``NamedTuple`` would compile every
string annotation into a ``ForwardRef``, which was half of this module's load. Being tuples, two records of
different types with equal fields compare equal: the machine dispatches on the type, never on equality, and its
tests compare types too. Events come from the runner (each message it sends, read by ``message_event``; the
connection lost), from this process (a shutdown signal, the preflight's outcome, an attempt's end, whether a final
word went out) and from time (``Tick``). Actions go to the driver (``xrun.launch.session.driver``): what to send,
run the preflight or an attempt, stop or signal the ranks, take their stacks, answer ``--precheck``'s probes, show a
line, and once, at the end, the exit code.

What the ranks say while they run (``started``, ``rank_exited``, their stacks, the hang doctor's words, pod mode's
console lines) is data, not a protocol step: the driver sends it as it comes, past the machine.
"""

import signal
from collections.abc import Mapping
from typing import Any, NamedTuple, Union

from xrun.channel import Kind, Message
from xrun.common.result.outcome import NODE_FAILURE_EXIT
from xrun.common.spec import NodeSpec
from xrun.errors import XrunError

# -- what the runner says -------------------------------------------------------------------------------------


class PortRule(NamedTuple):
    """How node 0 settles rank 0's port before it says ready (issue 17): with ``pick``, ``port`` where it is free,
    else a free one; without, a given ``port`` must be free here."""

    pick: bool
    port: int


class Spec(NamedTuple):
    """Head mode: this node's spec; ``standby`` for a hot spare's (``--spares``), whose second spec is the lost
    node's place it takes. ``port``: node 0's rule for rank 0's port (None: not this node's to settle)."""

    spec: NodeSpec
    standby: bool = False
    restarts: bool = False  # --max_restarts: an attempt's end is not the agent's
    port: PortRule | None = None


class SpecUnusable(NamedTuple):
    """A spec this agent cannot read (another xrun's format, a malformed field)."""

    problem: str
    exit_code: int = NODE_FAILURE_EXIT


class Accept(NamedTuple):
    """Pod mode: node 0 admitted this node's hello (the secret and the plan digest match)."""


class Waiting(NamedTuple):
    """Pod mode: the barrier's status, for this node's console."""

    ready: int
    missing: tuple[str, ...]
    elapsed: float


class Start(NamedTuple):
    """The barrier opened. None: not said (pod mode: the plan's master and port; a first attempt)."""

    master_addr: str | None
    master_port: int | None
    restart_count: int | None = None


class StopOrder(NamedTuple):
    """The runner's ``stop``: end this node's ranks with ``signum`` (the head's own stop is
    ``xrun.runner.job.stop.Stop``)."""

    signum: int
    reason: str
    stacks: bool = False  # another node failed first: take this node's stacks before the stop, for the report
    hung: bool = False  # --hang_action stop|restart: the job is hung (the stacks are the hang's dump's)


class Restart(NamedTuple):
    """--max_restarts: every node is over; the preflight again, then ready, for ``attempt``."""

    attempt: int | None
    port: PortRule | None = None


class JobEnded(NamedTuple):
    """The runner's ``verdict``: how the job ended (``xrun.runner.job.events.Verdict``, as a node hears it): pod
    mode's exit code for every node, the end of head mode's restarts. ``line``: the root cause as node 0 puts it,
    for every other node's console (pod mode)."""

    exit_code: int
    line: str | None = None


class Probe(NamedTuple):
    """``--precheck``'s ``probe_open`` or ``probe`` (xrun.launch.network.precheck_answers), handed on as it came."""

    message: Mapping[str, Any]


class Ping(NamedTuple):
    """The runner's ping; ``clock_ns``: this node's wall clock when it came, which the pong carries back (the
    runner's measure of the node's clock offset, for the straggler scores of issue 31)."""

    clock_ns: int | None = None


class Dump(NamedTuple):
    """The hang doctor: take every live rank's stack, answer with ``id``."""

    id: Any


class Signal(NamedTuple):
    """--forward_signals: pass ``signum`` on to every rank; the job goes on."""

    signum: int


class StopGroup(NamedTuple):
    """--replica_groups: stop this node's ranks of ``group``, a group across nodes (a rank of it failed elsewhere)."""

    group: int


class StartGroup(NamedTuple):
    """--replica_groups: every node's ranks of ``group`` are gone: start this node's again, its ``restart``-th
    (``master_addr``: where they meet from now on, a hot spare that took the group's leading node)."""

    group: int
    restart: int
    master_addr: str | None = None


class OtherMessage(NamedTuple):
    """A kind this agent does not act on (a newer runner's)."""

    kind: str


class LinkLost(NamedTuple):
    reason: str


# -- what happens here ----------------------------------------------------------------------------------------


class Shutdown(NamedTuple):
    """Pod mode: a shutdown signal to this xrun (SIGINT, SIGTERM, SIGHUP)."""

    signum: int


class PreflightPassed(NamedTuple):
    master_port: int | None = None  # node 0: the port rank 0 will use


class PreflightFailed(NamedTuple):
    """The node cannot start its ranks as asked (xrun.common.preflight's finding, a given ``--master_port`` taken):
    bad input, which the runner ends the job with, ``exit_code`` (2) on every node (issue 33 §2)."""

    reason: str
    exit_code: int


class AttemptEnded(NamedTuple):
    """This node's ranks are over; their stacks, if any, went to the runner already."""

    exit_code: int
    root_cause: int | None = None  # the rank that failed first
    interrupted_by: int | None = None


class Delivered(NamedTuple):
    """Whether the final word the machine last sent (``Send(..., final=True)``) reached the runner."""

    ok: bool


class Tick(NamedTuple):
    """Time passed (the machine's ``wake_at`` came)."""


Event = Union[Spec, SpecUnusable, Accept, Waiting, Start, StopOrder, Restart, JobEnded, Probe, Ping, Dump, Signal,
              StopGroup, StartGroup, OtherMessage, LinkLost, Shutdown, PreflightPassed, PreflightFailed, AttemptEnded,
              Delivered, Tick]

# -- actions --------------------------------------------------------------------------------------------------


class Send(NamedTuple):
    """A message to the runner. ``final``: this node's last word of an attempt or of its life (``done``,
    ``error``): the driver waits for it to go out and answers ``Delivered``."""

    message: Message
    final: bool = False


class Preflight(NamedTuple):
    """Before ready: enter the spec's working directory and check what must hold before its ranks start
    (xrun.common.preflight); ``port`` settles rank 0's port. Answered at once by ``PreflightPassed`` or
    ``PreflightFailed``."""

    spec: NodeSpec
    port: PortRule | None
    standby: bool = False  # a hot spare's check: nothing of the job starts here (node 0's Lighthouse)


class RunAttempt(NamedTuple):
    """Start the ranks of ``spec`` (its rendezvous filled in); ``AttemptEnded`` once they are over."""

    spec: NodeSpec


class StopRanks(NamedTuple):
    signum: int
    reason: str
    stacks: bool = False  # the survivors' stacks first (xrun.launch.doctor.node_doctor)
    hung: bool = False  # the head found the job hung: the ranks are stopped as hung (NodeDoctor.stop_hung)


class ForwardSignal(NamedTuple):
    signum: int


class OrderGroup(NamedTuple):
    """The head's word for a group across nodes, passed on to the rank group: its stop, or its start (xrun.launch
    .replicas.supervision)."""

    order: StopGroup | StartGroup


class TakeStacks(NamedTuple):
    """Answer the hang doctor's ``dump`` with ``stacks`` under ``id``."""

    id: Any


class AnswerProbe(NamedTuple):
    message: Mapping[str, Any]


class CloseProbes(NamedTuple):
    """The wait that answered probes is over: the probe server closes (if the runner opened one)."""


class ShowLine(NamedTuple):
    text: str


class ShowWaiting(NamedTuple):
    ready: int
    missing: tuple[str, ...]
    elapsed: float


class ShowStarted(NamedTuple):
    nodes: int
    ranks: int
    elapsed: float
    master_addr: str
    master_port: int


class JoinAgain(NamedTuple):
    """Pod mode: node 0 turned this node away without a word; say hello again (the machine starts over)."""


class Exit(NamedTuple):
    """The agent's end: its one exit code, and ``line``, why (None: the runner has said it)."""

    code: int
    line: str | None = None


Action = Union[Send, Preflight, RunAttempt, StopRanks, ForwardSignal, OrderGroup, TakeStacks, AnswerProbe, CloseProbes,
               ShowLine, ShowWaiting, ShowStarted, JoinAgain, Exit]

# -- a message as an event ------------------------------------------------------------------------------------


def message_event(msg: Message, *, clock_ns: int | None = None) -> Event:
    """What the runner's ``msg`` is to the machine (``clock_ns``: the wall clock when it came). Fields of the wrong
    type read as absent; a spec that cannot be read is ``SpecUnusable``."""
    kind = msg.get("type")
    if kind == Kind.PING.value:
        return Ping(clock_ns)
    if kind == Kind.SPEC.value:
        return _spec(msg)
    if kind == Kind.START.value:
        addr = msg.get("master_addr")
        return Start(str(addr) if addr is not None else None, _int(msg.get("master_port")) or None,
                     _int(msg.get("restart_count")))
    if kind == Kind.STOP.value:
        reason = str(msg.get("reason") or "the runner asked to stop")
        return StopOrder(_int(msg.get("signal")) or signal.SIGTERM, reason, stacks=bool(msg.get("stacks")),
                         hung=bool(msg.get("hung")))
    if kind == Kind.RESTART.value:
        return Restart(_int(msg.get("attempt")), port_rule(msg))
    if kind == Kind.VERDICT.value:
        code, line = _int(msg.get("exit_code")), msg.get("line")
        return JobEnded(NODE_FAILURE_EXIT if code is None else code, line if isinstance(line, str) else None)
    if kind in (Kind.PROBE_OPEN.value, Kind.PROBE.value):
        return Probe(msg)
    if kind == Kind.DUMP.value:
        return Dump(msg.get("id"))
    if kind == Kind.SIGNAL.value:
        signum = _int(msg.get("signal"))
        return Signal(signum) if signum is not None else OtherMessage(repr(kind))
    group = _int(msg.get("group"))
    if kind == Kind.STOP_GROUP.value and group is not None:
        return StopGroup(group)
    restart = _int(msg.get("restart"))
    if kind == Kind.START_GROUP.value and group is not None and restart is not None:
        master_addr = msg.get("master_addr")
        return StartGroup(group, restart, master_addr if isinstance(master_addr, str) and master_addr else None)
    if kind == Kind.ACCEPT.value:
        return Accept()
    if kind == Kind.WAITING.value:
        missing, elapsed = msg.get("missing"), msg.get("elapsed")
        return Waiting(_int(msg.get("ready")) or 0, tuple(str(h) for h in missing) if isinstance(missing, list) else (),
                       float(elapsed) if isinstance(elapsed, (int, float)) else 0.0)
    return OtherMessage(repr(kind))


def port_rule(msg: Message) -> PortRule | None:
    """Node 0's rule for rank 0's port as the runner says it (``pick_master_port``, ``master_port``); None where
    it says neither (every other node)."""
    pick, port = bool(msg.get("pick_master_port")), _int(msg.get("master_port")) or 0
    return PortRule(pick, port) if pick or port else None


def _spec(msg: Message) -> Spec | SpecUnusable:
    try:
        spec = NodeSpec.from_json(msg["spec"])  # KeyError, or a non-object: caught below
    except XrunError as err:  # another xrun's spec version
        return SpecUnusable(str(err), err.exit_code)
    except (LookupError, TypeError, ValueError, AttributeError) as err:
        return SpecUnusable(f"{err.__class__.__name__}: {err}")
    return Spec(spec, standby=bool(msg.get("standby")), restarts=bool(msg.get("max_restarts")), port=port_rule(msg))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
