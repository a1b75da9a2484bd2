"""A RankGroup's event loop (``xrun.launch.ranks.supervise``): one selector, single-threaded.

Readers added before ``run()`` wait until the selector opens; a signal's handler only records it (the wake-up pipe
of xrun.common.procs.signals ends the wait) and the group acts on it between turns. ``hold`` stops watching the
ranks' pipes while the console lags a full buffer behind (issue 25 §3); ``release`` watches them again.
"""

from __future__ import annotations

import selectors
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

HOLD_POLL_S = 0.01  # while held, how often the loop looks whether the console caught up


class Stream(Protocol):
    fd: int | None


class GroupLoop:
    def __init__(self) -> None:
        self.sel: selectors.BaseSelector | None = None  # open while the group runs
        self._readers: list[tuple[object, Callable[[], None]]] = []
        self.signals: deque[int] = deque()  # recorded by the handler, acted on by the group
        self._held: list[tuple[Stream, Callable[[], None]]] = []  # streams not watched for now, their callbacks
        self.holding = False

    def add_reader(self, fileobj: object, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the loop whenever ``fileobj`` (an fd or has fileno()) is readable."""
        self._readers.append((fileobj, callback))
        if self.sel is not None:
            self.sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]

    def open(self) -> selectors.BaseSelector:
        self.sel = selectors.DefaultSelector()
        return self.sel

    def register_readers(self) -> None:
        """The readers added before the selector opened."""
        assert self.sel is not None
        for fileobj, callback in self._readers:
            self.sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]

    def dispatch(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` (None: until a reader is ready) and call back every ready reader."""
        assert self.sel is not None
        registered = self.sel.get_map()
        for key, _ in self.sel.select(timeout):
            # An earlier callback of this batch may have closed this fd (and its number been reused).
            if registered.get(key.fd) is key:
                key.data()

    def on_signal(self, signum: int, _frame: object) -> None:
        # Only record: the loop acts on it (the wake-up fd has already woken select()).
        self.signals.append(signum)

    def unregister(self, fd: int) -> None:
        if self.sel is not None:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def hold(self, streams: Iterable[Stream]) -> None:
        """Stop reading these streams until ``release``: once a pipe is full its rank's writes block, as they
        would on a slow terminal. Exits are not streams: they are still seen at once."""
        assert self.sel is not None
        self.holding = True
        for stream in streams:
            try:
                key = self.sel.unregister(stream.fd)  # type: ignore[arg-type]
            except (KeyError, ValueError):
                continue
            self._held.append((stream, key.data))

    def release(self) -> None:
        """Read the held streams again (those still open)."""
        assert self.sel is not None
        for stream, callback in self._held:
            if stream.fd is not None:
                self.sel.register(stream.fd, selectors.EVENT_READ, callback)
        self._held.clear()
        self.holding = False

    def close(self) -> None:
        if self.sel is not None:
            self.sel.close()
