"""Where this node's console goes: its own fd 1 and 2, or in pod mode node 0's console too (issue 17).

Across nodes, identical lines are merged where every node's lines meet. With a launcher that is the head, which
reads every agent's output. In pod mode every node's xrun prints to its own stdout (its pod's log), so nothing
meets: there each node forwards what its console writes (its ranks' lines, already merged within the node and
labelled ``[host:0-7] ``, and its ``xrun[host]: ...`` notices) over the control channel to node 0, whose server
relays every node's lines through one merger (xrun.runner.job.relay) onto node 0's console. Node 0's own lines go
the same way (over loopback), so they keep their order among the others'. The other nodes keep writing their
own lines locally too, so each pod's log still shows its ranks.

The route is process-wide, as fd 1 and 2 are: ``routed()`` sets it for the time the ranks run. Where the channel
is gone (node 0 lost), lines are written locally again. ``deliver`` is one write along a route; it may block (a
console that does not read, a channel to node 0 that is full), so only the console's writer thread calls it
(xrun.launch.output.writer: ``console_write`` queues there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from xrun.launch.procs.posix import write_all


@dataclass(frozen=True)
class Route:
    """Where this node's console writes go: forwarded to node 0 (pod mode), and whether written here as well."""

    forward: Callable[[int, bytes], bool]  # hand (fd, bytes) to node 0; False: the channel is gone
    keep_local: bool  # write here as well (every node but node 0, whose console shows every node's lines)


_route: Route | None = None


def current() -> Route | None:
    """The route console writes take now (None: local only)."""
    return _route


def deliver(fd: int, data: bytes, route: Route | None) -> bool:
    """Write ``data`` to the node's console fd (1 or 2) along ``route``; False: nobody reads it any more."""
    if route is not None and route.forward(fd, data) and not route.keep_local:
        return True
    return write_all(fd, data)


@contextmanager
def routed(route: Route | None) -> Iterator[None]:
    """Send the console along ``route`` (None: leave it local) until the block ends."""
    global _route  # noqa: PLW0603 - the console is one per process, as its fds are
    before, _route = _route, route
    try:
        yield
    finally:
        _route = before
