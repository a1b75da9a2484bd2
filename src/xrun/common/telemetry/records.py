"""A rank's Flight Recorder dump as the compact records that cross the channel (pure).

torch's ``fr_trace_json`` holds up to ``TORCH_FR_BUFFER_SIZE`` entries, each a collective a process group of the
rank entered: its sequence number in that group (``collective_seq_id``: the same collective has the same number on
every rank of the group), ``profiling_name`` (``gloo:all_reduce``, ``nccl:broadcast``), the tensors' sizes and
dtypes, its ``state`` and the wall-clock time it was created (``time_created_ns``; NCCL adds when it was seen to
start and complete). Two summaries of it travel, never the dump itself (it stays on the node: reads):

* ``RankCollectives`` (a hang, Ctrl-\\, a failure): per process group the last ``RECENT`` collectives the rank
  entered and what torch says it last enqueued and completed, and ``where`` the rank's main thread is (the
  innermost frame outside torch of ``dump_traceback``'s text). The head compares them across ranks
  (xrun.common.result.collectiveview).
* ``EntryTimes`` (sampled while the job trains): per group, when the rank entered the collectives on a grid
  every rank picks alike, each reported once (``EntrySampler``), so the head finds the same collectives in every
  rank's samples even when the nodes are asked at their own times, and scores who enters late
  (xrun.common.result.stragglers).

A rank that has exited is read from what it left at its exit (``parse_left_records``: its dump and the traceback
it died of); the collective it died in is marked ``failed`` there (``with_failure``: gloo retires a failed
collective as a completed one).

Point-to-point entries (send/recv) are left out: they have no common sequence number across a group. A dump
that is not torch's format raises ``ValueError`` (the rank's answer is data, never trusted).

The messages (stable: the head reads them with ``read_collectives`` and ``read_entry_times``; a field added later
must be optional, and a reader ignores fields it does not know)::

    collectives  {"id": <the dump's id: an int, or "stop" before a stop>, "ranks": [RankCollectives, ...],
                  "file": <the full records' path on the node> (absent: none written)}
                 sent just before the node's ``stacks`` of the same id
    RankCollectives  {"host", "rank", "where": "train.py:88 evaluate" | null, "problem": <why no record> | null,
                      "groups": [{"name": "0", "desc": "default_pg", "last_enqueued": int | null,
                                  "last_completed": int | null, "recent": [Collective, ...]  (oldest first)}]}
    Collective  {"seq", "op": "all_reduce", "in_sizes": [[4096]], "in_dtypes": ["Float"], "out_sizes",
                 "out_dtypes", "state": "scheduled" | "started" | "completed" | "failed", "retired": bool,
                 "created_ns": <the node's wall clock>, "started_ns": int | null, "completed_ns": int | null}
    entry_times  {"ranks": [{"rank", "groups": [{"name", "seq": [int, ...], "base_ns": int,
                                                  "t_us": [<microseconds after base_ns>, ...]}]}]}

Every list and text is bounded (``MAX_*`` below and ``xrun.channel.fields``): the node cuts its records to the
bounds, the head refuses a message beyond them (a protocol error).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xrun.channel import STOP_STACKS, Kind, Message, message
from xrun.channel.fields import COLLECTIVES_FIELDS, ENTRY_TIMES_FIELDS, Field, FieldKind, fields_error

RECENT = 4  # collectives per group in a hang's summary: the one waited in, and those before it to compare
# a straggler sample's collectives per rank and group: the head scores every rank of each (the head's work is
# world size x this, every sample period), so a big job samples fewer; at least a few, to name a straggler soon
SCORES_PER_SAMPLE = 32_768  # rank-collectives a sample period brings the head at most (past the smallest share)
FEWEST_PICKED, MOST_PICKED = 6, 16
MAX_PICKED = 64  # what the head accepts from one rank's group in one sample
# what one rank's record may hold: the node keeps the groups that entered a collective last, and the first
# tensors and dimensions of each (every rank cuts alike, so the head's comparisons still hold)
MAX_GROUPS = 64
MAX_TENSORS = 16
MAX_DIMS = 16
_NAME = Field(FieldKind.TEXT, 256)  # a group's name and description, an op, a dtype
_LINE = Field(FieldKind.TEXT, 512)  # where, problem
_HOST = Field(FieldKind.TEXT, 255)


@dataclass(frozen=True)
class Collective:
    """One collective a rank entered."""

    seq: int  # its number in the process group
    op: str  # "all_reduce" (torch's backend prefix dropped)
    in_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]  # torch's names: "Float", "BFloat16"
    out_sizes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    state: str  # "scheduled", "started", "completed" (gloo's entries stay "scheduled"; NCCL's move on), or
    # FAILED: the rank died of an error raised in it (``with_failure``: read from what it left at its exit)
    retired: bool  # torch is done with it (gloo: it completed)
    created_ns: int  # wall clock (the node's) when the rank entered it
    started_ns: int | None = None  # NCCL: when it was seen to start (TORCH_NCCL_ENABLE_TIMING) or complete
    completed_ns: int | None = None

    @property
    def finished(self) -> bool:
        return self.state == "completed" or self.retired

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "op": self.op, "in_sizes": [list(s) for s in self.in_sizes],
                "in_dtypes": list(self.in_dtypes), "out_sizes": [list(s) for s in self.out_sizes],
                "out_dtypes": list(self.out_dtypes), "state": self.state, "retired": self.retired,
                "created_ns": self.created_ns, "started_ns": self.started_ns, "completed_ns": self.completed_ns}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Collective:
        return cls(_count(data["seq"]), _text(data["op"]), _sizes(data["in_sizes"]), _texts(data["in_dtypes"]),
                   _sizes(data["out_sizes"]), _texts(data["out_dtypes"]), _text(data["state"]),
                   bool(data["retired"]), _count(data["created_ns"]), _maybe(data.get("started_ns")),
                   _maybe(data.get("completed_ns")))


@dataclass(frozen=True)
class GroupState:
    """One process group as one rank saw it."""

    name: str  # torch's name of the group: the same on every rank ("0" is the default group)
    desc: str  # its description ("default_pg", or what the script named it)
    recent: tuple[Collective, ...]  # the last RECENT collectives it entered, oldest first
    last_enqueued: int | None = None  # torch's own counters (pg_status), when the dump has them
    last_completed: int | None = None

    @property
    def last_entered(self) -> Collective | None:
        return self.recent[-1] if self.recent else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "desc": self.desc, "recent": [c.to_json() for c in self.recent],
                "last_enqueued": self.last_enqueued, "last_completed": self.last_completed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupState:
        return cls(_text(data["name"]), _text(data["desc"]),
                   tuple(Collective.from_json(c) for c in _list(data["recent"], RECENT)),
                   _maybe(data.get("last_enqueued")), _maybe(data.get("last_completed")))


@dataclass(frozen=True)
class RankCollectives:
    """One rank's collective state: its groups, where its main thread is, or why there is no record."""

    host: str
    rank: int
    groups: tuple[GroupState, ...] = ()
    where: str | None = None  # "train.py:88 evaluate": the main thread's innermost frame outside torch
    problem: str | None = None  # no record: why (no endpoint, no answer in time, Flight Recorder off)

    def group(self, name: str) -> GroupState | None:
        return next((g for g in self.groups if g.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "groups": [g.to_json() for g in self.groups],
                "where": self.where, "problem": self.problem}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankCollectives:
        """What an agent sent; anything malformed raises ValueError (a protocol error)."""
        try:
            where, problem = data.get("where"), data.get("problem")
            return cls(_text(data["host"], _HOST), _count(data["rank"]),
                       tuple(GroupState.from_json(g) for g in _list(data["groups"], MAX_GROUPS)),
                       None if where is None else _text(where, _LINE),
                       None if problem is None else _text(problem, _LINE))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"malformed collective record: {err!r}") from None


@dataclass(frozen=True)
class GroupTimes:
    """When a rank entered some collectives of one group: sequence numbers and wall-clock times, paired."""

    name: str
    seqs: tuple[int, ...]
    created_ns: tuple[int, ...]


@dataclass(frozen=True)
class EntryTimes:
    """One rank's sample: per group, when it entered the collectives ``grid`` picks."""

    rank: int
    groups: tuple[GroupTimes, ...]

    def to_json(self) -> dict[str, Any]:
        """Compact: times in microseconds after the first (a node sends its ranks' samples every few seconds)."""
        groups = []
        for g in self.groups:
            base = min(g.created_ns, default=0)
            groups.append({"name": g.name, "seq": list(g.seqs), "base_ns": base,
                           "t_us": [(t - base) // 1000 for t in g.created_ns]})
        return {"rank": self.rank, "groups": groups}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EntryTimes:
        try:
            groups = []
            for g in _list(data["groups"], MAX_GROUPS):
                seqs, times, base = _counts(g["seq"], MAX_PICKED), _counts(g["t_us"], MAX_PICKED), _count(g["base_ns"])
                if len(seqs) != len(times):
                    raise ValueError("seq and t_us differ in length")
                groups.append(GroupTimes(_text(g["name"]), seqs, tuple(base + t * 1000 for t in times)))
            return cls(_count(data["rank"]), tuple(groups))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"malformed entry times: {err!r}") from None


@dataclass(frozen=True)
class CollectivesReport:
    """A node's ``collectives`` message: its ranks' records for one dump (``dump_id``: the dump's id, or
    ``STOP_STACKS``), and where the full records are on the node."""

    dump_id: int | str
    ranks: tuple[RankCollectives, ...]
    file: str | None = None


@dataclass(frozen=True)
class Reading:
    """One reading of a node's ranks: every asked rank's record (or why there is none), and the full answers."""

    collectives: tuple[RankCollectives, ...]
    full: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # rank -> dump and stacks: node only
    file: str | None = None  # where ``full`` was written on this node, once it is
    folder: str | None = None  # and the same dumps for torch's analyser, one per rank (xrun.launch.telemetry.frtrace)
    at_exit: tuple[int, ...] = ()  # ranks read from what they left at their exit (their socket was gone)
    no_group: frozenset[int] = frozenset()  # ranks known to have had no process group (never served, or none made)

    @property
    def grouped(self) -> bool:
        """Some rank had a process group, or may have had one (a rank that did not answer): else the job has no
        collectives to report, and a report leaves them out (issue 37 §6)."""
        return any(c.rank not in self.no_group for c in self.collectives)

    def line(self) -> str:
        """Where the full collective records are, or why there are none (for the node's console)."""
        recorded = [c for c in self.collectives if c.problem is None]
        if self.file is None:
            problems = sorted({c.problem for c in self.collectives if c.problem})
            return f"no collective records from the ranks: {problems[0] if problems else 'nothing was recorded'}"
        left = f", {len(self.at_exit)} of them as left at their exit" if self.at_exit else ""
        analyser = f"; torchfrtrace reads {self.folder}" if self.folder is not None else ""
        return (f"collective records of {len(recorded)} of {len(self.collectives)} ranks (torch's Flight Recorder"
                f"{left}) in {self.file}{analyser}")

    def message(self, dump_id: int | str) -> Message:
        """The part that crosses the channel, as the ``collectives`` message of the dump ``dump_id``: the records and
        where the full answers are on the node."""
        return collectives_message(CollectivesReport(dump_id, self.collectives, self.file))


def collectives_message(report: CollectivesReport) -> Message:
    file = {} if report.file is None else {"file": report.file}
    return message(Kind.COLLECTIVES, id=report.dump_id, ranks=[r.to_json() for r in report.ranks], **file)


def read_collectives(msg: Message) -> CollectivesReport:
    """An agent's ``collectives`` message, every field checked; ValueError (a protocol error) when one is odd."""
    problem = fields_error(msg, COLLECTIVES_FIELDS)
    if problem is not None:
        raise ValueError(problem.reason)
    dump_id = msg.get("id")
    if dump_id != STOP_STACKS and (isinstance(dump_id, bool) or not isinstance(dump_id, int)):
        raise ValueError(f"collectives: id {str(dump_id)[:40]!r} is neither a dump's number nor {STOP_STACKS!r}")
    file = msg.get("file")
    return CollectivesReport(dump_id, tuple(RankCollectives.from_json(r) for r in msg["ranks"]),
                             None if file is None else str(file))


def entry_times_message(samples: Iterable[EntryTimes]) -> Message:
    return message(Kind.ENTRY_TIMES, ranks=[s.to_json() for s in samples])


def read_entry_times(msg: Message) -> tuple[EntryTimes, ...]:
    """An agent's ``entry_times`` message, every field checked; ValueError (a protocol error) when one is odd."""
    problem = fields_error(msg, ENTRY_TIMES_FIELDS)
    if problem is not None:
        raise ValueError(problem.reason)
    return tuple(EntryTimes.from_json(r) for r in msg["ranks"])


# -- from torch's dump ---------------------------------------------------------------------------------------


def parse_dump(body: bytes) -> dict[str, Any]:
    """``fr_trace_json``'s answer as a dict with a list of ``entries``; ValueError when it is not that."""
    try:
        dump = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"the Flight Recorder's dump is not JSON ({err.__class__.__name__})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
        raise ValueError("the Flight Recorder's dump has no list of entries")
    return dump


def parse_left_records(body: bytes) -> tuple[dict[str, Any], str | None]:
    """What a rank left at its exit (``rank<N>.last.json``, written by its ``sitecustomize``): its Flight
    Recorder's dump and the traceback it died of (faulthandler's format, or None); ValueError when it is not
    that."""
    try:
        left = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"the records left at exit are not JSON ({err.__class__.__name__})") from None
    if not isinstance(left, dict) or not isinstance(left.get("flight_recorder"), dict):
        raise ValueError("the records left at exit hold no Flight Recorder dump")
    dump, traceback = left["flight_recorder"], left.get("traceback")
    if not isinstance(dump.get("entries", []), list):
        raise ValueError("the Flight Recorder's dump has no list of entries")
    return dump, traceback if isinstance(traceback, str) else None


FAILED = "failed"  # a Collective's state in what a rank left at its exit: it died of an error raised in it


def with_failure(dump: Mapping[str, Any], traceback: str | None) -> Mapping[str, Any]:
    """What a rank left at its exit, with the collective it died in marked ``failed`` (not retired, and its
    group's completed counter below it).

    gloo retires a collective that failed (its timeout, a peer gone) as it does one that completed, and counts
    it completed: by the rank's exit its entry reads done. A rank whose exit traceback ends inside
    ``torch.distributed`` died of the collective it was in, the newest it entered (the call that raised); marked,
    it reads as what it was until it failed, a wait (issue 37 §2). Any other exit leaves the dump as it is."""
    if traceback is None or not _raised_in_torch_distributed(traceback):
        return dump
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict) and not e.get("is_p2p")]
    if not entries:
        return dump
    try:
        newest = max(entries, key=lambda e: _count(e.get("record_id", 0)))
        seq = _count(newest["collective_seq_id"])
    except (KeyError, ValueError):
        return dump
    marked = {**newest, "state": FAILED, "retired": False}
    status = dict(_mapping(dump.get("pg_status")))
    pg_id = str(newest.get("pg_id", ""))
    counters = _mapping(status.get(pg_id))
    completed = _counter(counters.get("last_completed_collective"))
    if completed is not None and completed >= seq:
        status[pg_id] = {**counters, "last_completed_collective": str(seq - 1)}
    return {**dump, "entries": [marked if e is newest else e for e in dump.get("entries") or []],
            "pg_status": status}


def _raised_in_torch_distributed(traceback: str) -> bool:
    """faulthandler's format, innermost frame first: is that frame's file in torch's ``distributed`` package?"""
    for line in traceback.splitlines():
        match = _FRAME.match(line)
        if match:
            parts = match["file"].replace("\\", "/").split("/")
            return any(a == "torch" and b == "distributed" for a, b in zip(parts, parts[1:]))
    return False


def collectives(dump: Mapping[str, Any]) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """The dump's collective entries by group name, oldest first, each with the group's description."""
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for entry in dump.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg = entry.get("process_group")
        name, desc = (str(pg[0]), str(pg[1])) if isinstance(pg, list) and len(pg) == 2 else (str(pg), "")
        groups.setdefault(name, []).append((desc, entry))
    for entries in groups.values():
        entries.sort(key=lambda pair: _count(pair[1].get("collective_seq_id", 0)))
    return groups


def rank_collectives(host: str, rank: int, dump: Mapping[str, Any], *, where: str | None = None) -> RankCollectives:
    """The hang summary of one rank's dump (ValueError when an entry is not torch's format)."""
    status = _mapping(dump.get("pg_status"))
    groups = []
    try:
        for name, entries in _latest_groups(collectives(dump)):
            desc = entries[-1][0]
            counters = _mapping(status.get(str(entries[-1][1].get("pg_id", ""))))
            recent = tuple(_collective(entry) for _, entry in entries[-RECENT:])
            groups.append(GroupState(name[: _NAME.limit], desc[: _NAME.limit], recent,
                                     _counter(counters.get("last_enqueued_collective")),
                                     _counter(counters.get("last_completed_collective"))))
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"a Flight Recorder entry is not torch's format: {err!r}") from None
    return RankCollectives(host, rank, tuple(groups), where=None if where is None else where[: _LINE.limit])


def picked_per_sample(world_size: int) -> int:
    """How many collectives of a group each rank's straggler sample reports, at most (``SCORES_PER_SAMPLE``)."""
    return max(FEWEST_PICKED, min(MOST_PICKED, SCORES_PER_SAMPLE // max(world_size, 1)))


class EntrySampler:
    """A node's straggler samples: each rank's entry times into the collectives on the job's grid, each collective
    reported once.

    The grid is the multiples of a power of two, the ``stride``, chosen at each sample from how many collectives
    the group entered since the last one (those the buffer still holds): the finest that leaves at most
    ``per_sample`` new ones. Every rank of a group enters collectives at the same pace and every node samples at
    the same moments (xrun.launch.doctor.node_doctor), so every node picks the same stride; where two strides
    meet (a pace on a boundary), the coarser one's multiples are the finer one's too, and the head scores those.
    Reporting each only once keeps the samples small: at 1,000 nodes the head decodes and reads every one
    (``picked_per_sample``)."""

    def __init__(self, per_sample: int) -> None:
        self.per_sample = per_sample
        self._seen: dict[tuple[int, str], int] = {}  # (rank, group) -> the newest number at the last sample

    def sample(self, rank: int, dump: Mapping[str, Any]) -> EntryTimes:
        """One rank's sample from its dump (ValueError when an entry is not torch's format)."""
        groups = []
        try:
            for name, entries in _latest_groups(collectives(dump)):
                created = {_count(e["collective_seq_id"]): _count(e["time_created_ns"]) for _, e in entries}
                picked = self.pick(rank, name, created)
                if picked:
                    groups.append(GroupTimes(name[: _NAME.limit], tuple(picked), tuple(created[s] for s in picked)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"a Flight Recorder entry is not torch's format: {err!r}") from None
        return EntryTimes(rank, tuple(groups))

    def pick(self, rank: int, group: str, seqs: Iterable[int]) -> list[int]:
        """Of the numbers in a rank's buffer now, those this sample reports, ascending."""
        present = sorted(seqs)
        if not present:
            return []
        key, newest = (rank, group), present[-1]
        seen = self._seen.get(key, -1)
        if newest < seen:
            seen = -1  # numbered from the start again: the rank was restarted
        # of the collectives entered since the last sample that the buffer still holds (a job faster than the
        # buffer: the last ones, on every node alike), those on the grid of their count
        fresh = [s for s in present if s > seen]
        stride = grid_stride(len(fresh), self.per_sample)
        self._seen[key] = newest
        return [s for s in fresh if s % stride == 0][-self.per_sample:]


def grid_stride(entered: int, per_sample: int) -> int:
    """The finest power of two with at most ``per_sample`` multiples among ``entered`` consecutive numbers."""
    stride = 1
    while entered > stride * per_sample:
        stride *= 2
    return stride


def _latest_groups(
    groups: Mapping[str, list[tuple[str, Mapping[str, Any]]]],
) -> list[tuple[str, list[tuple[str, Mapping[str, Any]]]]]:
    """The ``MAX_GROUPS`` groups that entered a collective last (a job rarely has more), in torch's order."""
    if len(groups) <= MAX_GROUPS:
        return list(groups.items())
    latest = set(sorted(groups, key=lambda g: _count(groups[g][-1][1].get("time_created_ns", 0)))[-MAX_GROUPS:])
    return [(name, entries) for name, entries in groups.items() if name in latest]


_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def where_from_traceback(text: str) -> str | None:
    """``dump_traceback``'s text (faulthandler's format, innermost frame first, thread by thread): the innermost
    frame outside torch of the thread that runs the script (its outermost frame is ``<module>`` or runpy's)."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append((match["file"], int(match["line"]), match["func"]))
    main = next((t for t in threads if t and (t[-1][2] == "<module>" or "runpy" in t[-1][0])), None)
    if main is None:
        return None
    outside = [f for f in main if not _in_torch(f[0])] or main
    path, number, func = outside[0]
    return f"{os.path.basename(path)}:{number} {func}"


def _in_torch(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return "torch" in parts[:-1] or "runpy.py" in parts[-1:]


def _collective(entry: Mapping[str, Any]) -> Collective:
    name = str(entry["profiling_name"])
    return Collective(
        seq=_count(entry["collective_seq_id"]),
        op=name.split(":", 1)[-1][: _NAME.limit],
        in_sizes=_cut_sizes(entry.get("input_sizes", [])), in_dtypes=_cut_texts(entry.get("input_dtypes", [])),
        out_sizes=_cut_sizes(entry.get("output_sizes", [])), out_dtypes=_cut_texts(entry.get("output_dtypes", [])),
        state=str(entry.get("state", ""))[: _NAME.limit], retired=bool(entry.get("retired")),
        created_ns=_count(entry["time_created_ns"]),
        started_ns=_maybe(entry.get("time_discovered_started_ns")) or None,
        completed_ns=_maybe(entry.get("time_discovered_completed_ns")) or None,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _counter(value: object) -> int | None:
    """pg_status's counters are strings, ``-1`` for none."""
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if number >= 0 else None


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value


def _counts(value: object, limit: int) -> tuple[int, ...]:
    """A list of at most ``limit`` counts (one pass: the head reads thousands of these a second at scale)."""
    items = _list(value, limit)
    if not all(type(v) is int and v >= 0 for v in items):  # type(), not isinstance: True is not a count
        raise ValueError(f"{str(value)[:40]!r} is not a list of counts")
    return tuple(items)


def _maybe(value: object) -> int | None:
    return None if value is None else _count(value)


def _text(value: object, field: Field = _NAME) -> str:
    problem = field.problem(value)
    if problem is not None:
        raise ValueError(f"{str(value)[:40]!r}: {problem}")
    assert isinstance(value, str)
    return value


def _texts(value: object) -> tuple[str, ...]:
    return tuple(_text(v) for v in _list(value, MAX_TENSORS))


def _list(value: object, limit: int) -> Sequence[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise ValueError(f"{str(value)[:40]!r} is not a list of at most {limit} items")
    return value


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(_count(d) for d in _list(s, MAX_DIMS)) for s in _list(value, MAX_TENSORS))


def _cut_sizes(value: object) -> tuple[tuple[int, ...], ...]:
    """torch's sizes, cut to the bounds (a rank's dump: longer lists are fine, only the first ones travel)."""
    if not isinstance(value, list):
        raise ValueError(f"{str(value)[:40]!r} is not a list")
    return _sizes([s[:MAX_DIMS] if isinstance(s, list) else s for s in value[:MAX_TENSORS]])


def _cut_texts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{str(value)[:40]!r} is not a list")
    return tuple(str(v)[: _NAME.limit] for v in value[:MAX_TENSORS])
