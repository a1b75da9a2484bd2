"""Small POSIX helpers shared by the agent and the runner."""

from __future__ import annotations

import os
import select
import signal


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
