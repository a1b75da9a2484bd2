"""Console de-duplication (issue 17): identical lines from several ranks within a short window, shown once.

Pure: lines and times in, merged lines out through ``emit`` as data (each line's text with the hosts and ranks
that said it; xrun.common.output.render labels them); no clock, no I/O. The node's ``Console``
(xrun.common.output.streams) feeds it its ranks' complete lines; the head's console
(xrun.common.output.render.JobConsole) feeds it every node's line records, so identical lines from every node
collapse there too.

The rules, each one a test in tests/test_dedupe.py:

* A line waits for its twins ``window`` seconds (0.2 s by default) after its group opened, then is written with
  the ranks that said it (rendered ``[host:0-7] text`` on one host, ``[ranks 0-5,8] text`` across hosts). A line
  nobody repeats is written as it would have been, ``[host:3] text``, that much later.
* A source's lines are never reordered: groups are written in queue order, and a line joins a group only where
  that keeps every source's lines in order: a group after the last one its source is in, or an earlier one
  that is still the last group of each of its sources and within its own window, which then moves to the end
  of the queue (rank 0 says ``A, own 0, B``, rank 1 ``A, own 1, B``: ``[h:0-1] A``, ``own 0``, ``own 1``,
  ``[h:0-1] B``). A moved group keeps its deadline but is written after the groups before it (see the
  bound). Otherwise the line opens a group of its own. A source is a rank's stdout or stderr on a
  node, a node's stream on the head.
* Lines that must stay their own (a ``\\r`` progress update, a piece of an endless line) open groups no other
  line joins: a progress bar is delayed by the window, never merged into another rank's or frozen.
* With ``expected`` (how many ranks this console shows), a line that every one of them has said is due at
  once: a warning all ranks print goes out when the last of them prints it, not a window later (it still
  waits for the groups before it). A line that several but not all of them said waits ``late_window`` (0.8 s)
  from its first copy for the rest: ranks start apart (8 ranks importing torch on 2 cores print their import
  warnings 0.1-0.7 s apart), and a line split by that skew would otherwise be shown once per window.
* Stragglers: a line that was written for some ranks within the last ``RECALL_S`` seconds, said again by a rank
  that was not among them, opens a group that waits ``late_window`` for the other late ranks (or until every
  rank has said it). A line split by a longer skew is shown twice, not once per rank.
* The bound: a shared line waits at most ``late_window`` for its twins, any other line one window, and every
  line also waits for the groups before it (order), so no line waits more than twice ``late_window`` (1.6 s);
  typically a line all ranks said goes out as the last of them says it, any other 0.2 s later. Without
  ``expected`` (the head of an elastic job) there are no late windows: at most twice the window (0.4 s).
* Memory is bounded: past ``max_held`` held lines or ``MAX_HELD_BYTES`` of text the oldest groups are
  written early.

Cost: a dict lookup and one small object per line; ``Console`` only merges when more than one rank echoes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable

MergedLine = tuple[list[str], list[int], bytes]  # who said it (hosts, ranks) and the line, with its line end

WINDOW_S = 0.2  # how long a line waits for its twins (8 ranks starting on 2 cores print ~0.15 s apart)
LATE_WINDOW_S = 0.8  # how long a line several ranks said waits for the rest (see the rules)
RECALL_S = 5.0  # how long a line shown for only some of the ranks is remembered, to know its stragglers
RECALLED = 4096  # lines remembered at most
MAX_HELD = 20000  # lines held at once; past it the oldest groups are written early
MAX_HELD_BYTES = 16 << 20  # and bytes: a rank writing long lines slowly must not grow the agent
FLOOD_LINES = 256  # a read with more lines than this is a flood: written as it comes, after what is held


class _Group:
    """One line's text on one console fd, and who said it."""

    __slots__ = ("seq", "fd", "text", "opened", "deadline", "ranks", "hosts", "sources", "mergeable", "said")

    def __init__(self, seq: int, fd: int, text: bytes, opened: float, deadline: float, mergeable: bool,
                 said: frozenset[int]) -> None:
        self.seq = seq
        self.fd = fd
        self.text = text  # with its line end
        self.opened = opened  # when the group's first line came
        self.deadline = deadline
        self.ranks: list[int] = []
        self.hosts: list[str] = []
        self.sources: set[Hashable] = set()
        self.mergeable = mergeable
        self.said = said  # the ranks whose copy of this line was written already (a stragglers' group)


class LineMerger:
    """Hold complete lines for ``window`` seconds and write identical ones once, with their rank set."""

    def __init__(self, emit: Callable[[int, list[MergedLine]], object], *, window: float = WINDOW_S,
                 max_held: int = MAX_HELD, expected: int | None = None, late_window: float = LATE_WINDOW_S) -> None:
        self._emit = emit
        self._window = window
        self._expected = expected  # how many ranks this console shows (None: unknown, no early or late rules)
        self._late_window = late_window
        # (fd, text) -> (when, ranks) of a line written for only some of the ranks: its stragglers' group waits
        self._shown: dict[tuple[int, bytes], tuple[float, frozenset[int]]] = {}
        self._max_held = max_held
        # Open groups in writing order, as (seq, group): a group that moved is appended again with its new seq,
        # and its old entry, whose seq no longer matches, is skipped.
        self._queue: deque[tuple[int, _Group]] = deque()
        self._open: dict[tuple[int, bytes], _Group] = {}  # (fd, text) -> its latest open group
        self._last: dict[Hashable, int] = {}  # source -> seq of the last group it is in
        self._seq = 0
        self._bytes = 0  # text held

    def add(self, source: Hashable, fd: int, text: bytes, host: str, ranks: Iterable[int], now: float, *,
            mergeable: bool = True) -> None:
        """``source``'s next line ``text`` (with its line end) for console ``fd``, said by ``ranks`` on ``host``."""
        key = (fd, text)
        group = self._open.get(key) if mergeable else None
        if group is None or not self._may_join(group, source, now):
            group = self._open_group(key, ranks, now, mergeable)
        elif group.seq <= self._last.get(source, -1):  # joinable only once moved after this source's lines
            self._move_to_end(group)
        group.sources.add(source)
        group.ranks.extend(ranks)
        if self._expected is not None and mergeable:
            self._wait_for_the_rest(group, now, self._expected)
        if host not in group.hosts:
            group.hosts.append(host)
        self._last[source] = group.seq
        if len(self._queue) > self._max_held:
            self._write(len(self._queue) - self._max_held)
        while self._bytes > MAX_HELD_BYTES and self._queue:
            self._write(1)

    def _open_group(self, key: tuple[int, bytes], ranks: Iterable[int], now: float, mergeable: bool) -> _Group:
        fd, text = key
        window, said = self._window, frozenset[int]()
        shown = self._shown.get(key) if mergeable and self._expected is not None else None
        if shown is not None and now - shown[0] <= RECALL_S and shown[1].isdisjoint(ranks):
            window, said = self._late_window, shown[1]  # late ranks: wait for the others that are late too
        self._seq += 1
        group = _Group(self._seq, fd, text, now, now + window, mergeable, said)
        self._queue.append((group.seq, group))
        self._bytes += len(text)
        if mergeable:
            self._open[key] = group
        return group

    def _wait_for_the_rest(self, group: _Group, now: float, expected: int) -> None:
        """A line every rank said is due now; one that several but not all ranks said waits ``late_window`` from
        its first copy for the rest (ranks start apart: 8 importing torch on 2 cores, 0.1-0.7 s here)."""
        said = len(group.ranks) if not group.said else len(group.said.union(group.ranks))  # ranks are unique
        if said >= expected:
            group.deadline = min(group.deadline, now)
        elif len(group.ranks) >= 2:  # on the head, one node's copy may already be several ranks'
            group.deadline = max(group.deadline, group.opened + self._late_window)

    def _remember(self, group: _Group) -> None:
        """After a shared line is written: remember the ranks it was shown for, unless that was every rank."""
        key = (group.fd, group.text)
        if len(group.ranks) < 2 and not group.said:  # one rank's line: its twins, if any, merge among themselves
            return
        said = group.said.union(group.ranks)
        self._shown.pop(key, None)
        if self._expected is None or len(said) >= self._expected:
            return
        if len(self._shown) >= RECALLED:
            del self._shown[next(iter(self._shown))]  # the oldest
        self._shown[key] = (group.deadline, said)

    def _may_join(self, group: _Group, source: Hashable, now: float) -> bool:
        if source in group.sources:
            return False
        if group.seq > self._last.get(source, -1):
            return True
        # Moving it after this source's lines must not put it after a later line of one of its own sources.
        return now < group.deadline and all(self._last[s] == group.seq for s in group.sources)

    def _move_to_end(self, group: _Group) -> None:
        self._seq += 1
        group.seq = self._seq
        self._queue.append((group.seq, group))
        for source in group.sources:
            self._last[source] = group.seq

    def next_deadline(self) -> float | None:
        """When the first held line is due (None: nothing held)."""
        while self._queue and self._queue[0][0] != self._queue[0][1].seq:
            self._queue.popleft()  # a moved group's old place
        return self._queue[0][1].deadline if self._queue else None

    def flush(self, now: float) -> None:
        """Write the groups at the head of the queue whose window has passed."""
        count = 0
        for seq, group in self._queue:
            if seq == group.seq and group.deadline > now:
                break
            count += 1
        if count:
            self._write(count)

    def flush_all(self) -> None:
        """Write everything held (the end of a run, or before output that must not overtake it)."""
        if self._queue:
            self._write(len(self._queue))

    def _write(self, count: int) -> None:
        """Write the oldest ``count`` groups, one ``emit`` per run of groups on the same fd."""
        runs: list[tuple[int, list[MergedLine]]] = []
        for _ in range(count):
            seq, group = self._queue.popleft()
            if seq != group.seq:
                continue  # moved: written from its new place
            self._bytes -= len(group.text)
            if self._open.get((group.fd, group.text)) is group:
                del self._open[(group.fd, group.text)]
            if group.mergeable and self._expected is not None:
                self._remember(group)
            if not runs or runs[-1][0] != group.fd:
                runs.append((group.fd, []))
            runs[-1][1].append((group.hosts, group.ranks, group.text))
        for fd, run in runs:
            self._emit(fd, run)


def is_flood(chunk: bytes) -> bool:
    """More than ``FLOOD_LINES`` lines in one read (counted in its first bytes only: a cheap test)."""
    return chunk.count(b"\n", 0, FLOOD_LINES * 256) > FLOOD_LINES


def compact(ranks: Iterable[int]) -> str:
    """``0-3,5,7-8``: sorted, duplicates dropped, runs as ranges."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in ordered:
        if prev is not None and rank == prev + 1:
            prev = rank
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = rank
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
