"""The console written from a thread, through a bounded buffer: supervision never waits on output (issue 25 §3).

A write to a console that does not read (a stalled terminal or ssh channel, a pipe whose reader stopped, a head
or pod mode's node 0 behind on every node's lines) blocks. Done from the event loop, that write would stop
supervision: a rank's exit would not be seen and the job not stopped. So the loop only queues (``put``), and one
daemon thread writes, in order, fd 1 and fd 2 alike (a terminal shows both: their order is kept): a node's line
records go over the control channel to the head (``Route``), whose channel may block as well, or are rendered
here (xrun.common.output.render) and written.

The policy, stated in docs/logs.md:
* while the job runs, a console that cannot keep up holds the ranks back, as a slow terminal does: once the
  buffer holds ``BUFFER_BYTES`` the rank group stops reading its ranks' pipes (``full``) until it drains;
  nothing is lost and rank exits are still seen at once (they come on pidfds, not on the pipes);
* once the node is stopping (``dropping``: a rank failed, a signal), and whenever the console took nothing for
  ``STALL_S`` while it had work, lines that do not fit are dropped and counted, and one line says how many
  when the console takes writes again (the per-rank log files and the failure report's tail have them all);
* at the end (``drain``) xrun waits while the console makes progress, and gives up after ``STALL_S`` without
  any: a console that never reads again costs at most that, never a hang.

``put`` returns False once a write found the reader gone (``| head``): the console then stops echoing.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable

from xrun.common.output.consoleroute import Route, current, deliver
from xrun.common.output.render import Lines, render_lines
from xrun.common.procs.posix import on_leave

BUFFER_BYTES = 4 << 20  # what the console may lag behind the ranks before they are held back
STALL_S = 1.0  # a console that took nothing for this long while it had work is stalled
PIECE = 64 << 10  # a local write at a time: progress is seen per piece, even on a slow terminal
_Item = tuple[int, "bytes | Lines", "Route | None", int]  # fd, what to write, its route, its size in bytes


def count_lines(data: bytes | Lines) -> int:
    return max(1, data.count(b"\n")) if isinstance(data, bytes) else data.line_count()


class ConsoleWriter:
    """One per process, as fd 1 and 2 are (``writer()``); thread-safe."""

    def __init__(self, *, limit: int = BUFFER_BYTES, stall_s: float = STALL_S,
                 deliver_item: Callable[[int, bytes | Lines, Route | None], bool] = deliver) -> None:
        self._limit = limit
        self._stall_s = stall_s
        self._deliver = deliver_item
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._bytes = 0  # queued, the item being written included
        self._busy: int | None = None  # the fd the thread is writing now
        self._progress = 0.0  # monotonic time of the thread's last write (or of the start of this one)
        self._gone = {1: False, 2: False}  # a write found the reader gone
        self._thread: threading.Thread | None = None
        self.dropping = False  # the node is stopping: what does not fit is dropped, not waited for
        self.dropped = 0  # console lines dropped and not said yet
        self.host = ""  # for the line that says how many: xrun[host]: ...

    @property
    def full(self) -> bool:
        """The console lags ``BUFFER_BYTES`` behind: the rank group stops reading its ranks for now."""
        return self._bytes >= self._limit

    def put(self, fd: int, data: bytes | Lines, route: Route | None = None) -> bool:
        """Queue a console write (text, or a node's line records); never blocks. False: the reader of ``fd`` is
        gone (stop echoing)."""
        with self._cond:
            if self._gone.get(fd) and route is None:
                return False
            if self._bytes >= self._limit and (self.dropping or self._stalled()):
                self.dropped += count_lines(data)
                return True
            size = len(data) if isinstance(data, bytes) else data.size()
            self._queue.append((fd, data, route, size))
            self._bytes += size
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="xrun-console", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def offer(self, fd: int, data: bytes) -> bool:
        """Queue a console write from a process that cannot hold its producers back (the head, relaying every
        node's lines from its control loop): past ``BUFFER_BYTES`` behind, lines are dropped and counted instead
        (each node's log files keep them). Never blocks."""
        with self._cond:
            if self._bytes >= self._limit:
                self.dropped += count_lines(data)
                return True
        return self.put(fd, data)

    def drain(self) -> bool:
        """Wait until the console took everything queued, as long as it keeps taking; True when it did. After
        ``STALL_S`` without progress the rest is dropped and counted, and said on fd 2 if fd 2 can take it."""
        with self._cond:
            while self._queue:
                if self._stalled():
                    self._give_up()
                    return False
                self._cond.wait(0.05)
        return True

    def _stalled(self) -> bool:
        return self._busy is not None and time.monotonic() - self._progress > self._stall_s

    def _give_up(self) -> None:
        """Drop everything queued but the write in progress (it may still finish) and say how many lines."""
        in_flight = self._queue.popleft() if self._busy is not None else None
        self.dropped += sum(count_lines(data) for _, data, _, _ in self._queue)
        self._queue.clear()
        self._bytes = 0
        if in_flight is not None:
            self._queue.append(in_flight)
            self._bytes = in_flight[3]
        if self._busy != 2 and _can_take(2):  # fd 2 may be another stream than the stalled one
            _write_now(2, self._dropped_line())

    def _dropped_line(self) -> bytes:
        host = f"[{self.host}]" if self.host else ""
        count, self.dropped = self.dropped, 0
        return (f"xrun{host}: {count} console line{'s' if count != 1 else ''} dropped: the console did not take "
                "them (the log files under --log_dir and the failure report keep every line)\n").encode()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                fd, data, route, size = self._queue[0]
                self._busy, self._progress = fd, time.monotonic()
            ok = self._deliver_in_pieces(fd, data, route)
            with self._cond:
                if self._queue and self._queue[0][1] is data:  # not dropped by a drain meanwhile
                    self._queue.popleft()
                    self._bytes -= size
                self._busy = None
                self._gone[fd] = self._gone.get(fd, False) or not ok
                if self.dropped and not self._queue:  # the console takes writes again: say what it missed
                    line = self._dropped_line()
                    self._queue.append((2, line, route, len(line)))
                    self._bytes += len(line)
                self._cond.notify_all()

    def _deliver_in_pieces(self, fd: int, data: bytes | Lines, route: Route | None) -> bool:
        if route is not None:  # a forward goes whole: the head reads it as one message
            return self._deliver(fd, data, route)
        if not isinstance(data, bytes):
            data = render_lines(data)  # here, off the loop that supervises the ranks
        if len(data) <= PIECE:
            return self._deliver(fd, data, route)
        for start in range(0, len(data), PIECE):
            if not self._deliver(fd, data[start:start + PIECE], None):
                return False
            self._progress = time.monotonic()
        return True

    def reset_after_fork(self) -> None:
        """A forked child has no writer thread: it starts its own when it writes."""
        self._cond = threading.Condition()
        self._queue.clear()
        self._bytes, self._busy, self._thread = 0, None, None


def _can_take(fd: int) -> bool:
    try:
        return bool(select.select([], [fd], [], 0)[1])
    except (OSError, ValueError):
        return False


def _write_now(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)  # one short line: a fd that polled writable takes it whole
    except OSError:
        pass


_WRITER = ConsoleWriter()
os.register_at_fork(after_in_child=_WRITER.reset_after_fork)
on_leave(_WRITER.drain)  # xrun's entry points end with os._exit: what is queued is written first


def writer() -> ConsoleWriter:
    return _WRITER


def console_write(fd: int, data: bytes) -> bool:
    """Queue ``data``, text of no rank (an agent's own line), for the node's console fd (1 or 2), wherever the route
    takes it (never blocks); False: nobody reads it any more."""
    return _WRITER.put(fd, data, current())


def console_lines(fd: int, lines: Lines) -> bool:
    """Queue a node's line records for its console fd (1 or 2), wherever the route takes them (never blocks);
    False: nobody reads them any more."""
    return _WRITER.put(fd, lines, current())
