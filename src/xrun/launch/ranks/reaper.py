"""Who is gone and what is left of a node's ranks: the process side of the supervisor.

``RankState`` is one rank's process as the supervisor tracks it. ``Reaper`` carries out what the stop policy
of xrun.launch.ranks.supervise decides, and reports what it finds:

* ``watch`` / ``collect`` / ``finish``: a pidfd per rank main process (readable once it exits; Linux >= 5.3,
  else SIGCHLD alone tells), ``wait4`` for its status and the kernel's accounting (CPU time, peak RSS), then
  its last output read and its ``RankOutcome``; a rank forked from the preload helper runs its program only once
  it is watched, and ``watch_helper`` says at once when that helper is gone (xrun.launch.preload.client);
* ``signal_running`` / ``kill_sessions``: signal the ranks' process groups, or every group alive in their
  sessions; ``kill_now`` is the emergency path when the supervisor leaves by an exception;
* ``reap_orphans``: as child subreaper the agent inherits what the ranks' sessions orphan;
* ``live`` / ``sweep`` / ``hold``: once every main process is gone, what is left of the ranks (members of their
  sessions still alive, a leaked DataLoader worker, torch_shm_manager; daemons that left them:
  xrun.launch.ranks.survivors) is signalled, watched through pidfds and remembered as the rank's leftovers, which
  ``outcomes`` adds to each rank's outcome at the end.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import IO, TYPE_CHECKING

from xrun.common.output.streams import Console, RankStream, notice
from xrun.common.output.writer import console_write
from xrun.common.result.errorfile import read_error_file
from xrun.common.result.outcome import RankOutcome
from xrun.launch.procs import proctable
from xrun.launch.procs.proctable import ProcInfo
from xrun.launch.procs.watchdog import Watchdog
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.survivors import Survivors

if TYPE_CHECKING:
    import resource

    from xrun.launch.preload.client import ForkedRank, PreloadHelper

_EMERGENCY_WAIT = 2.0  # kill_now: how long to wait for SIGKILLed ranks before leaving anyway


class RankState:
    """One rank's process: started, exited, reaped, and what became of it."""

    __slots__ = (
        "spec", "pid", "popen", "pipes", "held", "pidfd", "started", "returncode", "signal", "signalled", "reaped",
        "streams", "outcome", "start_error", "rusage",
    )  # fmt: skip

    def __init__(self, spec: RankProcess) -> None:
        self.spec = spec
        self.pid = 0
        self.popen: subprocess.Popen[bytes] | None = None  # a rank started by Popen
        self.pipes: tuple[IO[bytes], IO[bytes]] | None = None  # the read ends of its stdout and stderr
        self.held: ForkedRank | None = None  # a rank forked from the preload helper, not yet let run
        self.pidfd: int | None = None
        self.started = 0.0  # monotonic
        self.returncode: int | None = None
        self.signal: int | None = None
        self.signalled = False  # xrun signalled its group: its end is a consequence
        self.reaped = False
        self.streams: list[RankStream] = []  # stdout, stderr
        self.outcome: RankOutcome | None = None
        self.start_error: str | None = None
        self.rusage: resource.struct_rusage | None = None  # from wait4 when it was reaped

    @property
    def running(self) -> bool:
        """Started and not yet reaped: its pid (and so its process group id) is still ours."""
        return self.pid > 0 and not self.reaped

    def to_outcome(self, host: str, *, stopped: bool, runtime_s: float) -> RankOutcome:
        if self.start_error:
            tail: tuple[str, ...] = (self.start_error,)
        else:
            tail = self.streams[1].tail_lines() if len(self.streams) > 1 else ()
        return RankOutcome(
            host=host,
            rank=self.spec.rank,
            local_rank=self.spec.local_rank,
            pid=self.pid,
            returncode=self.returncode,
            signal=self.signal,
            runtime_s=runtime_s,
            stderr_tail=tail,
            stopped_by_xrun=stopped,
            error=read_error_file(self.spec.error_file) if self.returncode != 0 else None,
            cpu_s=self.rusage.ru_utime + self.rusage.ru_stime if self.rusage is not None else None,
            peak_rss_bytes=self.rusage.ru_maxrss * 1024 if self.rusage is not None else None,  # Linux: KiB
        )


class Reaper:
    """The ranks' main processes and the members of their sessions, from start to the last one gone."""

    def __init__(
        self, ranks: Sequence[RankState], host: str, console: Console, *, on_leftovers_gone: Callable[[], None]
    ) -> None:
        self._ranks = ranks
        self._host = host
        self._console = console  # a rank's last output is read before its outcome is recorded
        self._on_leftovers_gone = on_leftovers_gone  # every watched leftover exited: time to look again
        self._sel: selectors.BaseSelector | None = None
        self._watchdog: Watchdog | None = None
        self.have_pidfd = False  # False: SIGCHLD and a poll tell instead (set by attach)
        self._leftovers: dict[int, list[int]] = {}  # sid -> pids
        self._sent: dict[int, int] = {}  # leftover pid -> the strongest signal its group got
        self._leftover_fds: dict[int, int] = {}  # pidfd -> pid
        self._survivors = Survivors()
        self._retired: set[int] = set()  # sessions of a replica group's ranks started again since (``retire``)

    def attach(self, sel: selectors.BaseSelector, watchdog: Watchdog | None, *, pidfd: bool,
               subreaper: bool = False) -> None:
        """The event loop the pidfds go to (``pidfd``: use them), the watchdog (our child, not an orphan), and
        whether this process is the ranks' child subreaper (their orphans come to it)."""
        self._sel = sel
        self._watchdog = watchdog
        self.have_pidfd = pidfd
        self._survivors.attach(watchdog.pid if watchdog is not None else None, subreaper=subreaper)

    def sids(self) -> set[int]:
        """The ranks' sessions, of the runs before a replica group's restart too: a started rank's pid is its
        session id."""
        return {r.pid for r in self._ranks if r.pid} | self._retired

    def retire(self, rank: RankState) -> None:
        """``rank`` is done and gives its place to a new run of it (``--replica_groups``): its session stays one of
        the node's, so that what it left is reaped and swept as any rank's."""
        if rank.pid:
            self._retired.add(rank.pid)

    # -- main processes -------------------------------------------------------------------------------------

    def watch(self, rank: RankState, on_exit: Callable[[], None]) -> None:
        """Call ``on_exit()`` from the event loop once the rank's main process exits (without pidfd: nothing)."""
        if not self.have_pidfd:
            return
        try:
            rank.pidfd = os.pidfd_open(rank.pid)
        except OSError as err:
            if err.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            self.have_pidfd = False  # Linux < 5.3 (or seccomp): SIGCHLD alone tells us
        else:
            self._sel.register(rank.pidfd, selectors.EVENT_READ, on_exit)  # type: ignore[union-attr]
        if rank.held is not None:  # forked: it runs its program only now that it is watched
            rank.held.release()
            rank.held = None

    def watch_helper(self, helper: PreloadHelper) -> None:
        """Say at once when the preload helper the ranks are forked from is gone: its socket turns readable. The
        running ranks do not need it; a rank not yet forked cannot start (its start error says why)."""

        def lost() -> None:
            self._unregister(helper.fileno())
            how = helper.lost()
            self.reap_orphans()  # its zombie, now reaped, held up the orphans behind it
            notice(self._host, f"the preload helper (pid {helper.pid}) {how}; the running ranks go on, but no rank "
                               "can be forked from it again")

        self._sel.register(helper.fileno(), selectors.EVENT_READ, lost)  # type: ignore[union-attr]
    def collect(self) -> list[RankState]:
        """Reap every rank main process that has exited; return them in the order found.

        All statuses are collected before the caller acts on any, so ranks that failed in the same instant all
        count as failing on their own rather than as stopped by the first one's teardown.
        """
        exited = []
        for rank in self._ranks:
            if not rank.running:
                continue
            try:
                # wait4, not waitpid: the same status plus the kernel's accounting of the child (CPU, peak RSS)
                pid, status, rusage = os.wait4(rank.pid, os.WNOHANG)
            except ChildProcessError:  # somebody else reaped it: its status is lost
                pid, status, rusage = rank.pid, None, None
            if pid == 0:
                continue
            rank.reaped = True
            rank.rusage = rusage
            if status is not None:
                if os.WIFSIGNALED(status):
                    rank.signal = os.WTERMSIG(status)
                else:
                    rank.returncode = os.waitstatus_to_exitcode(status)
            if rank.popen is not None:  # so Popen never waits for a pid that is no longer ours
                rank.popen.returncode = rank.returncode if rank.signal is None else -rank.signal
            exited.append(rank)
        return exited

    def finish(self, rank: RankState, *, stopped: bool) -> RankOutcome:
        """Account for a rank whose main process is gone (or given up on): read its last output, record it."""
        runtime_s = time.monotonic() - rank.started if rank.pid else 0.0
        if rank.pidfd is not None:
            self._unregister(rank.pidfd)
            os.close(rank.pidfd)
            rank.pidfd = None
        for stream in rank.streams:
            self._console.drain(stream)  # what it wrote before exiting belongs before its outcome
        if rank.start_error:
            console_write(2, (rank.start_error + "\n").encode("utf-8", "replace"))
        rank.outcome = rank.to_outcome(self._host, stopped=stopped, runtime_s=runtime_s)
        if rank.pid and self._watchdog is not None and not proctable.group_exists(rank.pid):
            self._watchdog.forget(rank.pid)  # its group is empty: the number may be reused
        return rank.outcome

    def outcomes(self) -> list[RankOutcome]:
        """Every rank's outcome, in the order given, with the leftovers of its session."""
        found = []
        for rank in self._ranks:
            assert rank.outcome is not None
            leftovers = tuple(self._leftovers.get(rank.pid, ())) if rank.pid else ()
            found.append(replace(rank.outcome, leftovers=leftovers) if leftovers else rank.outcome)
        return found

    def running(self) -> list[RankState]:
        """The ranks whose main process is not yet reaped."""
        return [r for r in self._ranks if r.running]

    def unfinished(self) -> int:
        """How many ranks have no outcome yet: those reaped in the batch ``finish`` is working through count."""
        return sum(1 for r in self._ranks if r.outcome is None)

    def signal_running(self, signum: int, ranks: Sequence[RankState] | None = None) -> int:
        """Signal the group of every rank (of ``ranks``: a replica group's) whose main process is not yet reaped (so
        its pgid is still ours)."""
        count = 0
        for rank in self._ranks if ranks is None else ranks:
            if rank.running:
                rank.signalled = True
                proctable.signal_groups((rank.pid,), signum)
                count += 1
        return count

    def signal_main(self, signum: int) -> int:
        """Signal every running rank's main process (not its group); return how many got it."""
        count = 0
        for rank in self.running():  # not yet reaped: the pid is still this rank's
            try:
                os.kill(rank.pid, signum)
                count += 1
            except ProcessLookupError:
                pass
        return count

    def kill_sessions(self, signum: int) -> list[ProcInfo]:
        """Signal every group alive in the ranks' sessions; return those members."""
        members = proctable.signal_sessions(self.sids(), signum)
        for proc in members:
            self._sent[proc.pid] = signum
        return members

    def kill_now(self) -> None:
        """SIGKILL everything and reap the main processes, for a short while at most (leaving by an exception)."""
        self.let_go()
        sids = self.sids()
        self.signal_running(signal.SIGKILL)
        proctable.signal_sessions(sids, signal.SIGKILL)
        deadline = time.monotonic() + _EMERGENCY_WAIT
        for rank in self._ranks:
            while rank.running and time.monotonic() < deadline:
                try:
                    pid, _ = os.waitpid(rank.pid, os.WNOHANG)
                except ChildProcessError:
                    pid = rank.pid
                if pid:
                    rank.reaped = True
                    if rank.popen is not None:
                        rank.popen.returncode = -signal.SIGKILL
                else:
                    time.sleep(0.01)

    def reap_orphans(self) -> None:
        """Reap the orphans of the ranks' sessions that exited (we are their subreaper).

        Called after the ranks' own exits are collected, so a waitable child is normally an orphan; one
        ``waitid(WNOWAIT)`` tells whether there is any, without scanning /proc.
        """
        sids = self.sids()
        while (pid := proctable.exited_child()) is not None:
            if self._watchdog is not None and pid == self._watchdog.pid:
                self._watchdog.lost()  # somebody killed it: carry on without the safety net
                continue
            if pid in self._survivors.escaped:  # a daemon that left its rank's session, stopped
                self._survivors.escaped.discard(pid)
                proctable.reap(pid)
                continue
            if not proctable.reap_orphan(pid, sids):
                return  # a rank not yet collected, or a child of the caller's: not ours to reap here

    # -- leftovers ------------------------------------------------------------------------------------------

    def live(self) -> list[ProcInfo]:
        """What is left of the ranks that is still alive (``xrun.launch.ranks.survivors``)."""
        return self._survivors.find(self.sids(), {r.pid for r in self._ranks if r.running})

    def sweep(self, members: Sequence[ProcInfo], signum: int) -> None:
        """Send ``signum`` to the groups of ``members`` that have not had it yet; watch and remember them all."""
        proctable.signal_groups((p.pgrp for p in members if self._sent.get(p.pid) != signum), signum)
        watched = set(self._leftover_fds.values())
        for proc in members:
            self._sent[proc.pid] = signum
            if self.have_pidfd and proc.pid not in watched:
                self._watch_leftover(proc.pid)
        self.hold(members)

    def hold(self, members: Sequence[ProcInfo]) -> None:
        """Remember ``members`` as leftovers of their rank (their session leader)."""
        for proc in members:
            pids = self._leftovers.setdefault(proc.sid, [])
            if proc.pid not in pids:
                pids.append(proc.pid)

    @property
    def watching(self) -> bool:
        """Some leftover's pidfd is still open: its exit will call back."""
        return bool(self._leftover_fds)

    def _watch_leftover(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)  # works for non-children too: readable once it exits
        except OSError:  # exited meanwhile
            return
        self._leftover_fds[fd] = pid
        self._sel.register(fd, selectors.EVENT_READ, lambda: self._leftover_gone(fd))  # type: ignore[union-attr]

    def _leftover_gone(self, fd: int) -> None:
        self._unregister(fd)
        os.close(fd)
        del self._leftover_fds[fd]
        self.reap_orphans()
        if not self._leftover_fds:
            self._on_leftovers_gone()  # look again: one may have forked before it went

    # -- the end --------------------------------------------------------------------------------------------

    def let_go(self) -> None:
        """Forked ranks not yet let run leave before running anything."""
        for rank in self._ranks:
            if rank.held is not None:
                rank.held.abandon()
                rank.held = None

    def close(self) -> None:
        """Close every pidfd (the caller closes the selector); forked ranks still held go."""
        self.let_go()
        for rank in self._ranks:
            if rank.pidfd is not None:
                os.close(rank.pidfd)
                rank.pidfd = None
        for fd in self._leftover_fds:
            os.close(fd)
        self._leftover_fds.clear()

    def _unregister(self, fd: int) -> None:
        if self._sel is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass
