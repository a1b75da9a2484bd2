"""``--precheck``'s head half as the control server holds it (issue 24, issue 38 §3): the agents' ``probe_ready``
and ``probed`` read by kind (``reads``, registered with the control server) and handed to the check that runs
(``xrun.runner.network.precheck_channel``, loaded only when the job's machine asks for one: ``start``). The node
half is ``xrun.launch.network.precheck_answers``. A restart begins without a check (``begin_attempt``): the next
one starts when the machine asks again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xrun.channel import Kind, Message, Reader

if TYPE_CHECKING:
    from xrun.runner.network.node_results import PrecheckResult
    from xrun.runner.network.precheck_channel import ChannelPrecheck


class PrecheckHead:
    """The check that runs, if any, and what it needs of the control server, as callables (see
    ``ChannelPrecheck``)."""

    def __init__(self, *, send: Callable[[int, Message], None],
                 add_timer: Callable[[Callable[[], float | None], Callable[[], None]], None],
                 stopping: Callable[[], bool], done: Callable[[PrecheckResult], None]) -> None:
        self.send, self.add_timer, self.stopping, self.done = send, add_timer, stopping, done
        self.check: ChannelPrecheck | None = None  # while it runs (and after, until the next attempt)

    def reads(self) -> dict[Kind, Reader]:
        return {Kind.PROBE_READY: self._answer, Kind.PROBED: self._answer}

    def begin_attempt(self) -> None:
        self.check = None

    def start(self, nodes: Sequence[int], hosts: Sequence[str], *, toward: str) -> None:
        # Lazy: the network check's coordinator loads only with --precheck (not at a one-node job's start)
        from xrun.runner.network.precheck_channel import ChannelPrecheck

        self.check = ChannelPrecheck(nodes, hosts, toward=toward, now=time.monotonic(), send=self.send,
                                     add_timer=self.add_timer, stopping=self.stopping, done=self.done)

    def _answer(self, node: int, msg: Message, now: float) -> None:
        if self.check is not None:
            self.check.message(node, msg, now)
