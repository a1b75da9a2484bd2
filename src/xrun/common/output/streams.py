"""Rank output on a node: its ranks' lines as line records for the console, raw in the logs.

* ``RankStream``: one of a rank's output pipes (or FIFOs): its fd, the console fd it is echoed to (1 or 2),
  its rank, whether it is echoed (``--console_ranks``), the unfinished last line, its raw log file and, for
  stderr, the tail the failure report shows.
* ``Console``: the node's fd 1 and fd 2 as every rank stream reaches them. ``read``/``drain`` take what a stream
  has; ``consume`` logs it raw, keeps its tail and echoes its complete lines as *line records* (``Lines``,
  xrun.common.output.render: each rank set and its text; no label is rendered on a node), ``--no_prefix``'s
  lines as records of no rank (still whole lines), nothing with ``--quiet``. A console whose reader went away
  (``| head``) stops echoing, never logging. Made with ``merge_as=host`` (de-duplication, the default when a node
  echoes several ranks), it hands complete lines (``split_lines``) to a ``LineMerger``
  (xrun.common.output.dedupe) instead, which gives identical lines of several ranks once, with their rank set,
  within its window; the event loop sleeps at most until ``wait()`` and calls ``flush_due()``; ``flush_held()``
  before the agent speaks and at the end. Logs and tails are taken before any merging: always raw, always each
  rank's own.
* ``cut_lines``: the hot path, a chunk's complete lines cut from its unfinished rest with two ``rfind``s whatever
  its number of lines; on the console ``\r`` ends a line too (a progress bar stays live), while the log files
  keep the raw bytes.
* A progress bar's current state: tqdm writes ``\r`` *before* each state, so the last state has no line end
  until the next update. ``show_progress`` sends it, as a record of its rank, once a settle found nothing more of
  it (issue 25); its line end then sends only the rest, and any other console write first ends it with ``\r``.
* Throughput (issue 15): rank pipes get a 1 MiB buffer (``grow_pipe``), reads take up to 1 MiB, and after a
  read that found only a trickle the reader ``settle``s for 1 ms, so a rank printing line by line is read,
  logged and echoed once per millisecond, not once per line: one read and at most two writes per chunk.
* ``notice``: the agent's own ``xrun[host]: ...`` lines on stderr, control characters escaped (a stop's
  reason comes from the head or node 0: issue 22 §6).
* Both go through the console's thread (xrun.common.output.writer: ``console_lines``, ``console_write``), so a
  console that does not read never blocks the event loop (issue 25 §3); it sends them to the head over the
  control channel, or renders and writes them here (xrun.common.output.consoleroute).
* ``Console.heard``: set by every chunk consumed, read and cleared by the hang doctor's silence check
  (xrun.launch.doctor.node_doctor), so the output path never reads the clock for it.

The static supervisor (xrun.launch.ranks.supervise) reads its ranks' pipes from its event loop; the elastic relay
(xrun.launch.elastic.run) reads its FIFOs from a thread, with new ranks and log files per attempt. Both go
through the same ``Console``.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable
from typing import IO

from xrun.common.output.dedupe import LineMerger, MergedLine, is_flood
from xrun.common.output.render import Lines, Record, first_line_end
from xrun.common.output.writer import console_lines, console_write, writer
from xrun.common.procs.posix import write_all
from xrun.printable import one_line

CHUNK = 1 << 20  # bytes per read: a flooding rank is drained in big pieces, a silent one still gets its turn
PIPE_BYTES = 1 << 20  # each rank pipe's kernel buffer (F_SETPIPE_SZ; 64 KiB by default, 1 MiB is the usual cap)
# After a read that found only a trickle, the reader waits this long before reading again, so that a rank
# printing line by line (python -u: one write per line) fills the pipe instead of waking the agent for every
# line: one read, one log write and one console write per ~millisecond instead of per line (issue 15).
# It is the most a console line is held back by it.
SETTLE_S = 0.001
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ on Linux (the name exists in Python >= 3.10 only)
_TAIL_LINES = 20
_TAIL_BYTES = 16384  # how much of each stderr is kept for the tail
_TAIL_WIDTH = 1000  # characters per tail line
_MAX_PENDING = 1 << 20  # a line longer than this is emitted in pieces rather than held without bound
# A read of more than FLOOD_LINES lines (xrun.common.output.dedupe) is a rank flooding: written as it comes,
# prefixed per chunk, not merged. De-duplication is for warnings and start-up noise; bulk output keeps the fast
# path (issue 15).


def cut_lines(pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """``pending + chunk`` as its complete lines (``\n``, ``\r\n`` or, as on the console, ``\r`` ends one) and the
    unfinished rest; a final ``\r`` waits for the next byte in case it starts a ``\r\n``. Bytes in, bytes out
    (non-UTF-8 output passes unchanged), and no Python work per line."""
    data = pending + chunk if pending else chunk
    stop = len(data) - 1 if data.endswith(b"\r") else len(data)
    end = data.rfind(b"\n", 0, stop) + 1
    if b"\r" in data:  # a memchr: chunks without a progress bar skip the second search
        end = max(end, data.rfind(b"\r", 0, stop) + 1)
    return data[:end], data[end:]


def grow_pipe(fd: int) -> None:
    """Give a rank pipe ``PIPE_BYTES`` of kernel buffer, so the rank keeps writing while the agent settles; where
    the system refuses (``/proc/sys/fs/pipe-max-size``, not Linux), the default buffer does."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """``cut_lines``, the complete lines one by one (with their ends)."""
    done, rest = cut_lines(pending, chunk)
    return done.splitlines(keepends=True), rest


class LineCopy:
    """torchrun's ``--duplicate-stdout-filters`` / ``--duplicate-stderr-filters``: a stream's whole lines that contain
    one of ``words`` are copied to ``fd`` (a node's ``filtered_std{out,err}.log``, shared by its ranks' streams)."""

    __slots__ = ("fd", "words", "pending")

    def __init__(self, fd: int, words: tuple[bytes, ...]) -> None:
        self.fd = fd
        self.words = words
        self.pending = b""  # the unfinished last line: a word may straddle two reads

    def feed(self, chunk: bytes) -> None:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:][-_MAX_PENDING:]
        if cut:
            picked = [line for line in data[:cut].splitlines(keepends=True) if any(w in line for w in self.words)]
            if picked:
                write_all(self.fd, b"".join(picked))


class RankStream:
    """One of a rank's output pipes or FIFOs, and what is kept of it."""

    __slots__ = ("fd", "console", "echo", "rank", "pending", "bar", "log", "tail", "total", "copy", "_file")

    def __init__(
        self,
        fd: int,
        console: int,
        *,
        log: int | None = None,
        keep_tail: bool = False,
        file: IO[bytes] | None = None,
        rank: int | None = None,
    ) -> None:
        self.fd: int | None = fd
        self.console = console  # 1 or 2
        self.echo = True  # False: a rank --console_ranks leaves out (still logged, its tail still kept)
        self.rank = rank  # the global rank: its lines' label, and their source in de-duplication
        self.pending = b""  # the unfinished last line, held until its line end
        self.bar = False  # it wrote a \r: an unfinished line of it is a progress bar's state, shown early
        self.log = log  # raw copy: {log_dir}/{host}/rank{N}/std{out,err}.log
        self.tail: bytes | None = b"" if keep_tail else None
        self.total = 0  # bytes seen by the tail, to know whether its first line was cut
        self.copy: LineCopy | None = None  # torchrun's duplicate filters: matching lines copied to a node file
        # The file object that owns ``fd`` (a Popen pipe): closing the fd any other way would let its finalizer
        # close the number later, when it may belong to somebody else.
        self._file = file

    def tail_lines(self) -> tuple[str, ...]:
        """The last lines as a terminal would show them: a progress bar's ``\\r`` rewrites its line."""
        if not self.tail:
            return ()
        lines = self.tail.decode("utf-8", "replace").split("\n")
        if self.total > len(self.tail):
            lines = lines[1:]  # the first one was cut
        if lines and lines[-1] == "":
            lines.pop()
        shown = (line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines[-_TAIL_LINES:])
        return tuple(line if len(line) <= _TAIL_WIDTH else line[: _TAIL_WIDTH - 3] + "..." for line in shown)

    def clear_tail(self) -> None:
        if self.tail is not None:
            self.tail = b""
        self.total = 0

    def close_log(self) -> None:
        if self.log is not None:
            os.close(self.log)
            self.log = None

    def close_fd(self) -> None:
        """Close the reading end (its owner's way); idempotent."""
        if self.fd is None:
            return
        if self._file is not None:
            self._file.close()
        else:
            os.close(self.fd)
        self.fd = None


class Console:
    """fd 1 and fd 2 of the node, shared by every rank stream; not thread-safe (the elastic relay locks)."""

    def __init__(self, *, prefix: bool, quiet: bool, on_close: Callable[[int], object] | None = None,
                 merge_as: str | None = None, ranks_shown: int | None = None, host: str = "") -> None:
        self._writer = writer()  # the console's thread: the loop only queues (issue 25 §3)
        self._writer.dropping = False
        self._writer.host = host or merge_as or self._writer.host
        self._prefix = prefix
        self._quiet = quiet
        # merge_as: this node's host name; its ranks' identical lines are then shown once (xrun.common.output.dedupe).
        # Only with prefixes: a line shown once must say which ranks said it.
        self._host = host or merge_as or ""  # the labels' host (rendered where the lines are shown)
        # ranks_shown: how many ranks this console echoes (None: unknown); a line all of them said goes out at once
        merging = merge_as is not None and prefix and not quiet
        self._merger = LineMerger(self._merged, expected=ranks_shown) if merging else None
        self._on_close = on_close  # told a stream's fd before it is closed (to unregister it from a selector)
        self._ok = {1: True, 2: True}
        self.heard = False  # some rank wrote something since the hang doctor last looked
        self._trickled = False  # a read since the last settle() returned less than a full chunk ...
        self._flooded = False  # ... and none returned a full one (a flooding rank is read again at once)
        # A progress bar (tqdm) writes "\r" *before* each state and leaves the state unfinished until the next
        # update: the stream whose unfinished state waits to be shown (issue 25), whether a settle has passed
        # since its last chunk, and the stream whose state is on the terminal now with how many bytes of it.
        self._bar: RankStream | None = None
        self._bar_due = False
        self._shown: tuple[RankStream, int] | None = None

    def read(self, stream: RankStream) -> bool:
        """One read: consume what came, or close the stream at EOF. True when it got data (there may be more)."""
        try:
            chunk = os.read(stream.fd, CHUNK)  # type: ignore[arg-type]  # only open streams are read
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if chunk:
            if len(chunk) < CHUNK:
                self._trickled = True
            else:
                self._flooded = True
            self.consume(stream, chunk)
            return True
        self.close(stream)
        return False

    def settle(self) -> None:
        """After reads that found only a trickle, let the ranks' pipes fill for ``SETTLE_S`` (see there)."""
        if self._trickled and not self._flooded:
            time.sleep(SETTLE_S)
        self._trickled = self._flooded = False
        self._bar_due = self._bar is not None  # the next look that finds nothing more for it shows it

    def show_progress(self) -> None:
        """Show a progress bar's unfinished state once a settle found nothing more of it, prefixed (issue 25).

        The loop calls it after its reads. The bytes written are the ones the state's line end would have
        written with it (that write leaves them out: ``_emit_own``), so a pipe gets the same bytes, earlier.
        Any other console write first ends the shown state with ``\r``, as the bar's own update would, and the
        state is shown again after it. With de-duplication, only once nothing is held (order)."""
        stream = self._bar
        held = self._merger is not None and self._merger.next_deadline() is not None
        if not self._bar_due or stream is None or held:
            return
        self._bar, self._bar_due = None, False
        end = len(stream.pending) - stream.pending.endswith(b"\r")  # a final \r may start a \r\n
        shown = self._shown[1] if self._shown is not None and self._shown[0] is stream else None
        if stream.fd is None or not self._ok[stream.console] or end <= (shown or 0):
            return
        if shown is None:
            self.emit(stream.console, [(self._ranks_of(stream), stream.pending[:end])])
        else:
            self._write(stream.console, [((), stream.pending[shown:end])])  # the rest of the state shown
        self._shown = (stream, end)

    def _note_pending(self, stream: RankStream, chunk: bytes) -> None:
        """After a chunk: a stream that writes \r and has an unfinished line is the bar to show once settled."""
        if stream.pending and (stream.bar or b"\r" in chunk):
            stream.bar = True
            self._bar, self._bar_due = stream, False
        elif stream is self._bar:
            self._bar = None

    def _log_lost(self, stream: RankStream) -> None:
        """A log file that takes no more (the log disk full): said once, then no more tries; the console and the
        report go on. Silently, the logs ended mid-run and nobody knew which ones."""
        stream.close_log()
        name = "stdout" if stream.console == 1 else "stderr"
        whose = f"rank {stream.rank}'s" if stream.rank is not None else "a"
        notice(self._writer.host, f"cannot write {whose} {name}.log (disk full?): the rest of it is not logged")

    def drain(self, stream: RankStream, limit: int = 64) -> None:
        """Read what is already there without waiting (bounded: a surviving writer may keep writing)."""
        for _ in range(limit):
            if stream.fd is None or not self.read(stream):
                return

    def consume(self, stream: RankStream, chunk: bytes) -> None:
        self.heard = True  # the hang doctor's silence check reads and clears it: no clock on the hot path
        if stream.log is not None and not write_all(stream.log, chunk):
            self._log_lost(stream)
        if stream.copy is not None:
            stream.copy.feed(chunk)
        if stream.tail is not None:
            stream.total += len(chunk)
            stream.tail = (stream.tail + chunk)[-_TAIL_BYTES:] if len(chunk) < _TAIL_BYTES else chunk[-_TAIL_BYTES:]
        if self._quiet or not stream.echo or not self._ok[stream.console]:
            return
        if self._merger is not None and stream.rank is not None:
            self._merge(stream, chunk)
        else:
            self._echo(stream, chunk)
        if stream.pending or stream is self._bar:
            self._note_pending(stream, chunk)

    def _echo(self, stream: RankStream, chunk: bytes) -> None:
        """Complete lines as one record of the stream's rank, one write per chunk."""
        out, stream.pending = cut_lines(stream.pending, chunk)
        if len(stream.pending) > _MAX_PENDING:
            out += stream.pending + b"\n"
            stream.pending = b""
        if out:
            self._emit_own(stream, out)

    def _emit_own(self, stream: RankStream, out: bytes) -> None:
        """``out`` starts with ``stream``'s unfinished line: what of it ``show_progress`` wrote is not written
        again (the rest of that line goes as a record of no rank: its label is on the console already)."""
        records: list[Record] = []
        if self._shown is not None and self._shown[0] is stream:
            end = first_line_end(out)
            records.append(((), out[self._shown[1]:end]))
            out = out[end:]
            self._shown = None
        if out:
            records.append((self._ranks_of(stream), out))
        self.emit(stream.console, records)

    def _merge(self, stream: RankStream, chunk: bytes) -> None:
        """The de-duplicating path: complete lines go to the merger, which writes them within its window."""
        assert self._merger is not None and stream.rank is not None
        if is_flood(chunk):  # after what is held, as it comes
            self._merger.flush_all()  # held lines (this rank's among them) go first: nothing is reordered
            self._echo(stream, chunk)
            return
        lines, stream.pending = split_lines(stream.pending, chunk)
        now = time.monotonic()
        add, console, host, ranks = self._merger.add, stream.console, self._host, (stream.rank,)
        source = (stream.rank, console)  # order is kept per stream, as the pipes keep it
        for line in lines:
            # a \r progress update stays its own: never merged into another rank's, never frozen
            add(source, console, line, host, ranks, now, mergeable=not line.endswith(b"\r"))
        if len(stream.pending) > _MAX_PENDING:
            add(source, console, stream.pending + b"\n", host, ranks, now, mergeable=False)
            stream.pending = b""

    @property
    def backed_up(self) -> bool:
        """The console lags a full buffer behind: the loop stops reading the ranks until it catches up."""
        return self._writer.full

    def stop_holding(self) -> None:
        """The node is stopping: from now on console lines that do not fit are dropped (and counted), so that no
        rank is held back while it is told to stop (xrun.common.output.writer)."""
        self._writer.dropping = True

    def written(self) -> None:
        """At the end: wait while the console takes what was queued, never longer than it stalls."""
        self._writer.drain()

    def wait(self, cap: float | None = None) -> float | None:
        """The event loop's longest sleep: ``cap`` (None: no limit), or less when held lines are due sooner, or
        none when a progress bar's state is to be shown if nothing more of it came (``show_progress``)."""
        due = self._merger.next_deadline() if self._merger is not None else None
        if self._bar_due and due is None:
            return 0.0
        if due is None:
            return cap
        held = max(0.0, due - time.monotonic())
        return held if cap is None else min(cap, held)

    def flush_due(self) -> None:
        """Write the held lines whose window has passed."""
        if self._merger is not None and self._merger.next_deadline() is not None:
            self._merger.flush(time.monotonic())

    def flush_held(self) -> None:
        """Write every held line now (the run ends, or the agent is about to speak)."""
        if self._merger is not None:
            self._merger.flush_all()
        self._end_shown()

    def end_line(self, stream: RankStream) -> None:
        """The last line had no newline: give it one, so the next line (another rank's) starts clean."""
        if stream.pending and self._merger is not None and stream.rank is not None:
            self._merger.add((stream.rank, stream.console), stream.console, stream.pending + b"\n", self._host,
                             (stream.rank,), time.monotonic())
            stream.pending = b""
        elif stream.pending:
            self._emit_own(stream, stream.pending + b"\n")
            stream.pending = b""

    def _ranks_of(self, stream: RankStream) -> tuple[int, ...]:
        # --no_prefix drops the label, not the line buffering: two ranks' writes never share a console line
        # (print() under python -u writes 'out', ' ', '0' and '\n' separately)
        return (stream.rank,) if self._prefix and stream.rank is not None else ()

    def close(self, stream: RankStream) -> None:
        """The stream ended: stop watching it, close it, finish its last line."""
        if stream.fd is None:
            return
        if self._on_close is not None:
            self._on_close(stream.fd)
        stream.close_fd()
        self.end_line(stream)

    def emit(self, fd: int, records: list[Record]) -> None:
        self._end_shown()
        self._write(fd, records)

    def _merged(self, fd: int, merged: list[MergedLine]) -> None:
        """The merger's lines, as records: the rank set that said each (the host is this node's)."""
        self.emit(fd, [(ranks, text) for _, ranks, text in merged])

    def _end_shown(self) -> None:
        """Another write is coming: end the progress state on the terminal with \r, as its next update would
        (it is written again in full with its line end), and show it again after that write."""
        if self._shown is None:
            return
        stream = self._shown[0]
        self._shown = None
        self._write(stream.console, [((), b"\r")])
        if self._bar is None and stream.pending:
            self._bar, self._bar_due = stream, False

    def _write(self, fd: int, records: list[Record]) -> None:
        if self._ok[fd] and not console_lines(fd, Lines(self._host, records)):
            self._ok[fd] = False  # our reader went away (`| head`): keep logging, stop echoing


def notice(host: str, text: str) -> None:
    """One line of the agent's own on stderr, after what Python itself buffered for stdout."""
    flush_python_output()
    console_write(2, f"xrun[{host}]: {one_line(text)}\n".encode("utf-8", "replace"))


def flush_python_output() -> None:
    """Flush ``sys.stdout``/``sys.stderr`` so the agent's earlier prints come before the ranks' lines."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
