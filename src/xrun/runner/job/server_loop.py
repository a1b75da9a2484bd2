"""The control server's event loop (``xrun.runner.job.control_server``): one thread, one selector.

Readers (the listeners, every connection, what a backend's sessions add) are called back when readable; timers
after every wake-up; signals are only recorded by their handler (the wake-up pipe ends the wait) and acted on by
the loop's owner between turns, never inside the handler.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from collections.abc import Iterable, Iterator
from typing import Any, Callable

from xrun.common.procs.signals import owned_signals


class SelectLoop:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[Callable[[], float | None], Callable[[], None]]] = []
        self.signals: list[int] = []  # recorded by the handler, taken by the loop's owner

    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        self.sel.register(fileobj, selectors.EVENT_READ, callback)

    def remove_reader(self, fileobj: Any) -> None:
        try:
            self.sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def add_timer(self, due: Callable[[], float | None], fire: Callable[[], None]) -> None:
        """``fire()`` after every wake-up; ``due()`` (a monotonic time, or None) bounds the wait for the next."""
        self.timers.append((due, fire))

    def turn(self, deadlines: Iterable[float | None]) -> None:
        """Wait for a reader until the first of ``deadlines`` (one at least is set) and the timers' due times;
        call back every ready reader, then every timer."""
        due = [*deadlines, *(due() for due, _ in self.timers)]
        timeout = max(0.0, min(d for d in due if d is not None) - time.monotonic())
        for key, _ in self.sel.select(timeout):
            key.data()
        for _, fire in self.timers:
            fire()

    def take_signals(self) -> Iterator[int]:
        """The signals recorded since the last turn, oldest first (one recorded meanwhile comes too)."""
        while self.signals:
            yield self.signals.pop(0)

    @contextlib.contextmanager
    def owning(self, signums: tuple[int, ...]) -> Iterator[None]:
        """Own ``signums`` while inside (none: the loop may run off the main thread); restore them after."""
        if not signums:
            yield
            return
        with owned_signals(signums, self._on_signal) as owned:

            def drain() -> None:
                owned.drain()  # the wake-up only ends select(); _on_signal has recorded the signal

            self.add_reader(owned.wake_fd, drain)
            try:
                yield
            finally:
                self.remove_reader(owned.wake_fd)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)  # acted on by the loop's owner
