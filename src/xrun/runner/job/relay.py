"""The head's console: every node's lines on one console, merged across nodes (issue 17, issue 30 §3).

Two inputs, one ``JobConsole`` (xrun.common.output.render, where every label is rendered):

* what each node's console says, as line records over the control channel (``lines`` messages: its ranks' lines
  with their rank sets, already merged within the node, and its ``xrun[host]: ...`` notices), fed by the control
  server (xrun.runner.job.control_server; node 0's in pod mode) as they come, each node's in its order;
* what the backends' own streams still carry (``StreamLines``): an ssh channel's stdout and stderr, a launcher's
  (pdsh, mpirun, hydra, srun). Nothing of the ranks travels there while the channel is up. They carry what an
  engine or an agent writes outside its console: ssh's and the engines' own words (a host that cannot be reached,
  hydra's), an agent's failure to reach the head, a Python traceback, its node's failure report and last line,
  pdsh's announced keys and its echoes of the stop (both taken out before: xrun.channel.announce,
  xrun.runner.backends.echoes), and a node's console lines once its channel is gone (written there, labelled,
  never dropped). It is relayed in whole lines, as text of no rank, through the same console, so it keeps its
  place after the lines the merger holds and never lands inside another line.

``head_console(plan)`` is the job's console: with ``--dedupe`` (the default) on a job of several nodes, with
prefixes and an echo, it merges, so a line every rank prints is shown once as ``[ranks 0-15] text``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from xrun.common.output.render import JobConsole, raw
from xrun.common.output.writer import writer

if TYPE_CHECKING:
    from xrun.runner.plan import Plan

_MAX_PENDING = 1 << 20  # an endless line is passed on in pieces rather than held without bound


def head_console(plan: Plan) -> JobConsole:
    """The job's one console at the head: merging across nodes where ``merges_nodes``."""
    return JobConsole(_console, merge=merges_nodes(plan), expected=ranks_shown(plan))


def _console(fd: int, data: bytes) -> None:
    """The head's console, never waited on: its control loop must go on seeing the nodes (issue 25 §3)."""
    writer().offer(fd, data)


def merges_nodes(plan: Plan) -> bool:
    """Whether the head merges the lines of several nodes: ``--dedupe`` with prefixes and an echo."""
    options = plan.request.options
    return options.dedupe and options.prefix and not options.quiet and len(plan.nodes) > 1


def ranks_shown(plan: Plan) -> int | None:
    """How many ranks the head's console shows (a line all of them said goes out at once); None for an elastic
    job, whose world changes."""
    if any(node.elastic is not None for node in plan.nodes):
        return None
    ranks = {rank.rank for node in plan.nodes for rank in node.ranks}
    shown = plan.request.options.console_ranks
    return len(ranks if shown is None else ranks.intersection(shown))


class StreamLines:
    """One of a backend's own streams on the head's console in whole lines: a transport may split them anywhere,
    so the unfinished last line waits for the rest (a progress bar's state, which has a ``\\r``, goes at once)."""

    def __init__(self, console: JobConsole, source: Hashable, fd: int) -> None:
        self.console = console
        self.source = source
        self.fd = fd
        self.pending = b""

    def feed(self, data: bytes) -> None:
        data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) >= _MAX_PENDING:
            cut = len(data)
        self.pending = data[cut:]
        if b"\r" in self.pending:
            cut, self.pending = len(data), b""
        if cut:
            self.console.add(self.source, self.fd, raw(data[:cut]), time.monotonic())

    def flush(self) -> None:
        """At the end of the stream: the last line, even without its newline."""
        if self.pending:
            self.console.add(self.source, self.fd, raw(self.pending), time.monotonic())
            self.pending = b""
