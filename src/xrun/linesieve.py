"""A byte stream as it comes, with some whole lines taken out and everything else passed on at once.

The head reads each launcher's stderr this way twice over: the one-time keys that pdsh's agents announce
(``xrun.channel.announce``) and pdsh's echoes of xrun's own stop (``xrun.runner.backends.echoes``). Only a line start
that may still become such a line (it matches ``prefix`` so far, and is at most ``max_line`` bytes) is held back
until its end, so a rank's progress bar or partial line is never delayed.
"""

from __future__ import annotations

from typing import Callable


class LineSieve:
    """Lines that start with ``prefix`` and that ``take`` accepts are taken out; all else passes."""

    def __init__(self, prefix: bytes, max_line: int) -> None:
        self._prefix, self._max_line = prefix, max_line
        self._held = b""
        self._mid_line = False

    def feed(self, chunk: bytes, take: Callable[[bytes], bool]) -> bytes:
        """The bytes to write now; ``take`` judges each complete candidate line (without its newline)."""
        data, self._held = self._held + chunk, b""
        out = bytearray()
        i = 0
        while i < len(data):
            newline = data.find(b"\n", i)
            if not self._mid_line:
                line = data[i:] if newline < 0 else data[i:newline]
                if line[: len(self._prefix)] == self._prefix[: len(line)] and len(line) <= self._max_line:
                    if newline < 0:
                        self._held = bytes(line)  # may still become a line to take out
                        break
                    if take(line):
                        i = newline + 1
                        continue
            end = len(data) if newline < 0 else newline + 1
            out += data[i:end]
            self._mid_line = newline < 0
            i = end
        return bytes(out)

    def flush(self) -> bytes:
        """What is held at the end of the stream: it never became a whole line."""
        held, self._held = self._held, b""
        return held
