"""The node agent's state machine: the agent's half of the control channel's protocol, pure.

``AgentMachine.handle(event, now)`` takes one event (``xrun.launch.session.events``) and returns the actions it
calls for; once the agent is over, ``exit_code`` is set, once, and never changes. It holds no socket, thread,
clock or process: the driver (``xrun.launch.session.driver``) reads the runner, the ranks and the clock, feeds the
events in and carries the actions out. The head's ``Job`` (``xrun.runner.job.machine``) is its other end.

One agent's life, by phase (head mode: the runner sent the spec; pod mode: every node runs its own command line,
node 0's xrun plays the runner's part)::

    HELLO      head: the spec -> preflight (a hot spare's: STANDBY after it)     pod: accept -> preflight
    PREFLIGHT  passed: ready (node 0: rank 0's port) -> BARRIER                  failed: error (head: the end)
    STANDBY    a spare, ready: a lost node's spec -> preflight as that node; the verdict or a stop: exit 0
    BARRIER    start -> RUNNING; stop -> done(128+signal): the end, or (restarts, pod) BETWEEN
    RUNNING    the ranks run: stop, a forwarded signal, dump reach them; the attempt's end -> done ->
               the end, or (restarts, pod) BETWEEN
    BETWEEN    restart -> preflight again (pod: accept too);  the verdict -> the end
    LEAVING    a final word (done, error) is going out: once it did or not, the exit (``engine_exit_code``)

Pings are answered in every phase; ``--precheck``'s probes while a node or spare waits at the barrier. While the
preflight runs (it may wait minutes for ``--preload``'s imports: the driver answers it once they are in) or the
ranks run, what is not theirs waits (``_deferred``) and is taken up after, in order: an early verdict is not lost, a
stale stop stays stale. Losing the runner ends a preflight at once.

Pod mode adds its console (the barrier's status, the started line, the verdict's line on every node but node 0),
this xrun's own shutdown signals (``_shutdown``), and a join that node 0 turned away without a word (``JoinAgain``,
with --max_restarts, until --join_timeout). Losing the runner ends the agent, its ranks stopped first.
"""

from __future__ import annotations

import enum
import math
import signal
from typing import TYPE_CHECKING, Any, Callable

from xrun.channel import Kind, message
from xrun.common.result.outcome import NODE_FAILURE_EXIT
from xrun.common.spec import NodeSpec, with_rendezvous
from xrun.launch.session.events import (
    Accept,
    Action,
    AnswerProbe,
    AttemptEnded,
    CloseProbes,
    Delivered,
    Dump,
    Event,
    Exit,
    ForwardSignal,
    JobEnded,
    JoinAgain,
    LinkLost,
    OrderGroup,
    OtherMessage,
    Ping,
    Preflight,
    PreflightFailed,
    PreflightPassed,
    Probe,
    Restart,
    RunAttempt,
    Send,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    Shutdown,
    Signal,
    Spec,
    SpecUnusable,
    Start,
    StartGroup,
    StopGroup,
    StopOrder,
    StopRanks,
    TakeStacks,
    Tick,
    Waiting,
)

if TYPE_CHECKING:
    from xrun.launch.session.pod import PodNode

REFUSED = "node 0 closed the channel without answering: this node's hello was refused (or the job had just ended)"
TURNED_AWAY = ("node 0 turned this node away without a word (its old connection may still be open there); saying "
               "hello again until --join_timeout")
NOT_ACCEPTED = ("the runner did not accept this agent ({}): the job was already ending, another agent holds this "
                "node's place, or the token is stale or wrong")
FROM_RUNNER = (Spec, SpecUnusable, Accept, Waiting, Start, StopOrder, Restart, JobEnded, Probe, Ping, Dump, Signal,
               StopGroup, StartGroup, OtherMessage)
KIND = {Accept: Kind.ACCEPT, Waiting: Kind.WAITING, Start: Kind.START, StopOrder: Kind.STOP, Restart: Kind.RESTART,
        JobEnded: Kind.VERDICT, Ping: Kind.PING, Dump: Kind.DUMP, Signal: Kind.SIGNAL, StopGroup: Kind.STOP_GROUP,
        StartGroup: Kind.START_GROUP}


class Phase(enum.Enum):
    HELLO = "hello"
    PREFLIGHT = "preflight"
    STANDBY = "standby"
    BARRIER = "barrier"
    RUNNING = "running"
    BETWEEN = "between"
    LEAVING = "leaving"
    OVER = "over"


# The driver's answers to the machine's own actions and the clock: never kept for later (each handler knows whether
# it is still its time). What the running ranks act on; what a preflight that waits (for the preload helper's
# imports, which may take minutes) acts on. Anything else waits while the preflight or the ranks run.
_ANSWERS = (PreflightPassed, PreflightFailed, AttemptEnded, Delivered, Tick)
_RUNNING_OWN = (StopOrder, Signal, Dump, Ping, LinkLost, Shutdown, StopGroup, StartGroup)
_PREFLIGHT_OWN = (Ping, LinkLost)


def engine_exit_code(code: int, *, delivered: bool) -> int:
    """What an agent started by an engine (mpirun, hydra, srun) exits with: 0 once its last word reached the
    runner.

    The runner decides the job's exit code from the channel and has already stopped every other node; a non-zero
    exit would only set off the engine's own abort, and OpenMPI's sends SIGCONT, sleeps 1 s, SIGTERM, sleeps 1 s,
    SIGKILL to the agent even when it is already gone (``odls_base_sigkill_timeout``, strace of mpirun 4.1):
    2.2 s before mpirun exits, against 0.1 s. When the channel was lost the code stands: then the engine's
    abort is the second line of teardown.
    """
    return 0 if delivered else code


def lost_line(pod: PodNode, reason: str) -> str:
    return (f"lost node 0 ({pod.node0.host}), which hosts the job's control channel: {reason}; this node's ranks are "
            f"stopped (exit code {NODE_FAILURE_EXIT})")


class AgentMachine:
    """One agent's protocol (see the module doc). ``engine``: started by mpirun, hydra or srun, whose exit code
    rule is ``engine_exit_code``. ``pod``: pod mode's node; ``join_deadline``: when it stops saying hello again."""

    def __init__(self, *, engine: bool = False, pod: PodNode | None = None, join_deadline: float = math.inf) -> None:
        self.engine = engine
        self.pod = pod
        self.join_deadline = join_deadline
        self.phase = Phase.HELLO
        self.exit_code: int | None = None  # set once, when the agent is over
        self.spec: NodeSpec | None = pod.spec if pod is not None else None
        self.restarts = pod.restarts if pod is not None else False
        self.standby = False  # the preflight running is a spare's
        self.code = 0  # the last attempt's own exit code (or its stop's at the barrier)
        self.attempt: int | None = None  # the restart's number, for a start that does not say it
        self.delivered = False  # the runner has this agent's last final word
        self.heard = False  # the runner said something on this connection (pod mode: else a turn-away)
        self._told_turned_away = False
        self._deferred: list[Event] = []
        self._lost: str | None = None  # the link, lost while the ranks ran: the end once they are over
        self._signalled: int | None = None  # pod mode: this xrun's signal while the ranks ran
        self._leaving: tuple[int, str | None] = (0, None)  # LEAVING: the exit once the final word went out
        self._round_began = 0.0  # pod mode: the accept or restart, for the started line
        self._verdict_due: float | None = None  # pod mode: this node failed; node 0's verdict is due by then
        self._now = 0.0
        self._out: list[Action] = []

    # -- the surface ------------------------------------------------------------------------------------------

    def handle(self, event: Event, now: float) -> list[Action]:
        """The actions ``event`` calls for (none once the agent is over)."""
        self._now, self._out = now, []
        self._dispatch(event)
        return self._out

    @property
    def wake_at(self) -> float | None:
        """When the machine wants a ``Tick`` (the driver's clock), if ever."""
        return self._verdict_due if self.phase is Phase.BETWEEN else None

    # -- dispatch ---------------------------------------------------------------------------------------------

    def _dispatch(self, event: Event) -> None:
        if self.phase is Phase.OVER:
            return
        if isinstance(event, FROM_RUNNER):
            self.heard = True
            if self.pod is None and self.phase is Phase.HELLO and not isinstance(event, (Spec, SpecUnusable)):
                self._exit(NODE_FAILURE_EXIT, f"expected the node spec, got {_kind(event)}")
                return
        if self.phase is Phase.LEAVING and not isinstance(event, Delivered):
            return  # the end is decided; only whether the final word went out is still news
        if not isinstance(event, _ANSWERS) and (
                (self.phase is Phase.PREFLIGHT and not isinstance(event, _PREFLIGHT_OWN))
                or (self.phase is Phase.RUNNING and not isinstance(event, _RUNNING_OWN))):
            self._deferred.append(event)
            return
        _HANDLERS[type(event)](self, event)

    def _take_up_deferred(self) -> None:
        waiting, self._deferred = self._deferred, []
        for event in waiting:
            self._dispatch(event)

    # -- from the runner --------------------------------------------------------------------------------------

    def _on_spec(self, event: Spec) -> None:
        if self.pod is not None or self.phase not in (Phase.HELLO, Phase.STANDBY):
            return  # pod mode sends no spec; head mode only the first and a spare's place
        if self.phase is Phase.STANDBY and event.standby:
            return
        self.spec, self.restarts, self.standby = event.spec, event.restarts, event.standby
        self._preflight(Preflight(event.spec, None if event.standby else event.port, event.standby))

    def _on_spec_unusable(self, event: SpecUnusable) -> None:
        if self.pod is None and self.phase in (Phase.HELLO, Phase.STANDBY):
            said = f"cannot use the node spec: {event.problem}"
            self._final(message(Kind.ERROR, message=said, exit_code=None))
            self._leave(event.exit_code, said)

    def _on_accept(self, event: Accept) -> None:
        if self.pod is not None:
            self._round(Preflight(self.pod.spec, self.pod.ready_port))

    def _on_restart(self, event: Restart) -> None:
        if self.spec is None or (self.pod is None and self.phase is not Phase.BETWEEN):
            return  # head mode: only after an attempt (a stale one is ignored)
        self.attempt = event.attempt
        if self.pod is not None and self.pod.node_rank != 0:  # node 0's server says it there
            self._out.append(ShowLine(f"node 0 restarts the job on every node: attempt {event.attempt}"))
        self._round(Preflight(self.spec, event.port))

    def _on_waiting(self, event: Waiting) -> None:
        if self.pod is not None:
            self._out.append(ShowWaiting(event.ready, event.missing, event.elapsed))

    def _on_start(self, event: Start) -> None:
        if self.phase is not Phase.BARRIER or self.spec is None:
            return  # pod mode: this attempt was declined here meanwhile (a signal); else a stale start
        count = event.restart_count if event.restart_count is not None else self.attempt or 0
        pod = self.pod
        if pod is None:
            if event.master_addr is None or event.master_port is None:
                self._exit(NODE_FAILURE_EXIT, "the runner's start named no master address and port")
                return
            spec = with_rendezvous(self.spec, event.master_addr, event.master_port, count)
        else:
            port = event.master_port or pod.master_port  # node 0's pick, else the plan's
            self._out.append(ShowStarted(pod.num_nodes, pod.world_size, self._now - self._round_began, pod.master_addr,
                                   port))
            spec = self.spec
            if spec.elastic is None and (port != pod.master_port or count):
                spec = with_rendezvous(spec, pod.master_addr, port, count)
        self._to(Phase.RUNNING)
        self._lost = self._signalled = None
        self._out.append(RunAttempt(spec))

    def _on_stop(self, event: StopOrder) -> None:
        if self.phase is Phase.RUNNING:
            self._out.append(StopRanks(event.signum, event.reason, event.stacks, event.hung))
        elif self.phase is Phase.STANDBY:
            self._told_to_leave(0)  # the job ended without this spare
        elif self.phase is Phase.BARRIER or (self.pod is not None and self.phase is Phase.HELLO):
            self._done_here(128 + event.signum)  # refused, or another node failed or was lost first
        # BETWEEN: stale (sent to every node after this one's failure)

    def _on_verdict(self, event: JobEnded) -> None:
        pod = self.pod
        if pod is not None:
            self._exit(event.exit_code, event.line if pod.node_rank != 0 else None)  # node 0's server reports
        elif self.phase is Phase.STANDBY:
            self._told_to_leave(0)
        elif self.phase is Phase.BETWEEN:
            self._told_to_leave(self.code)

    def _on_probe(self, event: Probe) -> None:
        if self.phase in (Phase.BARRIER, Phase.STANDBY):
            self._out.append(AnswerProbe(event.message))

    def _on_ping(self, event: Ping) -> None:
        clock = {} if event.clock_ns is None else {"clock_ns": event.clock_ns}
        self._out.append(Send(message(Kind.PONG, **clock)))

    def _on_dump(self, event: Dump) -> None:
        if self.phase is Phase.RUNNING:
            self._out.append(TakeStacks(event.id))

    def _on_signal(self, event: Signal) -> None:
        if self.phase is Phase.RUNNING:
            self._out.append(ForwardSignal(event.signum))

    def _on_group_order(self, event: StopGroup | StartGroup) -> None:
        """--replica_groups: the head's stop or start of a group across nodes, for the running ranks only (between
        attempts or after them there is nothing to stop, and the head sends no start)."""
        if self.phase is Phase.RUNNING:
            self._out.append(OrderGroup(event))

    def _on_other(self, event: OtherMessage) -> None:
        pass  # a newer runner's word: nothing this agent acts on

    def _on_link_lost(self, event: LinkLost) -> None:
        if self.phase is Phase.RUNNING:
            self._lost = event.reason
            self._out.append(StopRanks(signal.SIGTERM, f"lost the control channel to the runner: {event.reason}"))
            return
        pod = self.pod
        if pod is None:
            if self.phase is Phase.HELLO:
                self._exit(NODE_FAILURE_EXIT, NOT_ACCEPTED.format(event.reason))
            elif self.phase is Phase.BETWEEN:
                self._exit(self.code)  # the last attempt's code: the runner may never have seen it
            else:
                self._exit(NODE_FAILURE_EXIT, event.reason)
        elif self.heard:
            self._exit(NODE_FAILURE_EXIT, lost_line(pod, event.reason))
        elif self.restarts and self._now < self.join_deadline:
            if not self._told_turned_away:
                self._told_turned_away = True
                self._out.append(ShowLine(TURNED_AWAY))
            self._start_over()
        else:
            self._exit(NODE_FAILURE_EXIT, REFUSED)

    # -- from this process ------------------------------------------------------------------------------------

    def _on_shutdown(self, event: Shutdown) -> None:
        """A shutdown signal to pod mode's xrun. Node 0's server has it too: the stop and the verdict follow.
        Another node with --max_restarts leaves (node 0 restarts the job and waits for it to come back); without,
        before its ranks start its done fails the job everywhere (the rank group does the same while they run)."""
        pod = self.pod
        if pod is None or pod.node_rank == 0:
            return
        if self.phase is Phase.RUNNING:
            self._signalled = event.signum  # the rank group stops the ranks; the rest once they are over
            return
        code, name = 128 + event.signum, signal.Signals(event.signum).name
        if self.restarts:
            self._exit(code, f"got {name}: this node leaves the job; node 0 restarts it and waits for this node to "
                             "come back (the same command, within --join_timeout)")
        elif self.phase is Phase.BETWEEN:
            self._exit(code, f"got {name} after this node's part was over; exit code {code}")
        else:
            self._done_here(code)

    def _on_preflight_passed(self, event: PreflightPassed) -> None:
        if self.phase is not Phase.PREFLIGHT:
            return
        self._out.append(Send(message(Kind.READY, master_port=event.master_port)))
        self._to(Phase.STANDBY if self.standby else Phase.BARRIER)
        self._take_up_deferred()

    def _on_preflight_failed(self, event: PreflightFailed) -> None:
        if self.phase is not Phase.PREFLIGHT:
            return
        self._final(message(Kind.ERROR, message=event.reason, exit_code=event.exit_code))  # the job ends with it
        if self.pod is not None:
            self._to(Phase.BARRIER)  # node 0 ends the job; its verdict follows
            self._take_up_deferred()
        else:
            self._leave(event.exit_code)  # the runner names this host

    def _on_attempt_ended(self, event: AttemptEnded) -> None:
        if self.phase is not Phase.RUNNING:
            return
        self.code = event.exit_code
        self._final(message(Kind.DONE, exit_code=event.exit_code, root_cause=event.root_cause,
                            interrupted_by=event.interrupted_by))
        pod, lost = self.pod, self._lost
        if pod is None:
            if lost is not None or not self.restarts:
                self._leave(event.exit_code)
                return
        elif lost is not None:
            self._exit(NODE_FAILURE_EXIT, lost_line(pod, lost))
            return
        self._between()
        if self._signalled is not None and self.restarts:  # the rank group stopped the ranks for it: now it leaves
            self._on_shutdown(Shutdown(self._signalled))
        self._take_up_deferred()

    def _on_delivered(self, event: Delivered) -> None:
        self.delivered = event.ok
        if self.phase is Phase.LEAVING:
            self._exit(*self._leaving)

    def _on_tick(self, event: Tick) -> None:
        due, pod = self.wake_at, self.pod
        if due is not None and pod is not None and self._now >= due:
            self._exit(self.code, f"no verdict from node 0 ({pod.node0.host}) within {pod.verdict_wait:g} s; exiting "
                                  f"with this node's own code {self.code}")

    # -- steps ------------------------------------------------------------------------------------------------

    def _round(self, preflight: Preflight) -> None:
        """Pod mode's accept, any restart: the preflight, then ready."""
        self._round_began, self._verdict_due, self.standby = self._now, None, False
        self._preflight(preflight)

    def _preflight(self, preflight: Preflight) -> None:
        self._to(Phase.PREFLIGHT)
        self._out.append(preflight)

    def _done_here(self, code: int) -> None:
        """This attempt is over on this node before its ranks started: done with ``code``; the end, or (restarts,
        pod mode) the runner's next word."""
        self.code = code
        if self.pod is None and not self.restarts:
            self._leave(code)
        else:
            self._between()
        self._final(message(Kind.DONE, exit_code=code, root_cause=None, interrupted_by=None))

    def _between(self) -> None:
        self._to(Phase.BETWEEN)
        pod = self.pod
        if pod is not None and self.code != 0 and not self.restarts:  # a failure is over within the stop deadline
            self._verdict_due = self._now + pod.verdict_wait

    def _start_over(self) -> None:
        """Pod mode: node 0 turned this node away; the next connection starts from its hello."""
        self._to(Phase.HELLO)
        self.heard, self.code, self._deferred, self._verdict_due = False, 0, [], None
        self._out.append(JoinAgain())

    def _final(self, msg: dict[str, object]) -> None:
        self._out.append(Send(msg, final=True))

    def _leave(self, code: int, line: str | None = None) -> None:
        self._to(Phase.LEAVING)
        self._leaving = (code, line)

    def _told_to_leave(self, code: int) -> None:
        """The runner ended this agent's part (the verdict, a spare's stop): it has every word it needs."""
        self.delivered = True
        self._exit(code)

    def _exit(self, code: int, line: str | None = None) -> None:
        self._to(Phase.OVER)
        self.exit_code = engine_exit_code(code, delivered=self.delivered) if self.engine else code
        self._out.append(Exit(self.exit_code, line))

    def _to(self, phase: Phase) -> None:
        if self.phase in (Phase.BARRIER, Phase.STANDBY) and phase is not self.phase:
            self._out.append(CloseProbes())  # the wait that answered --precheck's probes is over
        self.phase = phase


def _kind(event: Event) -> str:
    if isinstance(event, OtherMessage):
        return event.kind
    if isinstance(event, Probe):
        return repr(event.message.get("type"))
    kind = KIND.get(type(event))
    return repr(kind.value) if kind is not None else repr(type(event).__name__.lower())


_HANDLERS: dict[type, Callable[[AgentMachine, Any], None]] = {  # each handler takes its own event type
    Spec: AgentMachine._on_spec,
    SpecUnusable: AgentMachine._on_spec_unusable,
    Accept: AgentMachine._on_accept,
    Waiting: AgentMachine._on_waiting,
    Start: AgentMachine._on_start,
    StopOrder: AgentMachine._on_stop,
    Restart: AgentMachine._on_restart,
    JobEnded: AgentMachine._on_verdict,
    Probe: AgentMachine._on_probe,
    Ping: AgentMachine._on_ping,
    Dump: AgentMachine._on_dump,
    Signal: AgentMachine._on_signal,
    StopGroup: AgentMachine._on_group_order,
    StartGroup: AgentMachine._on_group_order,
    OtherMessage: AgentMachine._on_other,
    LinkLost: AgentMachine._on_link_lost,
    Shutdown: AgentMachine._on_shutdown,
    PreflightPassed: AgentMachine._on_preflight_passed,
    PreflightFailed: AgentMachine._on_preflight_failed,
    AttemptEnded: AgentMachine._on_attempt_ended,
    Delivered: AgentMachine._on_delivered,
    Tick: AgentMachine._on_tick,
}
