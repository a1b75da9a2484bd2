"""Where this node's console goes: its own fd 1 and 2, or over the control channel to the head's console.

A node's console writes line records (``Lines``, xrun.common.output.render): its ranks' lines with their rank
sets, merged within the node, and its ``xrun[host]: ...`` notices. Only the head renders them and merges them
across nodes, so while a node's ranks run under a head (``--connect``) its records go there, over the control
channel, and nothing of them is written here (issue 30 §3). In pod mode every node's xrun prints to its own stdout
(its pod's log): with ``--dedupe`` across nodes each node forwards its records to node 0, whose console is the
job's (xrun.runner.job.relay), and keeps writing them here too, rendered, so each pod's log still shows its ranks;
node 0 writes its own only there (over loopback), so they keep their order among the others'.

The route is process-wide, as fd 1 and 2 are: ``routed()`` sets it for the time the ranks run. Where the channel
is gone (the head or node 0 lost), records are written here again, rendered, never dropped. ``deliver`` is one
write along a route; it may block (a console that does not read, a channel that is full), so only the console's
writer thread calls it (xrun.common.output.writer: ``console_write`` and ``console_lines`` queue there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from xrun.common.output.render import Lines, raw, render_lines
from xrun.common.procs.posix import write_all


@dataclass(frozen=True)
class Route:
    """Where this node's console writes go: forwarded to the head (or pod mode's node 0), and whether written here
    as well."""

    forward: Callable[[int, Lines], bool]  # hand (fd, records) over the channel; False: the channel is gone
    keep_local: bool  # write here as well (pod mode: every node but node 0, whose console shows every node's lines)


_route: Route | None = None


def current() -> Route | None:
    """The route console writes take now (None: local only)."""
    return _route


def deliver(fd: int, data: bytes | Lines, route: Route | None) -> bool:
    """Write ``data`` (records, or text of no rank) to the node's console fd (1 or 2) along ``route``; False:
    nobody reads it any more."""
    if route is not None and route.forward(fd, data if isinstance(data, Lines) else raw(data)) and not route.keep_local:
        return True
    return write_all(fd, data if isinstance(data, bytes) else render_lines(data))


@contextmanager
def routed(route: Route | None) -> Iterator[None]:
    """Send the console along ``route`` (None: leave it local) until the block ends."""
    global _route  # noqa: PLW0603 - the console is one per process, as its fds are
    before, _route = _route, route
    try:
        yield
    finally:
        _route = before
