"""The one way xrun takes over signals: ``with owned_signals(...) as owned:`` on the main thread.

Every supervisor (the node agent's rank group, the elastic adapter, the runner's control server) needs the same
four steps, and their reverse in any case: remember the previous handlers, install its own (which only record
or raise: cleanup happens on the main path), point ``signal.set_wakeup_fd`` at a pipe its event loop watches,
and keep ignoring what the caller already ignored (``nohup`` leaves SIGHUP ignored, a background job of a
non-interactive shell SIGINT): the user asked for that, so xrun honours it.

Between two owners a signal must not take its default action either (pod mode: a SIGTERM between the start
barrier and the rank group killed that node's xrun outright, and the other nodes exited 1 instead of 143).
``SignalLatch`` is installed once, where the process starts, and owns the signals whenever nobody else does: its
handler only records the signal and tells its listeners (which only translate: a queue put, a pipe write). An
owner that takes over from it (``owned_signals``) is handed at once what arrived while nobody owned the signals,
and the latch goes on hearing every signal the owner gets, so the code around the owners knows it was signalled.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Union

Handler = Callable[[int, Union[FrameType, None]], Any]

SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Ignored before xrun started means "the user wants this ignored"; SIGTERM is never that (it is how a
# scheduler or Kubernetes stops a job), so it is always taken over.
KEEP_IGNORED = frozenset({signal.SIGINT, signal.SIGHUP})


class OwnedSignals:
    """What ``owned_signals`` hands the caller: the read end of the wake-up pipe."""

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd  # readable after any signal arrived; register it with the event loop

    def drain(self) -> bytes:
        """Empty the wake-up pipe; returns the signal numbers written to it (one byte each)."""
        data = b""
        try:
            while True:
                chunk = os.read(self.wake_fd, 4096)
                if not chunk:
                    break
                data += chunk
        except BlockingIOError:
            pass
        except OSError:
            pass
        return data


class SignalLatch:
    """The handler while no supervisor owns the shutdown signals (see the module doc). ``count`` grows with every
    signal heard, owned by another or not; ``last`` is the latest."""

    def __init__(self) -> None:
        self.count = 0
        self.last: int | None = None
        self._unowned: list[int] = []  # heard while nobody else owned them: the next owner's to act on
        self._listeners: list[Callable[[int], object]] = []

    def __call__(self, signum: int, _frame: FrameType | None = None) -> None:
        self._unowned.append(signum)
        self.heard(signum)

    def heard(self, signum: int) -> None:
        self.count += 1
        self.last = signum
        for listener in self._listeners:
            listener(signum)

    def listen(self, listener: Callable[[int], object]) -> None:
        """Call ``listener(signum)`` for every signal from now on, and at once for the last one heard before."""
        self._listeners.append(listener)
        if self.last is not None:
            listener(self.last)

    def hand_over(self, signums: Iterable[int]) -> list[int]:
        """The signals among ``signums`` that nobody acted on yet, oldest first; they are the caller's now."""
        wanted = set(signums)
        taken = [s for s in self._unowned if s in wanted]
        self._unowned = [s for s in self._unowned if s not in wanted]
        return taken

    @contextmanager
    def installed(self, signums: Iterable[int] = SHUTDOWN_SIGNALS) -> Iterator[SignalLatch]:
        """Own ``signums`` with this latch from now on (what the caller ignored stays ignored); restore after."""
        saved: dict[int, Any] = {}
        try:
            for signum in signums:
                saved[signum] = signal.getsignal(signum)
                if saved[signum] is signal.SIG_IGN and signum in KEEP_IGNORED:
                    continue
                signal.signal(signum, self)
            yield self
        finally:
            for signum, previous in saved.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def _chained(latch: SignalLatch, handler: Handler) -> Handler:
    """``handler``, the latch hearing each signal first (it only records and tells its listeners)."""

    def both(signum: int, frame: FrameType | None) -> Any:
        latch.heard(signum)
        return handler(signum, frame)

    return both


@contextmanager
def owned_signals(
    signums: Iterable[int], handler: Handler, *, keep_ignored: frozenset[int] = KEEP_IGNORED
) -> Iterator[OwnedSignals]:
    """Install ``handler`` for ``signums`` and a wake-up pipe; restore everything on the way out."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    saved: dict[int, Any] = {}
    saved_wakeup: int | None = None
    latch: SignalLatch | None = None
    try:
        saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for signum in signums:
            previous = signal.getsignal(signum)
            saved[signum] = previous
            if previous is signal.SIG_IGN and signum in keep_ignored:
                continue
            latch = previous if isinstance(previous, SignalLatch) else latch
            signal.signal(signum, _chained(previous, handler) if isinstance(previous, SignalLatch) else handler)
        for signum in latch.hand_over(saved) if latch is not None else ():
            handler(signum, None)  # came before this owner took over: it acts on it now (may raise, as a signal)
        yield OwnedSignals(wake_r)
    finally:
        for signum, previous in saved.items():
            # None: a handler installed from C; the default is the closest thing Python can put back.
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if saved_wakeup is not None:
            signal.set_wakeup_fd(saved_wakeup)
        os.close(wake_r)
        os.close(wake_w)
