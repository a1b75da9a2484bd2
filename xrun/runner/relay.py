"""Relay node output to the head's console in whole lines, so lines of different nodes never interleave.

The agents write whole lines, but a transport (an ssh channel's packets) may split them anywhere; each stream
keeps its unfinished last line until the rest arrives.
"""

from __future__ import annotations

from xrun.launch.posix import write_all

_MAX_PENDING = 1 << 20  # an endless line is passed on in pieces rather than held without bound


class LineRelay:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""

    def feed(self, data: bytes) -> None:
        data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < _MAX_PENDING:
            self.pending = data
            return
        if cut == 0:
            cut = len(data)
        self.pending = data[cut:]
        write_all(self.fd, data[:cut])

    def flush(self) -> None:
        """At the end of the stream: the last line, even without its newline."""
        if self.pending:
            write_all(self.fd, self.pending)
            self.pending = b""
