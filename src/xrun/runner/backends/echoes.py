"""pdsh's own lines about the sessions xrun's stop ended: kept off the console.

With ``-S`` pdsh reports every remote command that exits non-zero, one line per node
(``pdsh@head: node2: ssh exited with exit code 143``). When xrun stops a job early (a rank failed, Ctrl-C, the
start barrier timed out), every node's agent stops its ranks and exits with its node's code, 143 for a node xrun
stopped, and pdsh says so for each: after xrun's own report, which already names how every node ended, that reads
like a second failure. ``EchoFilter`` drops such a line when the control server finds it only echoes the job's stop
(``xrun.runner.job.stop.Stop.echoed``: the stop began, and the code is one the stop's signals give, 130, 137 or
143, or the code that node's agent already reported on the channel). ssh's own failures (255, a refused connection,
an unknown host) are never dropped, and still end a node's wait at once (``launcher_process``).

Everything else passes at once: only a line start that may still become one of pdsh's lines (``pdsh@``) is held
until its end (pdsh writes each of its lines whole), so a rank's progress bar or partial line is never delayed.
"""

from __future__ import annotations

import re
from typing import Callable

from xrun.linesieve import LineSieve

PREFIX = b"pdsh@"
_EXIT_LINE = re.compile(rb"pdsh@[^\s:]+: ([^\s:]+): ssh exited with exit code (\d{1,3})")
MAX_LINE = 1024  # a longer line at a line start is not one of pdsh's exit lines: written through

Echoed = Callable[[str, int], bool]  # (host, exit code) -> only the echo of the job's stop


def exit_line(line: bytes) -> tuple[str, int] | None:
    """``(host, code)`` of pdsh's ``ssh exited with exit code N`` line (without its newline), else None."""
    match = _EXIT_LINE.fullmatch(line.rstrip(b"\r"))
    return (match.group(1).decode("utf-8", "replace"), int(match.group(2))) if match else None


class EchoFilter:
    """A launcher's stderr as it comes: pdsh's echoes of the stop taken out, everything else passed on at once."""

    def __init__(self) -> None:
        self._sieve = LineSieve(PREFIX, MAX_LINE)

    def feed(self, chunk: bytes, echoed: Echoed) -> bytes:
        """The bytes to write now; ``echoed`` judges each complete exit line."""

        def take(line: bytes) -> bool:
            said = exit_line(line)
            return said is not None and echoed(*said)

        return self._sieve.feed(chunk, take)

    def flush(self) -> bytes:
        """What is held at the end of the stream: it never became a whole line."""
        return self._sieve.flush()
