"""Many ranks' collective records as findings: where a hung job waits, who never came, what does not match
(issue 31). Pure functions over xrun.common.telemetry.records' ``RankCollectives``: no I/O, no clock.

``find_hang(records)`` compares every rank's last few collectives per process group (the sequence number is the
same collective on every rank of a group) and finds:

* **stuck** collectives: per group the first sequence number some rank of the group never entered while others
  did and wait in it (not completed): ``all_reduce #1204 on the default group ([4096] float32): ranks 0-6 wait in
  it; rank 7 (node3) never entered — at train.py:88 evaluate``. A rank that never entered it but waits in a
  collective of another group says so (``waits in broadcast #12 on group 2``): the chain ends at a rank that
  waits nowhere, and that group's line leads. When every rank entered it and none has completed it, the line
  says all of them wait (a collective stuck inside, or one whose peer is in another group);
* **mismatches**: ranks in different collectives at the same sequence number of a group, or in the same
  collective with different sizes or dtypes (the checks of torch's offline analyser ``fr_trace``, on the window
  each rank sent);
* ranks without a record (no endpoint, no answer in time, Flight Recorder off), named with why.

``HangFindings.lines()`` puts the root cause first: a stuck collective with a rank that waits nowhere, then a
mismatch, then the rest. The default group is every rank of the job; any other group is the ranks that recorded
it (the records do not carry a group's members).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrun.common.result.stackview import rank_ranges
from xrun.common.telemetry import DEFAULT_GROUP
from xrun.common.telemetry.records import Collective, GroupState, RankCollectives

_SHOWN_TENSORS = 3  # of a collective's tensors, described before "+N more"
_SHOWN_ABSENT = 8  # ranks named one by one (with host and place) before "and N more"
# torch's dtype names in the Flight Recorder -> the names a script writes (torch.float32, ...)
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Int": "int32",
    "Long": "int64", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "ComplexFloat": "complex64", "ComplexDouble": "complex128", "ComplexHalf": "complex32",
}
_NO_INPUT_SIZES = frozenset({"all_to_all", "scatter"})  # sizes that differ between ranks by design (fr_trace)
_NO_OUTPUT_SIZES = frozenset({"all_to_all", "gather"})
_NO_INPUT_DTYPES = frozenset({"scatter", "broadcast"})
_NO_OUTPUT_DTYPES = frozenset({"gather"})


@dataclass(frozen=True)
class Call:
    """What a rank called at one sequence number: the op and its tensors."""

    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, collective: Collective) -> Call:
        """The input tensors, or the output ones where there is no input."""
        if collective.in_sizes or not collective.out_sizes:
            return cls(collective.op, collective.in_sizes, collective.in_dtypes)
        return cls(collective.op, collective.out_sizes, collective.out_dtypes)

    def tensors(self) -> str:
        """``[4096] float32``, ``[8, 1024] bfloat16, [8] int64``; empty for a barrier."""
        parts = [f"[{', '.join(str(d) for d in size)}]" + (f" {dtype_name(self.dtypes[i])}"
                                                           if i < len(self.dtypes) else "")
                 for i, size in enumerate(self.sizes[:_SHOWN_TENSORS])]
        if len(self.sizes) > _SHOWN_TENSORS:
            parts.append(f"+{len(self.sizes) - _SHOWN_TENSORS} more")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "sizes": [list(s) for s in self.sizes], "dtypes": list(self.dtypes)}


@dataclass(frozen=True)
class Absent:
    """A rank of a group that never entered the stuck collective."""

    rank: int
    host: str
    last_seq: int | None  # the last collective of the group it entered (None: none in its window)
    where: str | None  # its main thread's place
    waits_in: str | None  # a collective of another group it waits in ("broadcast #12 on group 2")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "last_seq": self.last_seq, "where": self.where,
                "waits_in": self.waits_in}


@dataclass(frozen=True)
class Unread:
    """A rank without a record, and why."""

    rank: int
    host: str
    problem: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "problem": self.problem}


@dataclass(frozen=True)
class Stuck:
    """The collective a group waits in: who waits in it, who never entered it, who could not be read."""

    group: str
    label: str  # "the default group", "group 3 (tp)"
    seq: int
    call: Call | None  # None: no rank's window still holds it
    waiting: tuple[int, ...]
    absent: tuple[Absent, ...]
    unread: tuple[Unread, ...] = ()

    @property
    def leads(self) -> bool:
        """Some rank never entered it and waits in no other collective: this is where the job is held."""
        return any(a.waits_in is None for a in self.absent)

    def line(self) -> str:
        name = f"{self.call.op} #{self.seq}" if self.call else f"collective #{self.seq}"
        tensors = f" ({self.call.tensors()})" if self.call and self.call.sizes else ""
        verb = "waits" if len(self.waiting) == 1 else "all wait" if not self.absent and not self.unread else "wait"
        parts = [f"{name} on {self.label}{tensors}: {_ranks(self.waiting)} {verb} in it"]
        parts += [_absent_text(a) for a in self.absent[:_SHOWN_ABSENT]]
        if len(self.absent) > _SHOWN_ABSENT:
            rest = self.absent[_SHOWN_ABSENT:]
            parts.append(f"{_ranks(a.rank for a in rest)} never entered either")
        if self.unread:
            parts.append(f"{_ranks(u.rank for u in self.unread)} sent no record")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "seq": self.seq,
                "call": self.call.to_json() if self.call else None, "waiting": list(self.waiting),
                "absent": [a.to_json() for a in self.absent], "unread": [u.rank for u in self.unread]}


class MismatchKind(enum.Enum):
    OP = "different collectives"
    SIZES = "different sizes"
    DTYPES = "different dtypes"


@dataclass(frozen=True)
class Mismatch:
    """Ranks of a group that called different things at the same sequence number."""

    group: str
    label: str
    seq: int
    kind: MismatchKind
    variants: tuple[tuple[Call, tuple[int, ...]], ...]  # each call and its ranks, the most common first

    def line(self) -> str:
        if self.kind is MismatchKind.OP:
            shown = [f"{_ranks(ranks)} in {call.op}" + (f" ({call.tensors()})" if call.sizes else "")
                     for call, ranks in self.variants]
            return f"#{self.seq} on {self.label}: ranks in different collectives: {', '.join(shown)}"
        shown = [f"{_ranks(ranks)} {call.tensors() or 'no tensors'}" for call, ranks in self.variants]
        op = self.variants[0][0].op
        return f"{op} #{self.seq} on {self.label} with {self.kind.value}: {', '.join(shown)}"

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "label": self.label, "seq": self.seq, "kind": self.kind.name.lower(),
                "variants": [{"call": c.to_json(), "ranks": list(r)} for c, r in self.variants]}


@dataclass(frozen=True)
class HangFindings:
    stuck: tuple[Stuck, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    unread: tuple[Unread, ...] = ()
    ranks: int = 0  # records compared

    def lines(self) -> list[str]:
        """The root cause first (a stuck collective some rank never entered and that rank waits nowhere else,
        then a mismatch, then the other stuck collectives), then the ranks without a record."""
        leading = [s.line() for s in self.stuck if s.leads]
        others = [s.line() for s in self.stuck if not s.leads]
        lines = leading + [m.line() for m in self.mismatches] + others
        if self.unread:
            why = sorted({u.problem for u in self.unread})
            lines.append(f"no collective record from {_ranks(u.rank for u in self.unread)}: {'; '.join(why[:3])}")
        return lines

    @property
    def root_cause(self) -> str | None:
        lines = self.lines()
        return lines[0] if lines and (self.stuck or self.mismatches) else None

    def to_json(self) -> dict[str, Any]:
        return {"root_cause": self.root_cause, "stuck": [s.to_json() for s in self.stuck],
                "mismatches": [m.to_json() for m in self.mismatches],
                "unread": [u.to_json() for u in self.unread], "ranks": self.ranks}


def find_hang(records: Iterable[RankCollectives], *, world_size: int | None = None) -> HangFindings:
    """Every rank's record compared (a rank sent twice: the last counts). ``world_size``: the ranks of the default
    group; one that sent nothing is unread."""
    by_rank = {r.rank: r for r in records}
    unread = {r.rank: Unread(r.rank, r.host, r.problem) for r in by_rank.values() if r.problem is not None}
    for rank in range(world_size or 0):
        if rank not in by_rank:
            unread[rank] = Unread(rank, "", "no record came back (it had exited, or its node did not answer)")
    read = {rank: r for rank, r in by_rank.items() if r.problem is None}
    groups = sorted({g.name for r in read.values() for g in r.groups}, key=_group_order)
    waits = {rank: _waiting_in(r) for rank, r in read.items()}
    stuck, mismatches = [], []
    for name in groups:
        states = {rank: r.group(name) for rank, r in read.items()}
        members = {rank for rank, g in states.items() if g is not None}
        if name == DEFAULT_GROUP:
            members = set(read)
        found = _stuck(name, {rank: states[rank] for rank in members}, read, waits,
                       [u for u in unread.values() if name == DEFAULT_GROUP])
        if found is not None:
            stuck.append(found)
        mismatches += _mismatches(name, {rank: g for rank, g in states.items() if g is not None})
    # where the chain of waits ends first: a rank that waits nowhere, and no absent rank that waits elsewhere
    stuck.sort(key=lambda s: (not s.leads, any(a.waits_in for a in s.absent), _group_order(s.group)))
    return HangFindings(tuple(stuck), tuple(mismatches), tuple(sorted(unread.values(), key=lambda u: u.rank)),
                        len(by_rank))


def label(name: str, desc: str) -> str:
    """``the default group``, ``group 3 (tp)``: how a line names a process group."""
    if name == DEFAULT_GROUP:
        return "the default group"
    return f"group {name}" + (f" ({desc})" if desc and desc not in ("undefined", "default_pg") else "")


def dtype_name(name: str) -> str:
    return _DTYPES.get(name, name.lower())


# -- stuck ---------------------------------------------------------------------------------------------------


def _stuck(name: str, states: Mapping[int, GroupState | None], read: Mapping[int, RankCollectives],
           waits: Mapping[int, list[tuple[str, Collective]]], unread: Sequence[Unread]) -> Stuck | None:
    last = {rank: _last_seq(g) for rank, g in states.items()}
    if not last or max(last.values()) == 0:
        return None
    behind = [rank for rank, seq in last.items() if seq < max(last.values())]
    seq = min(last[rank] for rank in behind) + 1 if behind else max(last.values())
    entered = sorted(rank for rank, s in last.items() if s >= seq)
    calls = {rank: c for rank in entered for c in _at(states[rank], seq)}
    waiting = tuple(rank for rank in entered if not _done(states[rank], calls.get(rank), seq))
    if not waiting:
        return None  # it completed: the ranks behind were read a moment early, nothing is held here
    desc = next((g.desc for g in states.values() if g is not None), "")
    absent = tuple(Absent(rank, read[rank].host, last[rank] or None, read[rank].where,
                          _elsewhere(waits[rank], name)) for rank in sorted(behind, key=lambda r: (last[r], r))
                   if last[rank] < seq)
    return Stuck(name, label(name, desc), seq, _common(calls.values()), waiting, absent, tuple(unread))


def _last_seq(state: GroupState | None) -> int:
    last = state.last_entered if state is not None else None
    return last.seq if last is not None else 0


def _at(state: GroupState | None, seq: int) -> list[Collective]:
    return [c for c in state.recent if c.seq == seq] if state is not None else []


def _done(state: GroupState | None, collective: Collective | None, seq: int) -> bool:
    """The rank completed collective ``seq`` of this group (torch's entry, or its group counter)."""
    if collective is not None and collective.finished:
        return True
    return state is not None and state.last_completed is not None and state.last_completed >= seq


def _waiting_in(record: RankCollectives) -> list[tuple[str, Collective]]:
    """Each group's last collective the rank entered and has not completed."""
    found = []
    for group in record.groups:
        last = group.last_entered
        if last is not None and not _done(group, last, last.seq):
            found.append((group.name, last))
    return found


def _elsewhere(waits: list[tuple[str, Collective]], group: str) -> str | None:
    other = [(name, c) for name, c in waits if name != group]
    if not other:
        return None
    name, collective = min(other, key=lambda pair: _group_order(pair[0]))
    return f"{collective.op} #{collective.seq} on {label(name, '')}"


def _common(collectives: Iterable[Collective]) -> Call | None:
    """The call most ranks made (ties: the first rank's)."""
    counts: dict[Call, int] = {}
    for collective in collectives:
        call = Call.of(collective)
        counts[call] = counts.get(call, 0) + 1
    return max(counts, key=lambda call: counts[call]) if counts else None


def _absent_text(absent: Absent) -> str:
    text = f"rank {absent.rank}" + (f" ({absent.host})" if absent.host else "") + " never entered"
    if absent.waits_in is not None:
        return f"{text} — waits in {absent.waits_in}"
    return f"{text} — at {absent.where}" if absent.where else text


# -- mismatches ----------------------------------------------------------------------------------------------


def _mismatches(name: str, states: Mapping[int, GroupState]) -> list[Mismatch]:
    by_seq: dict[int, dict[int, Collective]] = {}
    for rank, state in states.items():
        for collective in state.recent:
            by_seq.setdefault(collective.seq, {})[rank] = collective
    desc = next((g.desc for g in states.values()), "")
    found = []
    for seq in sorted(by_seq):
        calls = by_seq[seq]
        for kind, key in ((MismatchKind.OP, _op_key), (MismatchKind.SIZES, _size_key),
                          (MismatchKind.DTYPES, _dtype_key)):
            variants: dict[object, list[int]] = {}
            for rank in sorted(calls):
                variants.setdefault(key(calls[rank]), []).append(rank)
            if len(variants) > 1:
                ordered = sorted(variants.values(), key=lambda ranks: (-len(ranks), ranks[0]))
                found.append(Mismatch(name, label(name, desc), seq, kind,
                                      tuple((Call.of(calls[ranks[0]]), tuple(ranks)) for ranks in ordered)))
                break  # one finding per sequence number: the first kind that differs
    return found


def _op_key(c: Collective) -> object:
    return c.op


def _size_key(c: Collective) -> object:
    return (None if c.op in _NO_INPUT_SIZES else c.in_sizes, None if c.op in _NO_OUTPUT_SIZES else c.out_sizes)


def _dtype_key(c: Collective) -> object:
    return (None if c.op in _NO_INPUT_DTYPES or not c.in_sizes else frozenset(c.in_dtypes),
            None if c.op in _NO_OUTPUT_DTYPES or not c.out_sizes else frozenset(c.out_dtypes))


# -- words ---------------------------------------------------------------------------------------------------


def _ranks(ranks: Iterable[int]) -> str:
    """``rank 7``, ``ranks 0-6, 8``."""
    ordered = sorted(set(ranks))
    if len(ordered) <= 1:
        return f"rank {ordered[0]}" if ordered else "no rank"
    return f"ranks {rank_ranges(ordered)}"


def _group_order(name: str) -> tuple[int, int, str]:
    """The default group first, then by number (torch names groups "0", "1", ...), then by name."""
    return (name != DEFAULT_GROUP, int(name) if name.isascii() and name.isdigit() else 1 << 62, name)


def view_lines(findings: HangFindings, files: Sequence[str] = ()) -> list[str]:
    """The findings as a report shows them: a title, the root cause first, and where the full records are."""
    if not findings.ranks:
        return []
    title = f"collectives of {findings.ranks} rank(s) (torch's Flight Recorder)"
    lines = findings.lines()
    if not lines:
        out = [f"{title}: none is waited in, none mismatched"]
    else:
        heading = f"{title}, the root cause first:" if findings.root_cause else f"{title}:"
        out = [heading, *(f"  {line}" for line in lines)]
    return out + [f"  full records: {path}" for path in files]
