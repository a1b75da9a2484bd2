"""xrun's own stdout and stderr, made to survive what a user does to them: bytes that are not UTF-8, a closed
stream (``2>&-``), a reader that goes away (``| head``). Called first by both command lines' entry points.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def tolerant_streams() -> None:
    """Print any argument: a user's bytes that are not UTF-8 (``$'\\xff'``) reach Python as surrogates, which a
    strict ``PYTHONIOENCODING=utf-8`` stream refuses to write; show them escaped instead. And print whatever
    became of the streams: a closed one (``2>&-``) or a reader gone (``| head``) never ends xrun."""
    _open_closed_fds()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
        if not isinstance(stream, _ReaderMayLeave):
            setattr(sys, name, _ReaderMayLeave(stream))


def _open_closed_fds() -> None:
    """A standard stream the caller closed (``xrun train.py 2>&-``) becomes /dev/null: else every notice was an
    EBADF traceback (exit 1, the ranks' codes lost), and the first pipe or socket xrun opened took its number,
    so that the notices went into it."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)  # the lowest free number: fd
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:  # Python found it closed at start
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


class _ReaderMayLeave:
    """stdout or stderr whose reader may go away (``xrun --dry-run | head``, ``xrun train.py 2>&1 | grep -m1``):
    what can no longer be written goes to /dev/null, quietly. Else the next print was a BrokenPipeError
    traceback and the job's exit code became 1, whatever the ranks did."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):  # not a file (tests' StringIO): nothing to redirect
            return
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)  # what is still buffered goes nowhere at the next flush
        os.close(null)

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer: the stream's own
        return getattr(self._stream, name)
