"""The stop policy of a RankGroup (``xrun.launch.ranks.supervise``): one signal to every rank's process group, one
monotonic deadline, then SIGKILL; then what outlived its rank in their sessions, against the same deadline.

It decides and signals through the reaper (xrun.launch.ranks.reaper); the group's loop asks it how long to wait
(``timeout``), lets it enforce the deadlines (``check``) and runs until it is ``done``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from xrun.common.output.streams import notice
from xrun.common.procs.posix import signal_name
from xrun.launch.ranks.reaper import RankState, Reaper

KILL_WAIT = 5.0  # after SIGKILL, how long to wait for the kernel before reporting what would not die
POLL = 0.02  # only without pidfd (Linux < 5.3): how often leftovers are rechecked


class Teardown:
    """The stop policy of a RankGroup: one signal to the ranks' groups, one deadline, then SIGKILL.

    Once every main process is gone, what is still alive in their sessions is swept against the same deadline
    (TERM, then KILL); ``KILL_WAIT`` after SIGKILL, whatever still stands is reported and given up on.
    """

    def __init__(
        self,
        reaper: Reaper,
        *,
        host: str,
        shutdown_timeout: float,
        collect_exits: Callable[[], None],
        finish: Callable[[RankState], None],
        before_notice: Callable[[], None] = lambda: None,
        held: Callable[[], bool] = lambda: False,
    ) -> None:
        self._host = host
        # --replica_groups: a group across nodes waits for the head's start with none of its ranks here running:
        # the node is not over until it starts again, or a stop begins
        self._held = held
        self._shutdown_timeout = shutdown_timeout
        self._before_notice = before_notice  # held console lines go out before the agent speaks
        self._reaper = reaper
        self._collect_exits = collect_exits  # before signalling: who exited on its own in the same instant
        self._finish = finish  # a rank given up on
        self.signum: int | None = None  # what the ranks were sent; None until a stop begins
        self.deadline: float | None = None  # the one SIGTERM -> SIGKILL deadline
        self._kill_deadline: float | None = None  # set once SIGKILL went out
        self._sweeping = False  # every main process is gone; members of their sessions are still alive
        self.done = False

    def begin(self, signum: int, reason: str) -> None:
        """Send ``signum`` to every running rank's group and start the deadline (SIGKILL: escalate at once)."""
        if signum == signal.SIGKILL:
            self.escalate(reason)
            return
        if self.signum is not None:
            return
        self.signum = signum
        self.deadline = time.monotonic() + self._shutdown_timeout
        self._collect_exits()  # ranks that exited in the same instant failed on their own
        count = self._reaper.signal_running(signum)  # none before run(): nothing is started
        if count:
            self._notice(
                f"{reason}; stopping {count} rank{'s' if count != 1 else ''} "
                f"({signal_name(signum)}, SIGKILL after {self._shutdown_timeout:g} s)"
            )

    def escalate(self, reason: str) -> None:
        """SIGKILL every group now, running ranks and anything left in their sessions."""
        if self._kill_deadline is not None:
            return
        if self.signum is None:
            self.signum = signal.SIGKILL
        now = time.monotonic()
        self.deadline = self.deadline if self.deadline is not None else now
        self._kill_deadline = now + KILL_WAIT
        count = self._reaper.signal_running(signal.SIGKILL)
        members = self._reaper.kill_sessions(signal.SIGKILL)
        if count or members:
            self._notice(f"{reason}: SIGKILL to {count} rank(s) and {len(members)} process(es) in their sessions")

    def timeout(self) -> float | None:
        """How long the event loop may wait before the next deadline (or the next leftover poll)."""
        now = time.monotonic()
        if self._kill_deadline is not None:
            timeout: float | None = self._kill_deadline - now
        elif self.deadline is not None:
            timeout = self.deadline - now
        else:
            timeout = None
        if self._sweeping and not self._reaper.have_pidfd:
            timeout = POLL if timeout is None else min(timeout, POLL)
        return None if timeout is None else max(0.0, timeout)

    def check(self) -> None:
        """Enforce the deadlines; once every main process is gone, sweep."""
        now = time.monotonic()
        if self._kill_deadline is not None and now >= self._kill_deadline:
            self._give_up()
            return
        if self._kill_deadline is None and self.deadline is not None and now >= self.deadline:
            self.escalate("the shutdown deadline passed")
        if not self.done and not self._reaper.running() and (self.signum is not None or not self._held()):
            if not self._sweeping or not self._reaper.watching:
                self.sweep()

    def sweep(self) -> None:
        """Every main process is gone: stop what is still alive in their sessions, or finish."""
        members = self._reaper.live()
        if not members:
            self.done = True
            return
        if not self._sweeping:
            self._sweeping = True
            if self.deadline is None:
                self.deadline = time.monotonic() + self._shutdown_timeout
            shown = ", ".join(str(p.pid) for p in members[:8]) + (", ..." if len(members) > 8 else "")
            self._notice(f"{len(members)} process(es) outlived their rank ({shown}); stopping them")
        self._reaper.sweep(members, signal.SIGKILL if self._kill_deadline is not None else signal.SIGTERM)

    def _give_up(self) -> None:
        """SIGKILL went out KILL_WAIT ago and something is still there (uninterruptible sleep): report it."""
        stuck = self._reaper.running()
        members = self._reaper.live()
        self._notice(
            f"giving up on rank(s) {[r.spec.rank for r in stuck]} and process(es) {[p.pid for p in members]} "
            f"still alive {KILL_WAIT:g} s after SIGKILL"
        )
        for rank in stuck:
            rank.signalled = rank.reaped = True
            self._finish(rank)
        self._reaper.hold(members)
        self.done = True

    def _notice(self, text: str) -> None:
        self._before_notice()
        notice(self._host, text)
