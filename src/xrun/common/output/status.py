"""What xrun itself shows while the nodes join: a rich status line on a terminal, plain log lines otherwise; and
while the job trains, the ranks named stragglers (issue 31), said again every ``STRAGGLERS_EVERY`` s while any is.

The head's control server (``xrun.runner.job.control_server``) shows the job state machine's ``Show*`` actions
through one of these, and in pod mode every node's agent shows node 0's barrier status the same way
(``xrun.launch.session.driver``); ``say`` is the one way xrun writes a line of its own to stderr. Both print through
``one_line``: a line may quote what a peer sent (a host name, a version, a reason, a rank's tail, stacks), and its
control characters are shown escaped, never sent to the terminal (issue 22 §6).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from xrun.printable import one_line

# the ranks' output owns the console once they start, so the stragglers' word is a line, repeated while it holds
STRAGGLERS_EVERY = 300.0


def say(text: str) -> None:
    sys.stderr.write(f"xrun: {one_line(text)}\n")
    sys.stderr.flush()


class PlainStatus:
    """Non-TTY: a line when every node is ready, and one every 10 s while some are missing."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.last_wait_line = 0.0
        self.stragglers_now: str | None = None  # "straggler: rank 5 (node3) +210 ms", while any is named
        self._stragglers_said = 0.0

    def joined(self, host: str, ready: int, total: int) -> None:
        pass

    def waiting(self, ready: int, missing: list[str], elapsed: float) -> None:
        if elapsed - self.last_wait_line >= 10.0:
            self.last_wait_line = elapsed
            if elapsed >= 10.0:
                say(waiting_line(ready, self.total, missing, elapsed))

    def started(self, nodes: int, ranks: int, elapsed: float, master_addr: str, master_port: Any) -> None:
        say(f"{nodes}/{nodes} nodes ready in {elapsed:.2f} s; starting {ranks} ranks "
            f"(master {master_addr}:{master_port})")

    def line(self, text: str) -> None:
        say(text)

    def stragglers(self, word: str | None, now: float) -> None:
        """The ranks named stragglers now (``StragglerScores.status``), or None, at each sample (``now``:
        monotonic s). Naming one and its recovery are lines of their own (``line``); in between the word is said
        again every ``STRAGGLERS_EVERY`` s, so a long job's console shows who holds it back now."""
        if word is None or self.stragglers_now is None:
            self._stragglers_said = now  # named just now (its own line said so), or none: nothing to repeat
        elif now - self._stragglers_said >= STRAGGLERS_EVERY:
            self._stragglers_said = now
            say(f"{word} (still)")
        self.stragglers_now = word

    def close(self) -> None:
        pass


class RichStatus(PlainStatus):
    """TTY: one live line ("2/3 nodes ready; waiting for node3 (4 s)"), gone once the ranks start."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        from rich.console import Console  # lazy: rich costs ~50 ms and only a terminal needs it
        from rich.text import Text

        self.console = Console(stderr=True)
        self._text = Text  # plain text: a host name's "[...]" is no markup
        self.live: Any = self.console.status(f"0/{total} nodes ready")
        self.live.start()

    def joined(self, host: str, ready: int, total: int) -> None:
        if self.live is not None:
            self.live.update(f"{ready}/{total} nodes ready")

    def waiting(self, ready: int, missing: list[str], elapsed: float) -> None:
        if self.live is not None:
            self.live.update(self._text(waiting_line(ready, self.total, missing, elapsed)))

    def started(self, nodes: int, ranks: int, elapsed: float, master_addr: str, master_port: Any) -> None:
        self.close()
        super().started(nodes, ranks, elapsed, master_addr, master_port)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def waiting_line(ready: int, total: int, missing: list[str], elapsed: float) -> str:
    """``5/8 nodes ready; waiting for node3, node7 (4 min 10 s)``: the start barrier's one status line."""
    return f"{ready}/{total} nodes ready; waiting for {_names(missing)} ({duration(elapsed)})"


def duration(seconds: float) -> str:
    """``40 s``, ``4 min 10 s``, ``1 h 2 min``: a wait as a person reads it."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _names(hosts: list[str], limit: int = 4) -> str:
    shown = ", ".join(one_line(host) for host in hosts[:limit])
    return shown + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def make_status(total: int) -> PlainStatus:
    if os.isatty(2):
        try:
            return RichStatus(total)
        except ImportError:
            pass
    return PlainStatus(total)
