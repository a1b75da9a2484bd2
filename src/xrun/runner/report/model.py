"""What report.html shows, folded over the record's lines (docs/events.md): pure, no I/O.

The timeline has a lane for the job (its attempts, restarts, stops, hangs), one per node (its attempts on its host,
spare swaps, losses) and one per rank (its life in each attempt to its exit, straggler marks; under
``--replica_groups`` each group restart ends its ranks' runs there, marked on the lane of the rank whose end caused
it, and listed in a table of its own); the charts have
the ranks' lateness, CPU and memory over the samples. Bounds keep a 1,000-node page small and quick to draw: above
``RANK_LANES_UP_TO`` ranks only the ranks with something to show get a lane; at most ``LINES_UP_TO`` lines a chart
(the latest ranks, or the spread over all ranks); at most ``POINTS`` samples a chart (evenly thinned). The page says
each bound it applied.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from statistics import median
from typing import Any

from xrun.common.result.group_restart import restarted_words

RANK_LANES_UP_TO = 256  # a lane for every rank up to this world size
LINES_UP_TO = 16  # lines a chart draws: one per rank up to this many, else the spread (min, median, max)
POINTS = 400  # samples a chart draws at most

Lane = tuple[str, int]  # ("job", 0), ("node", node rank), ("rank", global rank)
JOB: Lane = ("job", 0)


class Outcome(Enum):
    """How a span ended: its colour in the timeline and its word in the tables."""

    OK = "ok"
    FAILED = "failed"
    STOPPED = "stopped by xrun"
    LOST = "lost"
    RUNNING = "running at the last line"


@dataclass(frozen=True)
class Span:
    """A stretch of a lane: an attempt of the job, of a node on its host, of a rank to its exit."""

    lane: str
    start: float
    end: float
    outcome: Outcome
    text: str


@dataclass(frozen=True)
class Mark:
    lane: str
    t: float
    kind: str  # restart, group restart, failure, spare swap, node lost, hang, stop, straggler, recovered, first
    # collective
    text: str


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    t: tuple[float, ...]
    series: tuple[Series, ...]
    note: str | None = None  # a bound it applied, said in words


@dataclass(frozen=True)
class Report:
    title: str
    state: str  # ended (with its code) or still going / died
    root_cause: tuple[str, ...]  # sentences
    facts: tuple[tuple[str, str], ...]
    command: tuple[str, ...] | None
    env: tuple[tuple[str, str], ...]
    lanes: tuple[str, ...]  # the timeline's, top to bottom
    spans: tuple[Span, ...]  # every one (the timeline draws those on its lanes; the table lists all)
    marks: tuple[Mark, ...]
    attempts: tuple[tuple[str, ...], ...]  # rows of ATTEMPT_COLUMNS
    charts: tuple[Chart, ...]  # lateness, CPU, memory
    notes: tuple[str, ...] = ()
    group_restarts: tuple[tuple[str, ...], ...] = ()  # rows of GROUP_RESTART_COLUMNS (--replica_groups)


ATTEMPT_COLUMNS = ("attempt", "started (s)", "ended (s)", "trained (s)", "ending", "root cause", "spares seated")
GROUP_RESTART_COLUMNS = ("t (s)", "group", "restart", "host", "rank", "its end", "groups that ran on")


@dataclass
class _Fold:
    """The state of the fold over the lines (private to ``report_of``)."""

    started: dict[str, Any] = field(default_factory=dict)
    ranks_of: dict[int, range] = field(default_factory=dict)  # node -> its global ranks (job_started's local_ranks)
    node_hosts: dict[int, list[str]] = field(default_factory=dict)
    rank_node: dict[int, int] = field(default_factory=dict)
    rank_hosts: dict[int, list[str]] = field(default_factory=dict)
    attempt_t: dict[int, float] = field(default_factory=dict)
    node_t: dict[tuple[int, int], float] = field(default_factory=dict)  # (attempt, node) -> its ranks started
    node_ran_on: dict[tuple[int, int], str] = field(default_factory=dict)  # (attempt, node) -> the host it ran on
    node_end: dict[tuple[int, int], float] = field(default_factory=dict)  # (attempt, node) -> lost at
    exited: set[tuple[int, int]] = field(default_factory=set)  # (attempt, rank)
    run_t: dict[tuple[int, int], float] = field(default_factory=dict)  # (attempt, rank) -> its run's start, once
    # its replica group restarted (before: its node's start)
    group_restarts: list[tuple[str, ...]] = field(default_factory=list)
    restarted: dict[int, int] = field(default_factory=dict)  # replica group -> its restarts
    spans: list[tuple[Lane, Span]] = field(default_factory=list)
    marks: list[tuple[Lane, Mark]] = field(default_factory=list)
    attempts: list[tuple[str, ...]] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    samples: list[Mapping[str, Any]] = field(default_factory=list)
    failure: str | None = None
    hang: str | None = None
    job_ended: Mapping[str, Any] | None = None
    last_t: float = 0.0


def report_of(lines: Sequence[Mapping[str, Any]], *, summary: Mapping[str, Any] | None = None,
              failure: Mapping[str, Any] | None = None, torn: bool = False) -> Report:
    """The page's content from the record's ``lines`` (the first is ``job_started``) and, when written,
    ``summary.json`` and ``failure.json``."""
    fold = _Fold(started=dict(lines[0]), ranks_of=_ranks_of(lines[0].get("local_ranks")))
    for line in lines:
        fold.last_t = max(fold.last_t, _t(line))
        on_line = _ON_LINE.get(str(line.get("event")))
        if on_line is not None:
            on_line(fold, line)
    _close_open_spans(fold)
    world = _int(fold.started.get("world_size")) or 0
    shown_ranks = _shown_ranks(fold, world)
    labels = _labels(fold, set(range(world)) | {lane[1] for lane, _ in (*fold.spans, *fold.marks) if lane[0] == "rank"})
    shown = [lane for lane in labels if lane[0] != "rank" or lane[1] in shown_ranks]
    spans = tuple(replace(span, lane=labels[lane]) for lane, span in fold.spans)
    marks = tuple(replace(mark, lane=labels[lane]) for lane, mark in fold.marks)
    notes = []
    if torn:
        notes.append("The record's last line was cut (the run was still writing it, or was killed): it is left out.")
    if len(shown_ranks) < world:
        notes.append(f"{world} ranks: the timeline has a lane for the {len(shown_ranks)} rank(s) with a failure, a "
                     f"stop or a straggler mark (every rank's lane up to {RANK_LANES_UP_TO} ranks); the table "
                     f"below lists every span.")
    return Report(
        title=f"xrun run {_text(fold.started.get('run_id') or '')}".strip(),
        state=_state(fold),
        root_cause=_root_cause(fold, failure),
        facts=_facts(fold, summary, len(lines)),
        command=None if not isinstance(fold.started.get("command"), list)
        else tuple(_text(a) for a in fold.started["command"]),
        env=tuple(sorted((_text(k), _text(v)) for k, v in _mapping(fold.started.get("env")).items())),
        lanes=tuple(labels[lane] for lane in sorted(shown, key=_lane_order(fold))),
        spans=spans,
        marks=marks,
        attempts=tuple(fold.attempts),
        charts=_charts(fold.samples, world),
        notes=tuple(notes),
        group_restarts=tuple(fold.group_restarts),
    )


# -- the lines, one handler an event ---------------------------------------------------------------------------------

def _node_joined(fold: _Fold, line: Mapping[str, Any]) -> None:
    node = _int(line.get("node"))
    if node is not None:
        _host_of(fold, node, _text(line.get("host")))


def _attempt_started(fold: _Fold, line: Mapping[str, Any]) -> None:
    attempt = _int(line.get("attempt")) or 0
    fold.attempt_t[attempt] = _t(line)


def _node_started(fold: _Fold, line: Mapping[str, Any]) -> None:
    node, attempt = _int(line.get("node")), _int(line.get("attempt")) or 0
    if node is not None:
        _host_of(fold, node, _text(line.get("host")))
        fold.node_t[(attempt, node)] = _t(line)
        fold.node_ran_on[(attempt, node)] = _text(line.get("host"))


def _rank_exited(fold: _Fold, line: Mapping[str, Any]) -> None:
    rank, node, attempt = _int(line.get("rank")), _int(line.get("node")), _int(line.get("attempt")) or 0
    if rank is None:
        return
    host = _text(line.get("host"))
    _add_host(fold.rank_hosts, rank, host)
    if node is not None:
        fold.rank_node[rank] = node
    t = _t(line)
    start = fold.run_t.get((attempt, rank), fold.node_t.get((attempt, node if node is not None else -1),
                                                            fold.attempt_t.get(attempt, t)))
    code, sig = line.get("code"), line.get("signal")
    said = f"exit code {_text(code)}" if sig is None else f"killed by {_text(sig)}"
    if line.get("stopped"):
        outcome, said = Outcome.STOPPED, f"stopped by xrun ({said})"
    else:
        outcome = Outcome.OK if code == 0 else Outcome.FAILED
    fold.exited.add((attempt, rank))
    fold.spans.append((("rank", rank), Span("", start, t, outcome, f"attempt {attempt} on {host}: {said}")))


def _failure(fold: _Fold, line: Mapping[str, Any]) -> None:
    reason = _text(line.get("reason"))
    fold.failure = reason
    rank = _int(line.get("rank"))
    lane = ("rank", rank) if rank is not None else _node_lane(fold, _text(line.get("host")))
    fold.marks.append((lane, Mark("", _t(line), "failure", f"root cause of attempt {_int(line.get('attempt'))}: "
                                                           f"{reason}")))


def _hang(fold: _Fold, line: Mapping[str, Any]) -> None:
    cause = line.get("root_cause") or line.get("reason")
    fold.hang = f"hang detected after {_text(line.get('silent_s'))} s of silence: {_text(cause)}"
    fold.marks.append((JOB, Mark("", _t(line), "hang", f"{fold.hang} (then {_text(line.get('action'))})")))


def _node_lost(fold: _Fold, line: Mapping[str, Any]) -> None:
    node, attempt = _int(line.get("node")), _int(line.get("attempt")) or 0
    host = _text(line.get("host"))
    lane = ("node", node) if node is not None else JOB
    if node is not None:
        fold.node_end[(attempt, node)] = _t(line)
    reason = line.get("reason")
    fold.marks.append((lane, Mark("", _t(line), "node lost",
                                  f"node {_text(node)} ({host}) lost" + (f": {_text(reason)}" if reason else ""))))


def _stop(fold: _Fold, line: Mapping[str, Any]) -> None:
    fold.marks.append((JOB, Mark("", _t(line), "stop", f"stop requested by {_text(line.get('by'))} "
                                                       f"({_text(line.get('signal'))}): {_text(line.get('reason'))}")))


def _swapped(fold: _Fold, line: Mapping[str, Any]) -> None:
    node = _int(line.get("node"))
    spare, lost = _text(line.get("spare_host")), _text(line.get("lost_host"))
    if node is not None:
        _host_of(fold, node, spare)
    fold.marks.append((("node", node) if node is not None else JOB, Mark(
        "", _t(line), "spare swap", f"spare {spare} takes node {_text(node)}'s place from {lost} "
                                    f"(attempt {_text(line.get('attempt'))} on)")))


def _straggler(fold: _Fold, line: Mapping[str, Any]) -> None:
    rank = _int(line.get("rank"))
    if rank is None:
        return
    host = _text(line.get("host"))
    fold.rank_hosts.setdefault(rank, [host])
    if line["event"] == "straggler_named":
        mark = Mark("", _t(line), "straggler", f"straggler: rank {rank} ({host}) +{_text(line.get('late_ms'))} ms")
    else:
        mark = Mark("", _t(line), "recovered", f"rank {rank} ({host}) on time again")
    fold.marks.append((("rank", rank), mark))


def _first_collective(fold: _Fold, line: Mapping[str, Any]) -> None:
    rank = _int(line.get("rank"))
    if rank is not None:
        said = f"attempt {_text(line.get('attempt'))}'s first collective (#{_text(line.get('seq'))}) on rank {rank}"
        fold.marks.append((("rank", rank), Mark("", _t(line), "first collective", said)))


def _group_restarted(fold: _Fold, line: Mapping[str, Any]) -> None:
    """A replica group's restart (``--replica_groups``, its node's decision): its ranks' runs end here (the rank
    whose end caused it failed, the others were stopped by xrun) and start again; marked on that rank's lane."""
    group, rank, node, restart = (_int(line.get(k)) for k in ("group", "rank", "node", "restart"))
    if group is None:
        return
    t, host, cause = _t(line), _text(line.get("host")), _text(line.get("cause"))
    attempt = max(fold.attempt_t, default=0)  # the head restarts no whole job under --replica_groups: the one there is
    others = [_text(g) for g in line.get("others") or () if _int(g) is not None]
    went_on = f"group{'s' if len(others) > 1 else ''} {', '.join(others)} ran on" if others else \
        "no other group ran on its node"
    of = f"restart {_text(restart)} of {_text(line.get('budget'))}"
    fold.marks.append((("rank", rank) if rank is not None else JOB, Mark(
        "", t, "group restart", f"replica group {group} restarted ({of}) on {host}: rank {_text(rank)} {cause}; "
                                f"{went_on}")))
    for member in _group_ranks(fold, group) or ([rank] if rank is not None else []):
        start = fold.run_t.get((attempt, member), fold.node_t.get((attempt, node if node is not None else -1),
                                                                  fold.attempt_t.get(attempt, t)))
        outcome, said = (Outcome.FAILED, cause) if member == rank else (
            Outcome.STOPPED, f"stopped by xrun for rank {_text(rank)}'s end")
        fold.spans.append((("rank", member), Span("", start, t, outcome, f"attempt {attempt} on {host}, replica "
                                                                          f"group {group} before its {of}: {said}")))
        fold.run_t[(attempt, member)] = t
        _add_host(fold.rank_hosts, member, host)
        if node is not None:
            fold.rank_node.setdefault(member, node)
    fold.restarted[group] = fold.restarted.get(group, 0) + 1
    fold.group_restarts.append((f"{t:g}", str(group), of.removeprefix("restart "), host, _text(rank), cause,
                                ", ".join(others) or "none"))


def _group_ranks(fold: _Fold, group: int) -> range:
    """A replica group's ranks: the world split into ``NUM_REPLICA_GROUPS`` (rank 0's env) equal groups in rank
    order (docs/replica-groups.md); empty when the record does not say it."""
    world = _int(fold.started.get("world_size")) or 0
    count = _mapping(fold.started.get("env")).get("NUM_REPLICA_GROUPS")
    groups = int(count) if isinstance(count, str) and count.isdecimal() else 0
    if not groups or world % groups or not 0 <= group < groups:
        return range(0)
    size = world // groups
    return range(group * size, group * size + size)


def _sample(fold: _Fold, line: Mapping[str, Any]) -> None:
    fold.samples.append(line)


def _attempt_ended(fold: _Fold, line: Mapping[str, Any]) -> None:
    attempt = _int(line.get("attempt")) or 0
    fold.ended.add(attempt)
    t, cause, ending = _t(line), line.get("root_cause"), _text(line.get("ending"))
    began = fold.attempt_t.get(attempt, _float(line.get("began_at_s")) or 0.0)
    outcome = Outcome.OK if cause is None else Outcome.FAILED
    said = "succeeded" if cause is None else _text(cause)
    fold.spans.append((JOB, Span("", began, t, outcome, f"attempt {attempt} ({ending}): {said}")))
    if ending == "restart":
        fold.marks.append((JOB, Mark("", t, "restart", f"restart after attempt {attempt}: {said}")))
    for (a, node), start in fold.node_t.items():
        if a == attempt:
            lost = fold.node_end.get((a, node))
            host = fold.node_ran_on[(a, node)]
            fold.spans.append((("node", node), Span(
                "", start, lost if lost is not None else t, Outcome.LOST if lost is not None else outcome,
                f"attempt {attempt} on {host}: " + ("lost" if lost is not None else said))))
            _unexited_ranks(fold, attempt, node, start, lost if lost is not None else t, Outcome.LOST)
    replaced = "; ".join(f"{_text(r.get('spare_host'))} for {_text(r.get('lost_host'))} as node "
                         f"{_text(r.get('node_rank'))}" for r in line.get("replaced") or () if isinstance(r, Mapping))
    fold.attempts.append((str(attempt), f"{began:g}", f"{t:g}", _text(line.get("ran_s")), ending, said,
                          replaced or "none"))


def _job_ended(fold: _Fold, line: Mapping[str, Any]) -> None:
    fold.job_ended = line


_ON_LINE = {
    "node_joined": _node_joined, "node_ready": _node_joined, "attempt_started": _attempt_started,
    "node_started": _node_started, "rank_exited": _rank_exited, "failure": _failure, "hang_detected": _hang,
    "node_lost": _node_lost, "stop_requested": _stop, "spare_swapped": _swapped, "straggler_named": _straggler,
    "straggler_recovered": _straggler, "first_collective": _first_collective, "sample": _sample,
    "attempt_ended": _attempt_ended, "job_ended": _job_ended, "group_restarted": _group_restarted,
}


def _close_open_spans(fold: _Fold) -> None:
    """An attempt the record never ended (a run still going, or its head killed): its spans run to the last line."""
    end = fold.last_t
    for attempt, began in fold.attempt_t.items():
        if attempt in fold.ended:
            continue
        fold.spans.append((JOB, Span("", began, end, Outcome.RUNNING, f"attempt {attempt}: no end in the record")))
        for (a, node), start in fold.node_t.items():
            if a == attempt:
                host = fold.node_ran_on[(a, node)]
                fold.spans.append((("node", node), Span("", start, end, Outcome.RUNNING,
                                                        f"attempt {attempt} on {host}: no end in the record")))
                _unexited_ranks(fold, attempt, node, start, end, Outcome.RUNNING)


def _unexited_ranks(fold: _Fold, attempt: int, node: int, start: float, end: float, outcome: Outcome) -> None:
    """A span for each rank of ``node`` with no exit in ``attempt``: still running, or gone with its lost node."""
    host = fold.node_ran_on[(attempt, node)]
    for rank in fold.ranks_of.get(node, ()):
        if (attempt, rank) not in fold.exited:
            fold.rank_node.setdefault(rank, node)
            _add_host(fold.rank_hosts, rank, host)
            said = "no exit in the record" + (" (its node was lost)" if outcome is Outcome.LOST else "")
            fold.spans.append((("rank", rank), Span("", fold.run_t.get((attempt, rank), start), end, outcome,
                                                    f"attempt {attempt} on {host}: {said}")))


def _ranks_of(local_ranks: Any) -> dict[int, range]:
    """Each node's global ranks from ``job_started``'s ``local_ranks`` (ranks are consecutive in node order)."""
    out: dict[int, range] = {}
    first = 0
    for node, count in enumerate(local_ranks if isinstance(local_ranks, list) else ()):
        n = _int(count) or 0
        out[node] = range(first, first + n)
        first += n
    return out


# -- lanes --------------------------------------------------------------------------------------------------------

def _shown_ranks(fold: _Fold, world: int) -> set[int]:
    """The ranks with a lane: every one up to RANK_LANES_UP_TO, else those with a mark or a failed span."""
    ranks = set(range(world)) | {lane[1] for lane, _ in fold.spans if lane[0] == "rank"}
    if len(ranks) <= RANK_LANES_UP_TO:
        return ranks
    marked = {lane[1] for lane, _ in fold.marks if lane[0] == "rank"}
    return marked | {lane[1] for lane, span in fold.spans if lane[0] == "rank" and span.outcome is Outcome.FAILED}


def _labels(fold: _Fold, ranks: Iterable[int]) -> dict[Lane, str]:
    nodes = _int(fold.started.get("nodes")) or 0
    labels: dict[Lane, str] = {JOB: "job"}
    for node in set(range(nodes)) | set(fold.node_hosts):
        labels[("node", node)] = f"node {node} ({' → '.join(fold.node_hosts.get(node, ['?']))})"
    for rank in ranks:
        hosts = fold.rank_hosts.get(rank)
        labels[("rank", rank)] = f"rank {rank}" + (f" ({' → '.join(hosts)})" if hosts else "")
    return labels


def _lane_order(fold: _Fold) -> Any:
    """The job on top, then each node followed by its ranks."""
    node_of = {rank: node for node, ranks in fold.ranks_of.items() for rank in ranks} | fold.rank_node

    def key(lane: Lane) -> tuple[int, int, int]:
        if lane[0] == "job":
            return (-1, 0, 0)
        if lane[0] == "node":
            return (lane[1], 0, 0)
        return (node_of.get(lane[1], 1 << 30), 1, lane[1])

    return key


def _host_of(fold: _Fold, node: int, host: str) -> None:
    _add_host(fold.node_hosts, node, host)


def _add_host(hosts_of: dict[int, list[str]], key: int, host: str) -> None:
    """A node's or a rank's hosts in order (a spare swap adds one)."""
    hosts = hosts_of.setdefault(key, [])
    if not hosts or hosts[-1] != host:
        hosts.append(host)


def _node_lane(fold: _Fold, host: str) -> Lane:
    for node, hosts in fold.node_hosts.items():
        if hosts and hosts[-1] == host:
            return ("node", node)
    return JOB


# -- words -----------------------------------------------------------------------------------------------------------

def _state(fold: _Fold) -> str:
    end = fold.job_ended
    if end is None:
        return (f"no end in the record: the run is still going, or its head died (the last line is at "
                f"{fold.last_t:g} s)")
    code = _text(end.get("exit_code"))
    attempts = _text(end.get("attempts"))
    by = end.get("interrupted_by")
    return f"ended with exit code {code} after {attempts} attempt(s) at {fold.last_t:g} s" + (
        f", interrupted by {_text(by)}" if by else "")


def _root_cause(fold: _Fold, failure: Mapping[str, Any] | None) -> tuple[str, ...]:
    end = fold.job_ended
    said: list[str] = []
    cause = end.get("root_cause") if end is not None else fold.failure
    if cause:
        said.append(f"Root cause: {_text(cause)}.")
    elif end is not None and end.get("exit_code") == 0:
        said.append("The job succeeded: every rank exited with code 0.")
    elif end is None:
        said.append("No failure in the record so far.")
    if fold.hang:
        said.append(f"The hang: {fold.hang}.")
    if failure is not None:
        headline = failure.get("headline")
        if headline:
            said.append(f"failure.json: {_text(headline)}.")
        findings = _mapping(_mapping(failure.get("collectives")).get("findings"))
        if findings.get("root_cause"):
            said.append(f"The collective held: {_text(findings['root_cause'])}.")
    restarts = [row for row in fold.attempts if row[4] == "restart"]
    for row in restarts:
        said.append(f"Attempt {row[0]} was restarted after: {row[5]}.")
    groups = restarted_words(fold.restarted)
    if groups:
        said.append(f"{groups[0].upper()}{groups[1:]} (--replica_groups: each restart under the timeline).")
    return tuple(said)


def _facts(fold: _Fold, summary: Mapping[str, Any] | None, count: int) -> tuple[tuple[str, str], ...]:
    s = fold.started
    unix_ns = _int(s.get("unix_ns"))
    began = "unknown" if unix_ns is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_ns / 1e9))
    facts = [("started", began), ("xrun", _text(s.get("xrun"))), ("nodes", _text(s.get("nodes"))),
             ("world size", _text(s.get("world_size"))), ("hot spares", _text(s.get("spares"))),
             ("max restarts", _text(s.get("max_restarts"))), ("hang timeout (s)", _text(s.get("hang_timeout"))),
             ("hosts", ", ".join(_text(h) for h in s.get("hosts") or ())), ("state", _state(fold)),
             ("record lines", str(count))]
    goodput = _mapping((fold.job_ended or {}).get("goodput")) or _mapping((summary or {}).get("goodput"))
    if goodput:
        facts.append(("goodput", f"{_text(goodput.get('training_s'))} s training of {_text(goodput.get('wall_s'))} s "
                                 f"wall ({_share(goodput.get('share'))})"))
        for phase, seconds in _mapping(goodput.get("lost_s")).items():
            facts.append((f"lost to {_text(phase)} (s)", _text(seconds)))
    env = _mapping(s.get("env"))
    if "NUM_REPLICA_GROUPS" in env:  # the job's max restarts is 0 there: each group has its own budget
        facts.append(("replica groups", f"{_text(env['NUM_REPLICA_GROUPS'])}, each restarted alone up to "
                                        f"{_text(env.get('TORCHELASTIC_MAX_RESTARTS'))} time(s) (--max_restarts)"))
    if fold.restarted:
        facts.append(("replica group restarts", restarted_words(fold.restarted)))
    events = _mapping((summary or {}).get("events"))
    if events.get("dropped"):
        facts.append(("record lines dropped", _text(events.get("dropped"))))
    return tuple(facts)


def _share(value: Any) -> str:
    share = _float(value)
    return "unknown" if share is None else f"{share:.1%}"


# -- charts ----------------------------------------------------------------------------------------------------------

def _charts(samples: Sequence[Mapping[str, Any]], world: int) -> tuple[Chart, ...]:
    return (_lateness(samples), _usage(samples, "cpu_pct", "CPU", "% of one core", world),
            _usage(samples, "rss_mib", "Memory (RSS)", "MiB", world))


def _thinned(samples: Sequence[Mapping[str, Any]]) -> tuple[Sequence[Mapping[str, Any]], str | None]:
    if len(samples) <= POINTS:
        return samples, None
    step = math.ceil(len(samples) / POINTS)
    kept = [*samples[::step]] + ([samples[-1]] if (len(samples) - 1) % step else [])
    return kept, f"every {step}th of {len(samples)} samples drawn"


def _lateness(samples: Sequence[Mapping[str, Any]]) -> Chart:
    kept, note = _thinned(samples)
    peaks: dict[int, float] = {}
    for sample in samples:
        for rank, ms in _mapping(sample.get("late_ms")).items():
            r, v = int(rank) if isinstance(rank, str) and rank.isdecimal() else None, _float(ms)
            if r is not None and v is not None:
                peaks[r] = max(peaks.get(r, 0.0), v)
    ranks = sorted(sorted(peaks, key=lambda r: -peaks[r])[:LINES_UP_TO])
    if len(peaks) > LINES_UP_TO:
        note = "; ".join(filter(None, [note, f"the {LINES_UP_TO} latest of {len(peaks)} late ranks"]))
    series = tuple(Series(f"rank {rank}", tuple(_float(_mapping(s.get("late_ms")).get(str(rank))) or 0.0
                                                for s in kept)) for rank in ranks)
    return Chart("Lateness in collectives (median, ms after the others' median; 0: on time)", "ms",
                 tuple(_t(s) for s in kept), series, note)


def _usage(samples: Sequence[Mapping[str, Any]], key: str, title: str, unit: str, world: int) -> Chart:
    kept, note = _thinned([s for s in samples if isinstance(s.get(key), list)])
    columns = [[_float(v) for v in s[key]] for s in kept]
    if world <= LINES_UP_TO:
        width = max((len(c) for c in columns), default=0)
        series = tuple(Series(f"rank {r}", tuple(c[r] if r < len(c) else None for c in columns)) for r in range(width))
    else:
        known = [[v for v in c if v is not None] for c in columns]
        series = tuple(Series(name, tuple(pick(v) if v else None for v in known))
                       for name, pick in (("max over ranks", max), ("median over ranks", median),
                                          ("min over ranks", min)))
        note = "; ".join(filter(None, [note, f"{world} ranks: their spread drawn"]))
    return Chart(f"{title} by rank", unit, tuple(_t(s) for s in kept), series, note)


# -- the record's values, read defensively (a file is input, whoever wrote it) ------------------------------------

def _t(line: Mapping[str, Any]) -> float:
    return _float(line.get("t")) or 0.0


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    return "null" if value is None else value if isinstance(value, str) else str(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
