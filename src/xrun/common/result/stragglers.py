"""Who makes everyone wait: every rank scored by how often and by how much it enters collectives after the others
(issue 31). Pure: samples, clock offsets and nothing else in; scores and lines out; no I/O, no clock read.

The samples are xrun.common.telemetry.records' ``EntryTimes``: per process group, when a rank entered some
collectives, by its node's wall clock. A collective (group, sequence number) is scored once every rank that
takes part in the group (the default group: every rank of the job) has reported it: each rank's **lateness** is
its entry time minus the median entry time of the *others* (with two ranks: the gap between them), so a rank
that is late is late by what the others wait.

**Clocks.** Ranks of one node share its clock. Across nodes the times are put on the head's clock with each
node's offset, measured from the control channel's pings (``ClockOffsets``: the agent's clock when the ping came,
against the midpoint of the ping's round trip; the estimate with the shortest round trip of the last few wins, as
NTP does, and its uncertainty is half that round trip). Measures that need no shared clock (the time each rank
waits inside a collective) need its completion time, which gloo does not record, so the offsets it is. A node
without an estimate yet is not scored, and a rank counts as late only past ``LATE_FLOOR_NS`` plus twice the worst
uncertainty of the nodes compared: a clock error cannot make a straggler.

**The rule** (``docs/telemetry.md``): a rank is a straggler when it was late in at least ``FLAG_AT`` of its last
``DECIDE_OVER`` scored collectives (at least ``MIN_SCORED`` of them), and has recovered when that share falls
below ``CLEAR_BELOW``; between the two nothing changes, so a healthy job's jitter (a different rank last each
time, a GC pause now and then) never raises it. The scores of the last ``WINDOW`` collectives go to
``summary.json``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xrun.common.telemetry import DEFAULT_GROUP

if TYPE_CHECKING:
    from xrun.common.telemetry.records import EntryTimes

LATE_FLOOR_NS = 10_000_000  # 10 ms after the others' median: below, a healthy job's jitter
DECIDE_OVER = 16  # a rank's last scored collectives the rule reads (10-40 s of samples at 10 s: 4-16 a sample)
MIN_SCORED = 12  # before this many, no verdict on a rank
FLAG_AT = 0.75  # late in three of four: a straggler
CLEAR_BELOW = 0.25  # late in fewer than one in four: recovered
WINDOW = 300  # the job's last scored collectives kept for the scores (summary.json)
MAX_PENDING = 4096  # collectives waiting for some rank's report; the oldest are dropped beyond
_PINGS_KEPT = 8  # of a node's round trips, the last few the offset is chosen from
_OUTSTANDING = 4  # pings without a pong: beyond, the node's queue is forgotten (a pong went missing)


@dataclass(frozen=True)
class ClockOffset:
    """A node's wall clock minus the head's, and how far off that may be (both ns)."""

    offset_ns: int
    uncertainty_ns: int


SAME_CLOCK = ClockOffset(0, 0)  # ranks of the head's own node


class ClockOffsets:
    """Each node's clock offset from the pings: ``sent`` when a ping leaves, ``pong`` when its answer comes with the
    node's clock. A TCP stream keeps order, so a pong answers the oldest ping still waiting for one."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, deque[int]] = {}
        self._trips: dict[Hashable, deque[tuple[int, int]]] = {}  # (round trip, offset)

    def sent(self, node: Hashable, head_ns: int) -> None:
        waiting = self._waiting.setdefault(node, deque())
        if len(waiting) >= _OUTSTANDING:
            waiting.clear()  # its pongs stopped coming, or carried no clock: start again
        waiting.append(head_ns)

    def pong(self, node: Hashable, head_ns: int, node_clock_ns: int | None) -> None:
        waiting = self._waiting.get(node)
        if not waiting:
            return
        sent = waiting.popleft()
        if node_clock_ns is None or head_ns < sent:
            return
        trips = self._trips.setdefault(node, deque(maxlen=_PINGS_KEPT))
        trips.append((head_ns - sent, node_clock_ns - (sent + head_ns) // 2))

    def of(self, node: Hashable) -> ClockOffset | None:
        trips = self._trips.get(node)
        if not trips:
            return None
        trip, offset = min(trips)
        return ClockOffset(offset, trip // 2 + 1)


@dataclass(frozen=True)
class RankScore:
    """One rank over its last scored collectives."""

    rank: int
    host: str
    scored: int  # collectives it was scored in (at most WINDOW)
    late: int  # of them, entered late (past the threshold after the others' median)
    last: int  # of them, the last rank to enter
    median_lateness_ms: float  # after the others' median (negative: ahead of them)
    straggler: bool

    @property
    def late_share(self) -> float:
        return self.late / self.scored if self.scored else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "scored": self.scored, "late": self.late, "last": self.last,
                "late_share": round(self.late_share, 3), "median_lateness_ms": round(self.median_lateness_ms, 3),
                "straggler": self.straggler}


class _Rank:
    """What the rule keeps of one rank: the groups it reported (its collectives are theirs), and when it was late
    among its last ``DECIDE_OVER`` collectives (its *participation*: how many of its groups' collectives were
    scored since it joined them) with by how much. Only a late rank is touched when a collective is scored; the
    others' lateness stays in the scored collectives (``_Scored``) for the summary."""

    __slots__ = ("host", "groups", "joined", "late_at", "straggler")

    def __init__(self, host: str) -> None:
        self.host = host
        self.groups: list[str] = []
        self.joined = 0  # its groups' scored collectives before it joined them
        self.late_at: deque[tuple[int, float]] = deque(maxlen=DECIDE_OVER)  # (participation, lateness ns)
        self.straggler = False


@dataclass(frozen=True)
class _Scored:
    """One scored collective: its ranks in the order they entered it, each one's lateness (ascending: the later a
    rank entered, the later it was), and where the late ones start."""

    order: tuple[int, ...]
    lateness: array[float]  # ns; a float holds any difference a node's clock can make (an int64 would not)
    first_late: int


class _Pending:
    """A collective some of its group's ranks have reported: their entry times on the head's clock, and the worst
    uncertainty of the clocks they came on."""

    __slots__ = ("times", "uncertainty")

    def __init__(self) -> None:
        self.times: dict[int, int] = {}
        self.uncertainty = 0


class StragglerScores:
    """Every rank's score, fed samples as nodes send them; ``add`` returns the lines to show (a straggler named,
    or recovered).

    A node reports each collective on the job's grid once, and no more of them a sample than
    ``picked_per_sample`` allows for the group's size (xrun.common.telemetry.records.EntrySampler). A sample
    with more is cut to that many, the coarsest grid first (the multiples of the highest power of two: those
    every node reports), then the newest: the head's work per sample stays bounded whatever a node sends.
    Scoring a collective of 8,000 ranks costs a sort and a few list operations; the rule then reads only the
    ranks late lately (a healthy job: a few).
    """

    def __init__(self, *, world_size: int | None = None) -> None:
        self._ranks: dict[int, _Rank] = {}
        # group -> its ranks: the default group is the world; another, every rank that ever reported it
        self._members: dict[str, set[int]] = {DEFAULT_GROUP: set(range(world_size))} if world_size else {}
        self._group_scored: dict[str, int] = {}  # group -> its collectives scored so far
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._scored: dict[str, tuple[set[int], deque[int]]] = {}  # group -> numbers scored lately (samples overlap)
        self._history: deque[_Scored] = deque(maxlen=WINDOW)  # the job's last scored collectives, every group's
        self._watched: set[int] = set()  # ranks late among their last DECIDE_OVER, and those named
        self._named: set[int] = set()  # the ranks named stragglers now
        self.collectives_scored = 0  # since the start, every group's

    def add(self, host: str, offset: ClockOffset | None, samples: Iterable[EntryTimes]) -> list[str]:
        if offset is None:
            return []  # its clock is not known yet: its times cannot be compared
        shift = offset.offset_ns
        touched: set[tuple[str, int]] = set()
        # (group, numbers) -> [(index in the sample, the pending collective's times)]: a node's ranks share them
        wanted: dict[tuple[str, tuple[int, ...]], list[tuple[int, dict[int, int]]]] = {}
        for sample in samples:
            number = sample.rank
            rank = self._ranks.get(number)
            if rank is None:
                rank = self._ranks[number] = _Rank(host)
            rank.host = host
            for group in sample.groups:
                picks = wanted.get((group.name, group.seqs))
                if picks is None:
                    picks = wanted[(group.name, group.seqs)] = self._pending_of(group.name, group.seqs, touched)
                if group.name not in rank.groups:
                    rank.groups.append(group.name)
                    rank.joined += self._group_scored.get(group.name, 0)
                    self._members.setdefault(group.name, set()).add(number)
                created = group.created_ns
                for index, times in picks:
                    times[number] = created[index] - shift
        pending, scored = self._pending, self.collectives_scored
        for key in sorted(touched, key=lambda k: k[1]):
            entry = pending[key]
            entry.uncertainty = max(entry.uncertainty, offset.uncertainty_ns)
            # a group's reports come from its members only, so a count says all of them are in (no set compared)
            if len(entry.times) >= max(2, len(self._members[key[0]])):
                del pending[key]
                self._mark_scored(*key)
                self._score(key[0], entry)
        while len(pending) > MAX_PENDING:
            del pending[next(iter(pending))]  # never completed: some rank's report of it was lost
        # a verdict changes only with a collective scored (at 1,000 nodes, one sample in many completes one)
        return self._decide() if self.collectives_scored > scored else []

    def scores(self) -> tuple[RankScore, ...]:
        """Every rank over the job's last ``WINDOW`` scored collectives (those it took part in)."""
        lateness: dict[int, list[float]] = {n: [] for n in self._ranks}
        late = dict.fromkeys(self._ranks, 0)
        last = dict.fromkeys(self._ranks, 0)
        for scored in self._history:
            for number, value in zip(scored.order, scored.lateness):
                lateness[number].append(value)
            for number in scored.order[scored.first_late:]:
                late[number] += 1
            last[scored.order[-1]] += 1
        return tuple(RankScore(n, r.host, len(lateness[n]), late[n], last[n],
                               _median_ms(lateness[n]), r.straggler)
                     for n, r in sorted(self._ranks.items()))

    def status(self) -> str | None:
        """The live status's word on stragglers: the ranks named now, or None."""
        if not self._named:
            return None
        return "straggler: " + ", ".join(
            f"rank {n} ({self._ranks[n].host}) +{_ms(_late_by_ms(self._ranks[n]))}" for n in sorted(self._named))

    def named(self) -> dict[int, tuple[str, float]]:
        """The ranks named stragglers now: each one's host and its lateness (ms, as ``status`` shows it)."""
        return {n: (self._ranks[n].host, _late_by_ms(self._ranks[n])) for n in sorted(self._named)}

    def late_now(self) -> dict[int, float]:
        """The ranks late in some of their last ``DECIDE_OVER`` collectives (a healthy job: a few), each with the
        median of its lateness there, ms; every other rank was on time lately."""
        ranks = self._ranks
        return {n: _late_by_ms(ranks[n]) for n in sorted(self._watched) if ranks[n].late_at}

    def to_json(self) -> dict[str, Any]:
        return {"late_floor_ms": LATE_FLOOR_NS / 1e6, "collectives_scored": self.collectives_scored,
                "ranks": [s.to_json() for s in self.scores()]}

    def _pending_of(self, name: str, seqs: tuple[int, ...],
                    touched: set[tuple[str, int]]) -> list[tuple[int, dict[int, int]]]:
        """Of a sample's numbers in group ``name``, those to record, as (index, the pending collective's times),
        each one's key added to ``touched``: the ones not scored yet, cut to ``picked_per_sample`` (the class's
        docstring)."""
        # Lazy: the records (~5 ms of frozen dataclasses) load with a job's first sample, which brought them to
        # the head (read_entry_times), not at every job's start: a local run that samples nothing never loads them.
        from xrun.common.telemetry.records import picked_per_sample

        scored = self._scored.setdefault(name, (set(), deque()))[0]
        picks = [(index, seq) for index, seq in enumerate(seqs) if seq not in scored]
        most = picked_per_sample(len(self._members.get(name, ())))
        if len(picks) > most:
            picks = sorted(picks, key=lambda pick: (_stride(pick[1]), pick[1]))[-most:]
        out = []
        for index, seq in picks:
            key = (name, seq)
            entry = self._pending.get(key)
            if entry is None:
                entry = self._pending[key] = _Pending()
            touched.add(key)
            out.append((index, entry.times))
        return out

    def _mark_scored(self, group: str, seq: int) -> None:
        scored, order = self._scored[group]
        scored.add(seq)
        order.append(seq)
        if len(order) > MAX_PENDING:
            scored.discard(order.popleft())

    def _score(self, group: str, entry: _Pending) -> None:
        """Every rank of ``entry`` scored: its lateness kept, the late ones' noted for the rule."""
        self.collectives_scored += 1
        self._group_scored[group] = self._group_scored.get(group, 0) + 1
        times = entry.times
        order = sorted(times, key=times.__getitem__)  # the ranks in the order they entered
        entered = [times[number] for number in order]
        # the others' median is one of three values, by where the rank sits (``_medians_without``): the later a
        # rank entered, the lower the others' median, so the lateness ascends and the late ones are its tail
        (low, a), (middle, b), high = _medians_without(entered)
        lateness = array("d", [t - low for t in entered[: a + 1]] + [t - middle for t in entered[a + 1 : b + 1]]
                         + [t - high for t in entered[b + 1 :]])
        first_late = bisect_left(lateness, LATE_FLOOR_NS + 2 * entry.uncertainty)
        self._history.append(_Scored(tuple(order), lateness, first_late))
        ranks = self._ranks
        for index in range(first_late, len(order)):
            number = order[index]
            rank = ranks[number]
            rank.late_at.append((self._participation(rank), lateness[index]))
            self._watched.add(number)

    def _participation(self, rank: _Rank) -> int:
        """How many of its groups' collectives were scored since it joined them."""
        return sum(self._group_scored.get(g, 0) for g in rank.groups) - rank.joined

    def _decide(self) -> list[str]:
        """The rule (the module's docstring) on the watched ranks: a line for each whose verdict changes."""
        lines = []
        for number in sorted(self._watched):
            rank = self._ranks[number]
            seen = self._participation(rank)
            late_at = rank.late_at
            while late_at and late_at[0][0] <= seen - DECIDE_OVER:
                late_at.popleft()  # left the rule's window
            recent, late = min(seen, DECIDE_OVER), len(late_at)
            if rank.straggler and late < CLEAR_BELOW * recent:
                rank.straggler = False
                self._named.discard(number)
                lines.append(f"straggler: rank {number} ({rank.host}) recovered: late in {late / recent:.0%} of its "
                             f"last {recent} collectives")
            elif not rank.straggler and recent >= MIN_SCORED and late >= FLAG_AT * recent:
                rank.straggler = True
                self._named.add(number)
                lines.append(f"straggler: rank {number} ({rank.host}) enters collectives {_ms(_late_by_ms(rank))} "
                             f"after the others' median in {late / recent:.0%} of its last {recent} (others wait "
                             f"for it)")
            if not late_at and not rank.straggler:
                self._watched.discard(number)
        return lines


def _late_by_ms(rank: _Rank) -> float:
    """The median of a rank's lateness in its late collectives among its last ``DECIDE_OVER``, in ms."""
    return _median_ms([value for _, value in rank.late_at])


def _median_ms(lateness_ns: Sequence[float]) -> float:
    """The median of lateness in ns, in ms; 0 for none."""
    # Lazy: statistics loads fractions and decimal (3-4 ms of every run's start, python -X importtime), and a run
    # scores its first sample seconds after its ranks start, if it ever does
    import statistics

    return statistics.median(lateness_ns) / 1e6 if lateness_ns else 0.0


def _stride(seq: int) -> int:
    """The highest power of two ``seq`` is a multiple of (0: of every one)."""
    return seq & -seq if seq else 1 << 62


def _medians_without(times: list[int]) -> tuple[tuple[int, int], tuple[int, int], int]:
    """The median of the sorted ``times`` (two or more) without the one at index i: ``low`` for i <= a, ``middle``
    for a < i <= b, ``high`` for the rest, as ``((low, a), (middle, b), high)``."""
    size = len(times) - 1  # the others
    a, b = (size - 1) // 2, size // 2  # the median's two positions among them
    low = round((times[a + 1] + times[b + 1]) / 2)  # i at or below a: both positions shift up by one
    middle = round((times[a] + times[b + 1]) / 2)  # a < i <= b (only when a < b: i == b)
    high = round((times[a] + times[b]) / 2)
    return (low, a), (middle, b), high


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if abs(value) >= 10 else f"{value:.1f} ms"
