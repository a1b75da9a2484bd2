"""The record at the head: the job's machine events and actions, and what the control server reads beside the
machine, as ``events.jsonl``'s lines (docs/events.md) and the goodput folded over them.

The control server (``xrun.runner.job.control_server``) makes one ``JobRecord`` with ``--log_dir`` and calls it
where it feeds its machine (``fed``: each event with the actions that came back) and where it reads what the
machine does not (``heard``: an agent's message; ``sampled``: a node's straggler sample once scored; ``used``: a
node's readings of its ranks' CPU and RSS, the latest per rank kept for the next ``sample`` line), and from
its loop's timer (``tick``: the periodic sample, the flush). What changed in the machine's own history (the
first failure, an attempt over, a spare seated) is read from it after each event, by identity: nothing here
keeps a second copy of the job's state, and nothing is done per event that scans the nodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Protocol

from xrun import __version__
from xrun.channel import Kind, Message
from xrun.common.output.logfiles import EVENTS_FILE
from xrun.common.output.status import say
from xrun.common.procs.posix import signal_name
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.stragglers import ClockOffset, StragglerScores
from xrun.common.result.summary import RankFigures
from xrun.common.telemetry.usage import RankUsage, sample_every
from xrun.runner.job.events import (
    Action,
    Admit,
    Attempt,
    ConnectionLost,
    Drop,
    Event,
    GroupFailed,
    GroupRestartedAcross,
    GroupsMoved,
    Heard,
    Hung,
    RankExited,
    Ready,
    SendStart,
    SendStop,
    SignalReceived,
    Verdict,
)
from xrun.runner.job.machine import Job
from xrun.runner.job.nodes import NodeState
from xrun.runner.job.record.file import FLUSH_EVERY, EventsFile
from xrun.runner.job.record.goodput import Goodput
from xrun.runner.plan import Plan
from xrun.runner.replicas.restarts import GroupRestarts

if TYPE_CHECKING:
    from xrun.common.telemetry.records import EntryTimes

# a rank's reading stays in the samples this many periods after it came (a lost node's ranks drop out after it)
USAGE_KEPT_FOR = 2
# the ranks' CPU and RSS cost ~10 bytes a rank in a sample: a bigger job has them in every k-th sample only,
# k = world size / this (rounded up), so that a week's samples stay well under the file's samples_up_to (8,000
# ranks: every 8th minute, ~80 KB each, ~100 MB a week)
USAGE_RANKS_PER_SAMPLE = 1000
# the kinds ``heard`` reads, looked up once
_STARTED, _RANK_EXITED, _GROUP_RESTARTED = Kind.STARTED.value, Kind.RANK_EXITED.value, Kind.GROUP_RESTARTED.value
_STOPPED_BY = {SignalReceived: "signal", Hung: "hang"}  # any other event: a failure's stop (a lost node too)


class Fold(Protocol):
    """What else reads every line as it is made (``--metrics_port``'s tally, xrun.runner.job.metrics)."""

    def add(self, line: Mapping[str, Any]) -> None: ...


class JobRecord:
    """One run's record: ``events.jsonl`` under ``log_dir`` and the goodput of the same events; without
    ``log_dir`` (``--metrics_port`` alone) no file, only the folds."""

    def __init__(self, plan: Plan, job: Job, *, log_dir: str | None, now: float, folds: Iterable[Fold] = ()) -> None:
        self.job = job
        self.plan = plan
        self.t0 = job.attempts.t0  # the job's start on the head's monotonic clock: every line's ``t`` is from it
        self.unix0_ns = time.time_ns() - int((now - self.t0) * 1e9)  # the wall clock at t 0
        self.file = EventsFile(os.path.join(log_dir, EVENTS_FILE)) if log_dir is not None else None
        self.goodput = Goodput()
        self.folds: tuple[Fold, ...] = (self.goodput, *folds)
        self.every = sample_every()  # SAMPLE_EVERY (60 s); tests set XRUN_SAMPLE_EVERY_S
        self.usage_stride = -(-plan.world_size // USAGE_RANKS_PER_SAMPLE)  # the samples that carry CPU and RSS
        self._samples = 0
        self.next_sample = now + self.every
        self.next_flush = now + FLUSH_EVERY
        self._due = min(self.next_sample, self.next_flush)
        # what of the machine's history is already written (compared by identity after each event)
        self._failure: object = None
        self._attempts_over = 0
        self._replaced: tuple[object, ...] = ()
        self._started_attempt = -1  # the last attempt an attempt_started was written for
        self._first_collective = -1  # the last attempt a first_collective was written for
        self._lost: set[int] = set()  # agents whose loss was written (this attempt)
        self._figures: dict[tuple[int, int], RankFigures] = {}  # a rank_exited's figures, until its event
        self._named: dict[int, tuple[str, float]] = {}
        self._usage: dict[int, tuple[RankUsage, float]] = {}  # rank -> its latest reading and when it came
        self.group_restarts = GroupRestarts()  # --replica_groups: summary.json's group_restarts
        self._on_event: dict[type, Callable[[Any, float], None]] = {
            Ready: self._ready, RankExited: self._rank_exited, ConnectionLost: self._connection_lost,
            Hung: self._hung}
        self._on_action: dict[type, Callable[[Any, Event, float], None]] = {
            Admit: self._admit, Drop: self._drop, SendStart: self._start, SendStop: self._stop,
            GroupsMoved: self._groups_moved, GroupRestartedAcross: self._restarted_across}
        options = plan.request.options
        self.write(self.t0, "job_started", unix_ns=self.unix0_ns, xrun=__version__, nodes=len(plan.nodes),
                   world_size=plan.world_size, hosts=list(plan.agent_hosts), spares=len(plan.spares),
                   max_restarts=job.config.restart.max_restarts, hang_timeout=options.hang_timeout,
                   sample_every_s=self.every, usage_every=self.usage_stride, **_contract(plan))

    def write(self, now: float, event: str, *, sample: bool = False, **fields: Any) -> None:
        self.put(now, event, fields, sample=sample)

    def put(self, now: float, event: str, fields: Mapping[str, Any], *, sample: bool = False) -> None:
        """One line: ``t`` (seconds since the job's start, the head's clock), ``event``, then ``fields``."""
        line = {"t": round(now - self.t0, 3), "event": event, **fields}
        for fold in self.folds:
            fold.add(line)
        if self.file is not None:
            self.file.write(line, sample=sample)

    # -- where the control server feeds its machine ------------------------------------------------------------

    def fed(self, event: Event, actions: Iterable[Action], now: float) -> None:
        """The machine took ``event`` at ``now`` and answered ``actions``."""
        if type(event) is Heard:
            return  # a pong or a sample (it is alive): the most frequent event by far, and nothing to write
        on_event = self._on_event.get(type(event))
        if on_event is not None:
            on_event(event, now)
        self._history(now)  # a failure before the stop it begins, an attempt over before the next one's start
        for action in actions:
            on_action = self._on_action.get(type(action))
            if on_action is not None:
                on_action(action, event, now)

    def _history(self, now: float) -> None:
        """The machine's own history, read after each event: a first failure, a spare seated, an attempt over."""
        job = self.job
        failure = job.cause.failure
        if failure is not None and failure is not self._failure:
            self._failure = failure
            self.write(job.cause.failure_at or now, "failure", attempt=job.attempts.number, reason=failure.reason,
                       host=failure.host, rank=failure.rank, exit_code=failure.exit_code)
        replaced = job.attempts.replaced
        if replaced is not self._replaced:
            for r in replaced[len(self._replaced) if replaced[:len(self._replaced)] == self._replaced else 0:]:
                self.write(now, "spare_swapped", attempt=r.attempt, node=r.node_rank, lost_host=r.lost,
                           spare_host=r.spare)
            self._replaced = replaced
        history = job.attempts.history
        for attempt in history[self._attempts_over:]:
            ending = job.attempts.ending.value if job.attempts.ending is not None else None
            self.put(now, "attempt_ended", {**attempt.to_json(), "ending": ending})
            self._lost.clear()
            self._named = {}  # the next attempt's scores begin anew (the control server's ``_begin_attempt``)
        self._attempts_over = len(history)

    def _ready(self, event: Ready, now: float) -> None:
        node = self.job.nodes.by_agent.get(event.node)
        if node is not None:
            self.write(now, "node_ready", node=node.rank, host=node.host, master_port=event.master_port)

    def _rank_exited(self, event: RankExited, now: float) -> None:
        if event.rank is not None:
            self._usage.pop(event.rank, None)  # its reading was of a process that is gone
        figures = self._figures.pop((event.node, event.rank if event.rank is not None else -1), None)
        self.write(now, "rank_exited", attempt=self.job.attempts.number, node=self._rank_of(event.node),
                   host=self._host(event.node), rank=event.rank, local_rank=event.local_rank, code=event.code,
                   signal=None if event.signal is None else signal_name(event.signal), stopped=event.stopped,
                   wall_s=None if figures is None else round(figures.wall_s, 3),
                   cpu_s=None if figures is None or figures.cpu_s is None else round(figures.cpu_s, 3),
                   peak_rss_bytes=None if figures is None else figures.peak_rss_bytes)

    def _connection_lost(self, event: ConnectionLost, now: float) -> None:
        node = self.job.nodes.by_agent.get(event.node)
        if node is not None and node.state is NodeState.LOST:
            self._lose(event.node, f"its agent's connection dropped ({event.reason})", now)

    def _hung(self, event: Hung, now: float) -> None:
        self.write(now, "hang_detected", attempt=self.job.attempts.number, reason=event.reason,
                   root_cause=event.root_cause, silent_s=self.plan.request.options.hang_timeout,
                   action="restart" if event.restart else "stop")

    def _admit(self, action: Admit, event: Event, now: float) -> None:
        node = self.job.nodes.by_agent.get(action.node)
        addr = getattr(event, "addr", None)
        if node is None:
            self.write(now, "spare_joined", agent=action.node, host=self.plan.agent_hosts[action.node], addr=addr)
        else:
            self.write(now, "node_joined", node=node.rank, host=node.host, addr=addr)

    def _drop(self, action: Drop, event: Event, now: float) -> None:
        failure = self.job.failure
        host = self._host(action.node)
        reason = failure.reason if failure is not None and failure.host == host else None
        self._lose(action.node, reason, now)

    def _lose(self, agent: int, reason: str | None, now: float) -> None:
        if agent in self._lost:
            return
        self._lost.add(agent)
        self.write(now, "node_lost", attempt=self.job.attempts.number, node=self._rank_of(agent),
                   host=self._host(agent), reason=reason)

    def _groups_moved(self, action: GroupsMoved, event: Event, now: float) -> None:
        groups = self.job.config.groups
        assert groups is not None
        for line in self.group_restarts.moved(action.lost, action.spare, action.reason, action.moves,
                                              budget=groups.budget, at=self.unix0_ns / 1e9 + now - self.t0):
            self.write(now, "group_restarted", node=action.node_rank, **line)

    def _restarted_across(self, action: GroupRestartedAcross, event: Event, now: float) -> None:
        assert isinstance(event, GroupFailed)  # the head restarts a group across nodes on a node's word alone
        self.write(now, "group_restarted", node=self._rank_of(event.node),
                   **self.group_restarts.add(action.host, action.restart, hosts=action.hosts))

    def _start(self, action: SendStart, event: Event, now: float) -> None:
        if action.attempt == self._started_attempt:
            return  # --elastic: each node is started as it is ready; the attempt began with the first
        self._started_attempt = action.attempt
        self.write(now, "attempt_started", attempt=action.attempt, nodes=len(action.nodes),
                   master_addr=action.master_addr, master_port=action.master_port)

    def _stop(self, action: SendStop, event: Event, now: float) -> None:
        self.write(now, "stop_requested", attempt=self.job.attempts.number,
                   by=_STOPPED_BY.get(type(event), "failure"), reason=action.reason,
                   signal=signal_name(action.signal), nodes=len(action.nodes))

    # -- what the control server reads beside the machine ----------------------------------------------------

    def heard(self, node: int, msg: Message, now: float) -> None:
        """An admitted agent's message, before the machine's event: a node's ranks started, a rank's figures."""
        kind = msg.get("type")
        if kind == _STARTED:
            self.write(now, "node_started", attempt=self.job.attempts.number, node=self._rank_of(node),
                       host=self._host(node))
        elif kind == _RANK_EXITED and msg.get("figures") is not None:
            figures = RankFigures.from_json(msg["figures"])
            self._figures[(node, figures.rank)] = figures
        elif kind == _GROUP_RESTARTED:
            self.write(now, "group_restarted", node=self._rank_of(node),
                       **self.group_restarts.add(self._host(node), GroupRestart.from_json(dict(msg))))

    def sampled(self, node: int, offset: ClockOffset | None, samples: Iterable[EntryTimes],
                scores: StragglerScores, *, changed: bool, now: float) -> None:
        """A node's straggler sample was scored (``changed``: some rank was named or recovered): the attempt's
        first collective, and who was named or recovered."""
        attempt = self.job.attempts.number
        if self._first_collective != attempt:
            first = min(((times.created_ns[0], times.seqs[0], sample.rank) for sample in samples
                         for times in sample.groups if times.created_ns), default=None)
            if first is not None:
                self._first_collective = attempt
                created, seq, rank = first
                entered = None if offset is None else round((created - offset.offset_ns - self.unix0_ns) / 1e9, 3)
                self.write(now, "first_collective", attempt=attempt, node=self._rank_of(node), host=self._host(node),
                           rank=rank, seq=seq, entered_t=entered)
        if changed:
            named = scores.named()
            for rank, (host, late) in named.items():
                if rank not in self._named:
                    self.write(now, "straggler_named", attempt=attempt, rank=rank, host=host, late_ms=round(late, 1))
            for rank, (host, _) in self._named.items():
                if rank not in named:
                    self.write(now, "straggler_recovered", attempt=attempt, rank=rank, host=host)
            self._named = named

    def used(self, readings: Iterable[RankUsage], now: float) -> None:
        """A node's ``usage`` message: its ranks' latest CPU and RSS, for the next ``sample`` line."""
        for reading in readings:
            self._usage[reading.rank] = (reading, now)

    def usage_now(self, now: float) -> dict[int, RankUsage]:
        """Each rank's latest reading, when it came in the last ``USAGE_KEPT_FOR`` periods. Safe from another
        thread (``--metrics_port``'s scrape): the readings are copied in one step before they are read."""
        since = now - USAGE_KEPT_FOR * self.every
        return {rank: reading for rank, (reading, at) in list(self._usage.items()) if at >= since}

    def _usage_now(self, now: float) -> tuple[list[int | None], list[int | None]]:
        """The ``sample`` line's ``cpu_pct`` and ``rss_mib``: lists by rank (compact at 8,000 ranks: a few bytes
        each), ``null`` for a rank with no recent reading; empty when none has one."""
        recent = self.usage_now(now)
        size = max(recent, default=-1) + 1
        cpu: list[int | None] = [None] * size
        rss: list[int | None] = [None] * size
        for rank, reading in recent.items():
            cpu[rank], rss[rank] = reading.cpu_pct, (reading.rss_kib + 512) >> 10
        return cpu, rss

    # -- the loop's timer, and the end ---------------------------------------------------------------------------

    def due(self) -> float | None:
        return self._due if self.file is not None else None  # no file: nothing periodic to do

    def tick(self, now: float, scores: StragglerScores) -> None:
        """The periodic sample of the ranks' lateness, CPU and RSS, and the flush to the writing thread (called
        after every wake-up of the loop: one comparison until one is due)."""
        if now < self._due:
            return
        if now >= self.next_sample and self.file is not None:  # no file: no sample line to write
            self.next_sample = now + self.every
            late = scores.late_now()
            self._samples += 1
            usage = {}
            if self._samples % self.usage_stride == 0:
                usage["cpu_pct"], usage["rss_mib"] = self._usage_now(now)
            self.write(now, "sample", sample=True, attempt=self.job.attempts.number,
                       collectives_scored=scores.collectives_scored, stragglers=sorted(self._named),
                       late_ms={str(rank): round(ms, 1) for rank, ms in late.items()}, **usage)
        if now >= self.next_flush and self.file is not None:
            self.next_flush = now + FLUSH_EVERY
            self.file.flush()
        self._due = min(self.next_sample, self.next_flush)

    def close(self, verdict: Verdict, now: float) -> dict[str, Any]:
        """The job's end line, the file's last write awaited; the goodput and the record's own figures, for
        ``summary.json``."""
        job = self.job
        end = job.all_over_at if job.all_over_at is not None else now
        failure = verdict.failure
        if self._attempts_over <= job.attempts.number:  # no --max_restarts nor --spares: the machine kept no history
            started = job.barrier.started_at if job.barrier.started_at is not None else job.attempts.began
            ran = max(0.0, (job.failure_at or end) - started)
            attempt = Attempt(job.attempts.number, job.attempts.began - self.t0, ran, failure, end - self.t0)
            self.put(end, "attempt_ended", {**attempt.to_json(), "ending": "final"})
        line = {"t": round(end - self.t0, 3), "event": "job_ended", "exit_code": verdict.exit_code,
                "root_cause": None if failure is None else failure.reason,
                "interrupted_by": None if verdict.interrupted_by is None else signal_name(verdict.interrupted_by),
                "attempts": job.attempts.number + 1}
        for fold in self.folds:
            fold.add(line)  # the line carries the goodput it closes
        goodput = self.goodput.to_json()
        groups = {"group_restarts": self.group_restarts.to_json()} if self.group_restarts.heard else {}
        if self.file is None:
            return {"goodput": goodput, **groups}
        self.file.write({**line, "goodput": goodput})
        finished = self.file.close()
        if self.file.error is not None or not finished:
            say(f"{EVENTS_FILE}: {self.file.error or 'the disk did not take the last lines in time'}")
        return {"goodput": goodput, **groups,
                "events": {"file": EVENTS_FILE, "bytes": self.file.size, "dropped": self.file.dropped()}}

    def _host(self, agent: int) -> str:
        node = self.job.nodes.by_agent.get(agent)
        return node.host if node is not None else self.plan.agent_hosts[agent]

    def _rank_of(self, agent: int) -> int | None:
        """The node rank an agent runs (None: a hot spare on standby)."""
        node = self.job.nodes.by_agent.get(agent)
        return None if node is None else node.rank


def _contract(plan: Plan) -> dict[str, Any]:
    """``job_started``'s ``run_id``, ``command`` (rank 0's argv), ``env`` (the env contract rank 0 got on top of
    its node's environment) and ``local_ranks`` (each node's count, by node rank): what report.html shows."""
    first = plan.nodes[0].ranks[0] if plan.nodes and plan.nodes[0].ranks else None
    return {"run_id": plan.request.run_id, "command": None if first is None else list(first.argv),
            "env": None if first is None else dict(first.env), "local_ranks": [len(n.ranks) for n in plan.nodes]}
