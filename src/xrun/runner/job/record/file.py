"""``events.jsonl``: the record's lines, buffered and written by a thread of their own, bounded in size.

The head's loop only appends a line to a list (``write``); every ``FLUSH_EVERY`` seconds (``flush``, from the
loop's timer) and at the end (``close``) the lines go as one piece to a daemon thread that writes them, so a slow
or stalled disk never holds the loop. What the thread has not written yet is bounded too: past ``BACKLOG_BYTES``
a piece is dropped whole and counted (the next piece that is written says so in a ``dropped`` line).

The bound on the file (a week-long job at 1,000 nodes × 8 ranks writes a few MB; docs/events.md has the
arithmetic): past ``SAMPLES_UP_TO`` bytes the periodic ``sample`` lines stop (one ``samples_stopped`` line says
so) and the job's events go on; at ``MAX_BYTES`` one ``capped`` line is the last, and what follows is only counted
(``dropped()``: summary.json's ``events`` section has the count). The job's goodput does not read the file, so a
capped file changes none of it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from typing import Any, BinaryIO

from xrun.common.output.logfiles import open_new, set_aside

FLUSH_EVERY = 2.0  # seconds: how stale the file may be while the job runs (a tool tailing it sees this lag)
MAX_BYTES = 256 << 20  # the file's cap
SAMPLES_UP_TO = 192 << 20  # past this, only the job's events: the quarter above is theirs
BACKLOG_BYTES = 16 << 20  # what the writing thread may lag behind before pieces are dropped
CLOSE_WAIT = 5.0  # seconds the end waits for the thread's last write: a disk that never answers costs that


def encode(fields: dict[str, Any]) -> bytes:
    """One record line: compact JSON, keys in the order given (``t`` and ``event`` first), a newline."""
    return (json.dumps(fields, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()


class EventsFile:
    """The record's file at ``path``, made new by the thread (an earlier run's set aside with its time, as the
    ranks' logs are; an open that fails is ``error``, and the job goes on)."""

    def __init__(self, path: str, *, max_bytes: int = MAX_BYTES, samples_up_to: int = SAMPLES_UP_TO,
                 backlog_bytes: int = BACKLOG_BYTES) -> None:
        self.path = path
        self.max_bytes, self.samples_up_to, self.backlog_bytes = max_bytes, samples_up_to, backlog_bytes
        self.size = 0  # bytes accepted for the file: the cap's measure
        self.samples_stopped = False
        self.capped = False
        self.turned_away = 0  # lines the bound turned away (samples past SAMPLES_UP_TO, anything past the cap)
        self._lines: list[bytes] = []
        self._lock = threading.Lock()  # the two counts below, shared with the thread
        self._lagged = 0  # lines in pieces dropped because the thread lagged BACKLOG_BYTES behind
        self._backlog = 0  # bytes handed to the thread, not yet written
        self._gap = 0  # lines dropped since the last piece handed over: the next one carries the count
        self._queue: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
        self.error: str | None = None  # the thread's failed open or write
        self._thread = threading.Thread(target=self._run, name="xrun-events", daemon=True)
        self._thread.start()

    def write(self, fields: dict[str, Any], *, sample: bool = False) -> bool:
        """Add one line (``fields`` starts with ``t``); False when the bound turned it away (the module's
        docstring). A ``sample`` line is the first to go."""
        if self.capped or (sample and self.samples_stopped):
            self.turned_away += 1
            return False
        line = encode(fields)
        if sample and self.size + len(line) > self.samples_up_to:
            self.samples_stopped = True
            self.turned_away += 1
            self._accept(encode({"t": fields["t"], "event": "samples_stopped", "bytes": self.size}))
            return False
        if self.size + len(line) + _ROOM_FOR_CAPPED > self.max_bytes:
            self.capped = True
            self.turned_away += 1
            self._accept(encode({"t": fields["t"], "event": "capped", "bytes": self.size}))
            return False
        self._accept(line)
        return True

    def dropped(self) -> int:
        """Lines that are not in the file: turned away by the bound, or dropped for a disk too slow."""
        with self._lock:
            return self.turned_away + self._lagged

    def flush(self) -> None:
        """Hand the lines so far to the thread (never waits for the disk)."""
        if not self._lines:
            return
        piece, self._lines = b"".join(self._lines), []
        with self._lock:
            if self._backlog + len(piece) > self.backlog_bytes:
                lines = piece.count(b"\n")
                self._lagged += lines
                self._gap += lines
                return
            self._backlog += len(piece)
        self._queue.put((self._gap, piece))
        self._gap = 0

    def close(self, *, wait: float = CLOSE_WAIT) -> bool:
        """The last lines, and the thread's end awaited up to ``wait`` seconds; False: the disk did not finish."""
        self.flush()
        self._queue.put(None)
        self._thread.join(wait)
        return not self._thread.is_alive()

    def _accept(self, line: bytes) -> None:
        self.size += len(line)
        self._lines.append(line)

    def _open(self) -> BinaryIO:
        """The file, made new (in the thread: a slow disk's ``open`` holds nothing else)."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)  # the head need not run on a node
        set_aside(self.path)  # a rerun into the same DIR: the earlier run's record keeps its own file
        return os.fdopen(open_new(self.path), "wb", buffering=0)

    def _run(self) -> None:
        try:
            with self._open() as out:
                while (item := self._queue.get()) is not None:
                    gap, piece = item
                    if gap:  # where the gap is: a tool reading the file knows lines are missing here
                        out.write(encode({"event": "dropped", "lines": gap}))
                    out.write(piece)
                    with self._lock:
                        self._backlog -= len(piece)
        except OSError as err:
            self.error = f"{self.path}: {err.strerror or err}"


_ROOM_FOR_CAPPED = 64  # kept under the cap for the ``capped`` line itself
