"""The console's text, rendered in one place: line records in, bytes out (issue 30 §3).

No node renders a label. A node's console (xrun.common.output.streams) says what its ranks wrote as *line
records*, ``Lines``: the node's host and, in order, records of a rank set and its text (whole lines, or a
progress bar's unfinished state; identical lines of several of the node's ranks already merged into one record),
and the agent's own lines (``xrun[host]: ...``) as records of no rank. Whoever shows them renders them here:

* ``render_lines``: one node's records as a console shows them: ``[host:0-7] `` at the start of every line of a
  record that names ranks (``\\r`` ends a line too, ``\\r\\n`` is one end; the label is a node's
  ``--no_prefix`` away: its records then name no rank), a record of no rank as it is. The node's own console
  writes this way (a local run, where xrun itself is the head; a pod-mode node's own log; a node whose channel to
  the head is gone), from its console's thread (xrun.common.output.writer).
* ``JobConsole``: the head's console (node 0's in pod mode), fed every node's records as they come over the
  control channel and the text the backends' own streams carry (xrun.runner.job.relay). With ``merge`` it merges
  across nodes through one ``LineMerger`` (xrun.common.output.dedupe): the same line of several nodes is shown
  once, ``[ranks 0-15] text``; a record of no rank passes unmerged in its place, a flood (more than
  ``FLOOD_LINES`` lines in one record) and a progress bar's unfinished state go at once, after what is held.

A progress bar's state is the one thing a node sends that does not end a line. On a terminal the next write would
land on the bar's line, so ``JobConsole`` ends a state left open by one node's stream with ``\\r`` before it
writes another's, as the node's console does for its own ranks' streams (a bar's own next update starts with
``\\r`` too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from xrun.common.output.dedupe import WINDOW_S, LineMerger, MergedLine, compact, is_flood

Record = tuple[Sequence[int], bytes]  # a rank set and its text; no rank: the agent's own, or not labelled
_LINE_ENDS = (b"\n", b"\r")


class Lines(NamedTuple):
    """One write of a node's console as data: its host (the label's) and its records, in order.

    A ``NamedTuple`` (typed, immutable, and cheap to make: one is made per console write of a rank's output)."""

    host: str
    records: Sequence[Record]

    def size(self) -> int:
        return sum(len(text) for _, text in self.records)

    def line_count(self) -> int:
        return max(1, sum(text.count(b"\n") for _, text in self.records))


def raw(data: bytes) -> Lines:
    """Text that names no rank (an agent's own line, what a backend's stream carried) as records."""
    return Lines("", (((), data),))


def label(hosts: Sequence[str], ranks: Sequence[int]) -> bytes:
    """``[host:0-3,5] `` for one host, ``[ranks 0-7] `` across hosts; nothing for a line of no rank."""
    if not ranks:
        return b""
    if len(ranks) == 1 and len(hosts) == 1:
        return rank_label(hosts[0], ranks[0])
    text = compact(ranks)
    if len(hosts) == 1:
        return f"[{hosts[0]}:{text}] ".encode("utf-8", "surrogateescape")
    return f"[ranks {text}] ".encode()


@functools.lru_cache(maxsize=1 << 16)
def rank_label(host: str, rank: int) -> bytes:
    """``[host:rank] ``, made once: the label of every line nobody else said (a host name that is not valid UTF-8
    passes through unchanged)."""
    return f"[{host}:{rank}] ".encode("utf-8", "surrogateescape")


def labelled(mark: bytes, text: bytes) -> bytes:
    """``mark`` at the start of every line of ``text``; a last piece without its line end gets it too.

    One ``replace`` over the whole text whatever its number of lines: this is the hot path of a rank that prints
    a lot. On the console ``\\r`` ends a line as ``\\n`` does (a progress bar stays live, labelled)."""
    if not mark or not text:
        return text
    if b"\r" in text:  # a memchr: text without a progress bar stays on the one-replace path below
        body = mark + text.replace(b"\n", b"\n" + mark).replace(b"\r", b"\r" + mark)
        if b"\r\n" in text:
            body = body.replace(b"\r" + mark + b"\n", b"\r\n")
        return body[: -len(mark)] if text.endswith(_LINE_ENDS) else body
    if text.endswith(b"\n"):
        return b"".join((mark, text[:-1].replace(b"\n", b"\n" + mark), b"\n"))
    return mark + text.replace(b"\n", b"\n" + mark)


def render_lines(lines: Lines) -> bytes:
    """One node's records as its console shows them."""
    host = lines.host
    records = lines.records
    if len(records) == 1:
        ranks, text = records[0]
        return labelled(label((host,), ranks), text) if ranks else text
    return b"".join(labelled(label((host,), ranks), text) if ranks else text for ranks, text in records)


def first_line_end(text: bytes) -> int:
    """Where the first line of ``text`` ends (after its ``\\n``, ``\\r\\n`` or ``\\r``); ``len(text)`` without one."""
    newline, cr = text.find(b"\n"), text.find(b"\r")
    if cr < 0 or 0 <= newline < cr:
        return len(text) if newline < 0 else newline + 1
    return cr + 2 if text[cr + 1:cr + 2] == b"\n" else cr + 1


class JobConsole:
    """The job's console at the head: every node's records, merged across nodes with ``merge`` (see the module
    doc). ``out`` takes the bytes (the head queues them: xrun.common.output.writer's ``offer``). Not thread-safe:
    one loop feeds it and calls ``flush`` when ``next_deadline`` is due."""

    def __init__(self, out: Callable[[int, bytes], object], *, merge: bool = False, expected: int | None = None,
                 window: float = WINDOW_S) -> None:
        self._out = out
        self.merger = LineMerger(self._merged, window=window, expected=expected) if merge else None
        self._open: tuple[Hashable, int] | None = None  # the stream whose last write left its line unfinished

    def add(self, source: Hashable, fd: int, lines: Lines, now: float) -> None:
        """``source``'s next records for console ``fd`` (a node's, or a backend stream's), in the order it sent
        them: a source's lines are never reordered."""
        merger = self.merger
        if merger is None:
            self._write(source, fd, render_lines(lines))
            return
        host = lines.host
        for ranks, text in lines.records:
            if (source, fd) == self._open:  # the rest of its unfinished line: nothing of its own is held
                self._write(source, fd, labelled(label((host,), ranks), text) if ranks else text)
            elif is_flood(text) or not text.endswith(_LINE_ENDS):  # as it comes, after what is held
                merger.flush_all()
                self._write(source, fd, labelled(label((host,), ranks), text) if ranks else text)
            else:
                for line in text.splitlines(keepends=True):
                    # a \r progress update stays its own, and a line of no rank passes unmerged in its place
                    merger.add((source, fd), fd, line, host, ranks, now,
                               mergeable=bool(ranks) and not line.endswith(b"\r"))

    def next_deadline(self) -> float | None:
        """When the first held line is due (None: nothing held)."""
        return self.merger.next_deadline() if self.merger is not None else None

    def flush(self, now: float) -> None:
        """Write the held lines whose window has passed."""
        if self.merger is not None:
            self.merger.flush(now)

    def close(self) -> None:
        """Every held line, now (the job's end: before its report)."""
        if self.merger is not None:
            self.merger.flush_all()

    def _merged(self, fd: int, merged: list[MergedLine]) -> None:
        self._write(None, fd, b"".join(label(hosts, ranks) + text for hosts, ranks, text in merged))

    def _write(self, source: Hashable, fd: int, data: bytes) -> None:
        if not data:
            return
        if self._open is not None and self._open != (source, fd):
            self._out(self._open[1], b"\r")  # never on another stream's unfinished line (a progress bar's state)
        self._out(fd, data)
        self._open = None if data.endswith(_LINE_ENDS) else (source, fd)
