"""What a RankGroup's caller plugs into its loop (``xrun.launch.ranks.supervise``) besides readers: timers, signals
that stop nothing, a hook before the first failure stops the other ranks, and one once they have all ended
(xrun.launch.doctor.node_doctor)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from xrun.common.result.outcome import RankOutcome


# A base class is evaluated when the module loads: Python 3.9 has no ``float | None`` there.
class Timers(list[tuple[Callable[[], Optional[float]], Callable[[], None]]]):  # noqa: UP045
    """Timers in a RankGroup's loop: each a due time (monotonic, None: not now) and what to call then."""

    def add(self, due: Callable[[], float | None], on_due: Callable[[], None]) -> None:
        self.append((due, on_due))

    def timeout(self, timeout: float | None) -> float | None:
        """``timeout`` (the teardown's; None: none), shortened to the next timer's due time."""
        if not self:
            return timeout
        now = time.monotonic()
        for due, _ in self:
            at = due()
            if at is not None:
                timeout = max(0.0, at - now) if timeout is None else min(timeout, max(0.0, at - now))
        return timeout

    def run(self) -> None:
        now = time.monotonic()
        for due, on_due in self:
            at = due()
            if at is not None and now >= at:
                on_due()


@dataclass
class Plugins:
    """What xrun.launch.doctor.node_doctor plugs into a RankGroup's loop besides readers (``add_reader``)."""

    signals: dict[int, Callable[[], None]] = field(default_factory=dict)  # owned too; they stop nothing
    timers: Timers = field(default_factory=Timers)
    before_failure_stop: Callable[[], None] | None = None  # the first failure, before the others are stopped
    # every rank has ended, before the node's result is made: how each ended
    before_result: Callable[[Sequence[RankOutcome]], None] | None = None
