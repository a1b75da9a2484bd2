"""Small POSIX helpers shared by the agent and the runner."""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Callable


def write_all(fd: int, data: bytes) -> bool:
    """Write everything (a terminal may take less per call); False when the reader is gone."""
    view = memoryview(data)
    while True:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # someone made the fd non-blocking: wait until it can take more
            select.select([], [fd], [])
            continue
        except OSError:
            return False
        if written == len(view):
            return True
        view = view[written:]


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number with no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


_BEFORE_LEAVING: list[Callable[[], object]] = []


def on_leave(hook: Callable[[], object]) -> None:
    """Run ``hook`` in ``leave`` before the process ends (the console's writer thread drains there)."""
    _BEFORE_LEAVING.append(hook)


def leave(code: int) -> None:
    """Flush Python's stdout and stderr and end the process now, without CPython's interpreter teardown.

    The entry points call it once everything is over (every rank gone, every file closed): module cleanup and
    collecting all that was imported would only add milliseconds of CPU to every process's end.
    """
    for hook in _BEFORE_LEAVING:
        hook()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # the reader went away (| head): nothing left to say
            pass
    os._exit(code)
