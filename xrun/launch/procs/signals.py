"""The one way xrun takes over signals: ``with owned_signals(...) as owned:`` on the main thread.

Every supervisor (the node agent's rank group, the elastic adapter, the runner's control server) needs the same
four steps, and their reverse in any case: remember the previous handlers, install its own (which only record
or raise: cleanup happens on the main path), point ``signal.set_wakeup_fd`` at a pipe its event loop watches,
and keep ignoring what the caller already ignored (``nohup`` leaves SIGHUP ignored, a background job of a
non-interactive shell SIGINT): the user asked for that, so xrun honours it.
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
    try:
        saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        for signum in signums:
            previous = signal.getsignal(signum)
            saved[signum] = previous
            if previous is signal.SIG_IGN and signum in keep_ignored:
                continue
            signal.signal(signum, handler)
        yield OwnedSignals(wake_r)
    finally:
        for signum, previous in saved.items():
            # None: a handler installed from C; the default is the closest thing Python can put back.
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if saved_wakeup is not None:
            signal.set_wakeup_fd(saved_wakeup)
        os.close(wake_r)
        os.close(wake_w)
