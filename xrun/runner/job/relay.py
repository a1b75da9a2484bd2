"""Relay node output to the head's console in whole lines, so lines of different nodes never interleave.

The agents write whole lines, but a transport (an ssh channel's packets) may split them anywhere; each stream
keeps its unfinished last line until the rest arrives.

With a ``LineMerger`` (xrun.launch.output.dedupe; ``--dedupe``, the default, on a job of several nodes) the head
merges too: every agent already wrote its node's identical lines once, labelled ``[host:0-7] ``; the relay
reads that label back and hands the line to the one merger of the job, so the same line from every node is
shown once as ``[ranks 0-15] text``. A line without a label (the agent's own ``xrun[host]: ...`` notices,
``--no_prefix``) goes through the merger unmerged, so it never overtakes its node's held lines.

``NodeLines`` does the same for pod mode, where the nodes' console writes come as messages to node 0's server.

A relay is one node's stream (the ssh backend: a channel per node) or, with ``source=None``, a launcher's stream
that carries every node's lines (pdsh, mpirun, srun): there each line's node is read from its label, or from an
agent notice's ``xrun[host]: ``, so a node's lines still keep their order through the merger.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from xrun.launch.output.dedupe import LineMerger, expand, is_flood
from xrun.launch.output.writer import writer

if TYPE_CHECKING:
    from xrun.runner.plan import Plan

_MAX_PENDING = 1 << 20  # an endless line is passed on in pieces rather than held without bound


class LineRelay:
    def __init__(self, fd: int, *, merger: LineMerger | None = None, source: str | None = "") -> None:
        self.fd = fd
        self.pending = b""
        self._merger = merger
        # a node's stream: its lines keep their order through the merger (None: each line names its node)
        self._source = None if source is None else (source, fd)

    def feed(self, data: bytes) -> None:
        data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) >= _MAX_PENDING:
            cut = len(data)
        self.pending = data[cut:]
        if cut:
            self._out(data[:cut])
        if b"\r" in self.pending:  # a progress bar's state, which its node shows once settled: shown here now
            self._out_as_is(self.pending)  # too, not at the bar's line end (issue 25)
            self.pending = b""

    def _out_as_is(self, data: bytes) -> None:
        if self._merger is None:
            _console(self.fd, data)
        else:
            self._merger.write_through(self.fd, data)  # after what is held; a \r update is never merged

    def flush(self) -> None:
        """At the end of the stream: the last line, even without its newline."""
        if self.pending:
            self._out(self.pending)
            self.pending = b""

    def _out(self, data: bytes) -> None:
        if self._merger is None:
            _console(self.fd, data)
            return
        if is_flood(data):  # as the node's console does: after what is held, as it comes, never line by line
            self._merger.write_through(self.fd, data)
            return
        now = time.monotonic()
        add, source, fd = self._merger.add, self._source, self.fd
        for line in data.splitlines(keepends=True):
            host, ranks, text = read_label(line)
            mergeable = bool(ranks) and not text.endswith(b"\r")
            add(source or (host or notice_host(line), fd), fd, text, host, ranks, now, mergeable=mergeable)


def read_label(line: bytes) -> tuple[str, list[int], bytes]:
    """``[host:0-7] text`` -> ("host", [0..7], b"text"); a line without such a label -> ("", [], line)."""
    end = line.find(b"] ") if line.startswith(b"[") else -1
    if end > 0:
        host, sep, ranks = line[1:end].rpartition(b":")
        found = expand(ranks.decode("ascii", "replace")) if sep and host else None
        if found:
            return host.decode("utf-8", "surrogateescape"), found, line[end + 2:]
    return "", [], line


def notice_host(line: bytes) -> str:
    """The node of an agent's own ``xrun[host]: ...`` line; "" for any other line."""
    if line.startswith(b"xrun["):
        end = line.find(b"]: ", 5)
        if end > 5:
            return line[5:end].decode("utf-8", "surrogateescape")
    return ""


def head_merger(plan: Plan) -> LineMerger | None:
    """The job's one merger for the lines of several nodes (``--dedupe`` with prefixes and an echo)."""
    return LineMerger(_console, expected=ranks_shown(plan)) if merges_nodes(plan) else None


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


class NodeLines:
    """Every node's stdout and stderr on the head's console, each stream relayed in whole lines, and with
    ``merger`` (``--dedupe``) merged across nodes. The ssh backend feeds it what each node's channel carries;
    node 0's pod server what each node forwards (xrun.launch.output.consoleroute)."""

    def __init__(self, merger: LineMerger | None) -> None:
        self.merger = merger
        self.relays: dict[tuple[str, int], LineRelay] = {}

    def feed(self, host: str, fd: int, data: bytes) -> None:
        relay = self.relays.get((host, fd))
        if relay is None:
            relay = self.relays[host, fd] = LineRelay(fd, merger=self.merger, source=host)
        relay.feed(data)

    def end(self, host: str) -> None:
        """``host``'s streams ended: their last lines, even without a newline."""
        for fd in (1, 2):
            relay = self.relays.get((host, fd))
            if relay is not None:
                relay.flush()

    def register(self, loop: Any) -> None:
        """Held lines are written when due, from the loop that feeds them."""
        merger = self.merger
        if merger is not None:
            loop.add_timer(merger.next_deadline, lambda: merger.flush(time.monotonic()))

    def close(self) -> None:
        """Every node's last lines, before the job's report."""
        for relay in self.relays.values():
            relay.flush()
        if self.merger is not None:
            self.merger.flush_all()
