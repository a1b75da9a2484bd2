"""Supervise one node's ranks: start them in their own sessions and stop them together, against one deadline.

``RankGroup`` is the start and the stop policy. One single-threaded event loop (``selectors``) watches:
  * a pidfd per rank (xrun.launch.ranks.reaper) -> the rank's exit, seen at once;
  * one pipe per rank stdout/stderr -> xrun.common.output.streams prefixes the lines for fd 1 / fd 2 and logs them
    (with --dedupe, the default, identical lines of several ranks wait up to 0.1 s and are shown once: the
    loop's timeout includes that deadline);
  * the wake-up pipe of xrun.common.procs.signals -> SIGINT/SIGTERM/SIGHUP (stop), SIGCHLD (reap) and the
    ``--forward_signals`` (SIGUSR1/SIGUSR2: passed on to every rank's main process, the job goes on);
  * readers, signals and timers the caller adds (the control channel; the hang doctor, xrun.launch.doctor.node_doctor:
    SIGQUIT, py-spy's results, the silence check).

The first rank that fails on its own stops the rest, unless ``--on_rank_exit keep`` (in-process recovery, issue 39
§3: NVRx's ``inprocess.Wrapper`` rebuilds its group without the rank): then a rank that fails while another still
runs is *lost*: recorded and named, nobody is signalled, and what it started (NVRx's monitor daemons) is left alone
until the last rank ends; the last one's failure is the root cause. Under ``--replica_groups`` with restarts left in
the failed rank's group, only that group stops and starts again (xrun.launch.replicas.supervision: ``_regroup``;
a group across nodes once the head says so, ``start_group``, after its ``stop_group`` or this node's failure);
the other groups' ranks are never signalled. Otherwise the first failure stops the rest
(after ``before_failure_stop``, where the doctor takes the survivors' stacks): its siblings' process groups get
SIGTERM, everything is given one monotonic deadline, and whatever is left then gets SIGKILL. When every rank's main
process is gone, the members of their sessions that are still alive (a leaked DataLoader worker, torch_shm_manager) are
stopped the same way and reported as leftovers, so the agent never hangs on them. The result is a
``NodeResult`` (xrun.common.result.outcome), the same type the elastic adapter returns.

``RankGroup`` wires the parts beside it: the loop (xrun.launch.ranks.group_loop), starting a rank
(xrun.launch.ranks.spawn), the stop policy (xrun.launch.ranks.teardown) and what a caller plugs in
(xrun.launch.ranks.plugins).

With a preload helper (``preload=``, xrun.launch.preload, docs/preload.md) every rank is forked from it instead of
started: the helper forks twice, so the rank's parent is this process (the child subreaper), and the rank waits
until its pidfd and the watchdog watch it. From then on it is supervised exactly like a started rank. The helper's
death is noticed at once (its socket turns readable) and said in one line; the running ranks do not need it and
go on, and a rank not yet forked cannot start (its start error says why).

Safety nets: the agent is a child subreaper (orphaned grandchildren are reaped here, not left as zombies),
and a forked watchdog (xrun.launch.procs.watchdog) stops every rank session if the agent itself gets SIGKILL, or,
for an agent connected to a head, when this loop stops coming round (it beats on the watchdog's pipe as a timer).
"""

from __future__ import annotations

import os
import selectors
import signal
import threading  # already imported by subprocess; only to check we are on the main thread
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from xrun.common.output.logfiles import FilteredLogs
from xrun.common.output.streams import Console, flush_python_output, notice
from xrun.common.procs.posix import signal_name
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, OwnedSignals, owned_signals
from xrun.common.result.outcome import NodeResult, RankOutcome, describe, node_result
from xrun.common.spec import RESTART_COUNT, LocalEcho, OnRankExit
from xrun.launch.procs import proctable
from xrun.launch.procs.watchdog import Watchdog
from xrun.launch.ranks.group_loop import HOLD_POLL_S, GroupLoop
from xrun.launch.ranks.plugins import Plugins
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.reaper import RankState, Reaper
from xrun.launch.ranks.spawn import current_affinity, spawn_rank, watch_output
from xrun.launch.ranks.teardown import Teardown
from xrun.launch.replicas.supervision import GroupPolicy
from xrun.launch.telemetry.endpoints import SOCKET_VARIABLE

if TYPE_CHECKING:
    from xrun.common.result.group_restart import GroupRestart
    from xrun.common.result.stacks import RankStack
    from xrun.common.telemetry.records import Reading
    from xrun.launch.preload.client import PreloadHelper


@dataclass(frozen=True)
class SuperviseOptions:
    """How a rank group is supervised: prefixes, echo, logs, signals and the stop's grace (from the node spec)."""

    host: str  # used in the "[host:rank]" prefix, the log path and the report
    prefix: bool = True  # False = raw output (--no_prefix)
    quiet: bool = False  # no console echo (logs only)
    dedupe: bool = False  # identical lines of several ranks shown once (the CLI's default is on: AgentOptions)
    log_dir: str | None = None  # {log_dir}/{host}/rank{N}/stdout.log and stderr.log, raw
    shutdown_timeout: float = 30.0  # one shared deadline between SIGTERM and SIGKILL
    console_ranks: frozenset[int] | None = None  # --console_ranks: the ranks echoed (None: all); all are logged
    forward_signals: frozenset[int] = frozenset()  # --forward_signals: passed on to every rank, nothing stops
    # torchrun's --duplicate-std{out,err}-filters: lines holding one of these copied to {log_dir}/{host}/filtered_*.log
    duplicate_filters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    local_echo: LocalEcho = LocalEcho()  # torchrun's --local-ranks-filter and --redirects: streams echoed by local rank
    on_rank_exit: OnRankExit = OnRankExit.STOP  # --on_rank_exit keep: a failed rank stops no other
    group_restarts: int | None = None  # --replica_groups: each group's --max_restarts (None: one world)


class RankGroup:
    """A node's ranks as one unit: they start together, fail together and stop against one deadline.

    Single-threaded and single-use. While ``run()`` is active it owns SIGINT, SIGTERM, SIGHUP, SIGCHLD and the
    plugins' signals (the previous handlers come back when it returns) and makes this process a child subreaper.
    """

    def __init__(
        self,
        procs: Sequence[RankProcess],
        options: SuperviseOptions,
        *,
        on_rank_exit: Callable[[RankOutcome], None] | None = None,
        preload: PreloadHelper | None = None,
        on_group_restart: Callable[[GroupRestart], None] | None = None,
        on_group_start: Callable[[int], None] | None = None,
        on_group_failed: Callable[[GroupRestart], None] | None = None,
        on_group_stopped: Callable[[int], None] | None = None,
    ) -> None:
        ranks = [p.rank for p in procs]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"duplicate ranks in {sorted(ranks)}")
        if options.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {options.shutdown_timeout}")
        self._options = options
        self._ranks = [RankState(p) for p in procs]
        self._on_rank_exit = on_rank_exit
        self._preload = preload  # fork every rank from it (xrun.launch.preload); the caller owns its life
        # --replica_groups: the group stopped (told to the caller), and about to start again (its new store)
        self._groups = None if options.group_restarts is None else GroupPolicy.of(
            ((p.rank, p.env) for p in procs), options.group_restarts)
        self._on_group_restart = on_group_restart
        self._on_group_start = on_group_start
        # a group across nodes: its failure here, and its ranks here gone, told to the head, which restarts it
        self._on_group_failed = on_group_failed
        self._on_group_stopped = on_group_stopped
        self._affinity: frozenset[int] | None = None  # every start's, a group's restart too
        self._loop = GroupLoop()
        self._ran = False
        self._console = _console(procs, options, on_close=self._loop.unregister)
        self._filtered = FilteredLogs(options.log_dir, options.host, options.duplicate_filters)
        self._reaper = Reaper(self._ranks, options.host, self._console, on_leftovers_gone=self._leftovers_gone)
        self._teardown = Teardown(
            self._reaper, host=options.host, shutdown_timeout=options.shutdown_timeout,
            collect_exits=self._collect_exits, finish=lambda r: self._finish(r, stopped=True),
            before_notice=self._console.flush_held,
            held=lambda: self._groups is not None and self._groups.held(),
        )
        self._watchdog: Watchdog | None = None
        self._have_pidfd = hasattr(os, "pidfd_open")  # Linux >= 5.3; without: SIGCHLD and a short poll
        self._interrupted_by: int | None = None  # the signal that told the agent to stop (or request_stop's)
        self._sigints = 0
        self._root: RankState | None = None  # the first rank that failed on its own
        self._lost: list[int] = []  # --on_rank_exit keep: ranks that failed while others ran on
        self._progress = False  # something besides output happened: _check_progress() has work
        self.plugins = Plugins()  # what the hang doctor adds (set before run())
        self._hang: str | None = None  # stop_hung's reason
        self.stacks: tuple[RankStack, ...] = ()  # the other ranks' stacks before the stop, for the report
        self.collectives: Reading | None = None  # and their collective records (xrun.launch.telemetry)

    # -- public ---------------------------------------------------------------------------------------------

    def add_reader(self, fileobj: object, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the event loop whenever ``fileobj`` (an fd or has fileno()) is readable."""
        self._loop.add_reader(fileobj, callback)

    def remove_reader(self, fileobj: int) -> None:
        """Stop calling back for ``fileobj`` (an fd added by ``add_reader`` once the loop runs)."""
        self._loop.unregister(fileobj)

    @property
    def console(self) -> Console:
        return self._console

    @property
    def stopping(self) -> bool:
        return self._teardown.signum is not None

    @property
    def ranks(self) -> list[int]:
        """Every rank of this node, running or ended."""
        return [r.spec.rank for r in self._ranks]

    def live_targets(self) -> list[DumpTarget]:
        """The ranks whose main process is running, for a stack dump."""
        return dump_targets(self._reaper.running())

    def stop_hung(self, reason: str) -> None:
        """--hang_action stop: stop every rank like request_stop, and end with HANG_EXIT and ``reason``."""
        if self._hang is None and self._teardown.signum is None:
            self._hang = reason
        self._teardown.begin(signal.SIGTERM, reason)

    def request_stop(self, signum: int = signal.SIGTERM, reason: str = "") -> None:
        """Stop every rank gracefully: ``signum`` now, SIGKILL at the deadline (SIGKILL: at once).

        Callable from callbacks, or before ``run()`` (then no rank is started).
        """
        if self._interrupted_by is None:
            self._interrupted_by = signum
        self._teardown.begin(signum, reason or f"stop requested ({signal_name(signum)})")

    def forward_signal(self, signum: int) -> int:
        """Send ``signum`` to every running rank's main process (not its group: a DataLoader worker would die of
        SIGUSR1's default action); the job goes on. Returns how many ranks got it."""
        count = self._reaper.signal_main(signum)
        notice(self._options.host, f"forwarded {signal_name(signum)} to {count} rank{'s' if count != 1 else ''}")
        return count

    def stop_group(self, group: int) -> None:
        """--replica_groups, the head's word for a group across nodes (a rank of it failed elsewhere): stop its ranks
        here as for a failure here (SIGTERM, SIGKILL at the deadline); once they are gone, the head hears of it."""
        groups = self._groups
        if groups is None or self._teardown.signum is not None:
            return
        if not groups.order_stop(group, deadline=time.monotonic() + self._options.shutdown_timeout):
            return
        self._console.flush_held()
        notice(self._options.host, f"replica group {group}: stopping its ranks on this node, as it lost a rank or a "
                                   "node elsewhere (the head restarts it on every node it spans)")
        self._signal_group(group, signal.SIGTERM)
        self._gone_yet(group)

    def start_group(self, group: int, restart: int, master_addr: str | None = None) -> None:
        """--replica_groups, the head's word: the held group across nodes starts again here, its ``restart``-th (at
        ``master_addr`` from now on, if given: a hot spare took the node that led it)."""
        if self._groups is not None and self._teardown.signum is None and self._groups.start(group, restart):
            self._start_group(group, master_addr)

    def run(self) -> NodeResult:
        """Start every rank and supervise until each one and its session are gone."""
        if self._ran:
            raise RuntimeError("a RankGroup runs once")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("RankGroup.run() must be called from the main thread: it handles the signals")
        self._ran = True
        flush_python_output()  # our own earlier prints come before the ranks' lines
        sel = self._loop.open()
        saved_subreaper = None
        clean = False
        try:
            saved_subreaper = proctable.set_child_subreaper(True)
            # Forked before the signal handlers and the rank pipes exist: it must hold neither.
            self._watchdog = Watchdog.start(self._options.shutdown_timeout)
            if self._watchdog.beat_every is not None:  # from this loop only: a loop that hangs stops beating
                self.plugins.timers.add(self._watchdog.beat_due, self._watchdog.beat)
            if self._groups is not None:
                self.plugins.timers.add(self._groups.due, self._kill_overdue_groups)
            self._reaper.attach(sel, self._watchdog, pidfd=self._have_pidfd, subreaper=saved_subreaper is not None)
            owned_set = (*SHUTDOWN_SIGNALS, signal.SIGCHLD, *sorted(self._options.forward_signals),
                         *sorted(self.plugins.signals))
            with owned_signals(owned_set, self._loop.on_signal) as owned:
                try:
                    result = self._supervise(owned)
                    clean = True
                    return result
                finally:
                    if not clean:  # leaving by an exception: nothing may outlive it
                        self._reaper.kill_now()
        finally:
            self._close_all()
            if self._watchdog is not None:
                self._watchdog.finish(clean)
            if saved_subreaper is not None:
                proctable.set_child_subreaper(saved_subreaper)

    # -- starting -------------------------------------------------------------------------------------------

    def _supervise(self, owned: OwnedSignals) -> NodeResult:
        assert self._loop.sel is not None
        self._loop.sel.register(owned.wake_fd, selectors.EVENT_READ, owned.drain)
        self._loop.register_readers()
        if self._preload is not None:
            self._reaper.watch_helper(self._preload)
        self._affinity = current_affinity()
        for rank in self._ranks:
            while self._loop.signals:  # a Ctrl-C while starting: do not start the rest
                self._handle_signal(self._loop.signals.popleft())
            self._start(rank)
        self._run_loop()
        for rank in self._ranks:
            for stream in rank.streams:
                self._console.drain(stream)
                self._console.close(stream)
        self._console.flush_held()  # before the report: a rank's last lines come first
        self._console.written()
        return self._result()

    def _start(self, rank: RankState) -> None:
        if self._teardown.signum is not None:
            self._finish(rank, stopped=True)  # stopping already: do not start more work to kill it
            return
        options = self._options
        logs = spawn_rank(rank, self._affinity, host=options.host, log_dir=options.log_dir, preload=self._preload)
        if not rank.pid:  # it could not start: its start_error and returncode say why
            self._finish(rank, stopped=False)
            return
        if self._watchdog is not None:
            self._watchdog.watch(rank.pid)
        assert self._loop.sel is not None
        watch_output(self._loop.sel, self._console, rank, logs, console_ranks=options.console_ranks,
                     local_echo=options.local_echo, filtered=self._filtered)
        self._reaper.watch(rank, self._collect_exits)

    # -- the loop -------------------------------------------------------------------------------------------

    def _run_loop(self) -> None:
        loop, teardown, console = self._loop, self._teardown, self._console
        self._check_progress()
        timers = self.plugins.timers
        while not teardown.done:
            # Output is the hot path: a batch of reads alone needs neither the clock nor the bookkeeping.
            # until the next deadline or timer, or until de-duplicated lines held on the console are due
            wait = console.wait(None if teardown.deadline is None else teardown.timeout())
            if loop.holding:  # the console's thread says nothing when it catches up: look again soon
                wait = HOLD_POLL_S if wait is None else min(wait, HOLD_POLL_S)
            loop.dispatch(timers.timeout(wait))
            while loop.signals:
                self._handle_signal(loop.signals.popleft())
            if timers:
                timers.run()
            if self._progress or teardown.deadline is not None:
                self._check_progress()
            console.flush_due()
            console.show_progress()  # a progress bar's state that nothing followed within the settle
            console.settle()
            self._hold_output()

    def _hold_output(self) -> None:
        """A console that lags a full buffer behind holds the ranks back, as a slow terminal would (their pipes
        are not read until it catches up); a stopping node holds nobody: what does not fit is dropped, counted."""
        stopping = self._teardown.signum is not None
        if stopping:
            self._console.stop_holding()
        hold = self._console.backed_up and not stopping
        if hold and not self._loop.holding:
            self._loop.hold(s for r in self._ranks for s in r.streams if s.fd is not None)
        elif self._loop.holding and not hold:
            self._loop.release()

    def _check_progress(self) -> None:
        self._progress = False
        self._teardown.check()

    def _handle_signal(self, signum: int) -> None:
        self._progress = True
        if signum == signal.SIGCHLD:
            self._collect_exits()
            self._reaper.reap_orphans()
            return
        if signum in self._options.forward_signals:
            self.forward_signal(signum)
            return
        if signum in self.plugins.signals:
            self.plugins.signals[signum]()
            return
        if signum == signal.SIGINT:
            self._sigints += 1
            if self._sigints > 1:  # a second Ctrl-C: the user is not waiting for the deadline
                if self._interrupted_by is None:
                    self._interrupted_by = signum
                self._teardown.escalate("second SIGINT")
                return
        if self._interrupted_by is None:
            self._interrupted_by = signum
        self._teardown.begin(signal.SIGTERM, f"the agent got {signal_name(signum)}")

    # -- exits ----------------------------------------------------------------------------------------------

    def _collect_exits(self) -> None:
        for rank in self._reaper.collect():
            self._finish(rank, stopped=rank.signalled)

    def _finish(self, rank: RankState, *, stopped: bool) -> None:
        """Record one rank's outcome, stop the others if it is the first failure, tell the caller."""
        self._progress = True
        outcome = self._reaper.finish(rank, stopped=stopped)
        if self._groups is not None and self._regroup(outcome, stopped=stopped):
            return  # its group starts again: the caller hears of the restart (on_group_restart), not of this end
        if outcome.failed and not stopped and self._root is None:
            if self._keeps(outcome):
                self._lost.append(outcome.rank)
            else:
                self._fail_first(rank, outcome)
        if self._on_rank_exit is not None:
            self._on_rank_exit(outcome)

    def _keeps(self, outcome: RankOutcome) -> bool:
        """--on_rank_exit keep: a rank that failed while another still runs is lost and stops nobody (the others
        recover in place); said in one line."""
        # the ranks not yet told (on_rank_exit), not those still running: two reaped at once count one by one, as
        # the head counts their rank_exited, so this node's root cause and lost ranks are the job's
        others = self._reaper.unfinished()
        if self._options.on_rank_exit is not OnRankExit.KEEP or not others or self._teardown.signum is not None:
            return False
        self._console.flush_held()
        go_on = f"{others} ranks of this node go on" if others != 1 else "1 rank of this node goes on"
        notice(self._options.host, f"rank {outcome.rank} {describe(outcome)}; {go_on} (--on_rank_exit keep)")
        return True

    def _fail_first(self, rank: RankState, outcome: RankOutcome) -> None:
        """The first rank that failed on its own is the root cause: the doctor looks, then every other rank stops."""
        self._root = rank
        if self.plugins.before_failure_stop is not None and self._teardown.signum is None:
            self.plugins.before_failure_stop()
        self._teardown.begin(signal.SIGTERM, f"rank {rank.spec.rank} {describe(outcome)}")

    # -- replica groups (--replica_groups: xrun.launch.replicas.supervision) --------------------------------------

    def _regroup(self, outcome: RankOutcome, *, stopped: bool) -> bool:
        """A rank of a group being restarted ended, or one failed on its own with its group's budget not spent:
        its group stops (SIGTERM to its live ranks, against one deadline), and starts again once its last rank is
        collected. False: the rank's end is the node's as without groups."""
        groups = self._groups
        assert groups is not None
        group = groups.group_of(outcome.rank)
        if not groups.stopping(group):
            if (not outcome.failed or stopped or not outcome.started  # one that could not start would not again
                    or self._teardown.signum is not None or self._root is not None):
                return False
            running = {groups.group_of(r.spec.rank) for r in self._reaper.running()}
            restart = groups.fail(outcome.rank, describe(outcome), running=running, wall=time.time(),
                                  deadline=time.monotonic() + self._options.shutdown_timeout)
            if restart is None:  # its budget is spent: the job fails (the module doc of supervision says why)
                if groups.budget:
                    self._console.flush_held()
                    notice(self._options.host, f"replica group {group}: rank {outcome.rank} {describe(outcome)}; its "
                                               f"{groups.budget} restart(s) are spent (--max_restarts "
                                               f"{groups.budget}): the job fails")
                return False
            self._console.flush_held()
            shared = group in groups.shared
            notice(self._options.host, restart.line(across_nodes=shared))
            self._signal_group(group, signal.SIGTERM)
            told = self._on_group_failed if shared else self._on_group_restart
            if told is not None:
                told(restart)
        self._gone_yet(group)
        return True

    def _gone_yet(self, group: int) -> None:
        """Once every rank of the stopping ``group`` here is collected: a group of this node's alone starts again at
        once; one across nodes waits for the head's start, which hears that its ranks here are gone."""
        groups = self._groups
        assert groups is not None
        members = set(groups.members(group))
        if self._teardown.signum is not None or any(r.outcome is None for r in self._ranks if r.spec.rank in members):
            return
        if groups.gone(group):
            self._start_group(group)
        elif self._on_group_stopped is not None:
            self._on_group_stopped(group)

    def _signal_group(self, group: int, signum: int) -> None:
        assert self._groups is not None
        members = set(self._groups.members(group))
        self._reaper.signal_running(signum, [r for r in self._ranks if r.spec.rank in members])

    def _kill_overdue_groups(self) -> None:
        assert self._groups is not None
        for group in self._groups.overdue(time.monotonic()):
            self._signal_group(group, signal.SIGKILL)

    def _start_group(self, group: int, master_addr: str | None = None) -> None:
        """Start ``group``'s ranks again, their restart counted (``TORCHELASTIC_RESTART_COUNT``), the same way as
        at the start (forked from the preload helper under ``--preload``), after the caller renewed its store. The
        ended ranks' sessions stay the node's, so what they left is swept at the end."""
        groups = self._groups
        assert groups is not None
        if self._on_group_start is not None:
            self._on_group_start(group)
        count = str(groups.restarts(group))
        members = set(groups.members(group))
        for i, old in enumerate(self._ranks):
            if old.spec.rank not in members:
                continue
            for stream in old.streams:
                self._console.close(stream)
                stream.close_fd()
                stream.close_log()
            self._reaper.retire(old)
            # the last run's exception is not the next one's; its socket (a rank killed -9 leaves it) would keep
            # the next one's collective records from binding there (xrun.launch.telemetry)
            for stale in (old.spec.error_file, old.spec.env.get(SOCKET_VARIABLE)):
                if stale:
                    with suppress(FileNotFoundError):
                        os.unlink(stale)
            moved = {} if master_addr is None else {"MASTER_ADDR": master_addr}
            rank = RankState(replace(old.spec, env={**old.spec.env, RESTART_COUNT: count, **moved}))
            self._ranks[i] = rank
            self._start(rank)

    def _leftovers_gone(self) -> None:
        self._progress = True
        self._teardown.sweep()  # look again: one may have forked before it went

    # -- the end --------------------------------------------------------------------------------------------

    def _result(self) -> NodeResult:
        outcomes = self._reaper.outcomes()
        if self.plugins.before_result is not None:
            self.plugins.before_result(outcomes)
        root = next(o for o in outcomes if o.rank == self._root.spec.rank) if self._root is not None else None
        return node_result(self._options.host, outcomes, root, self._interrupted_by, hang=self._hang,
                           lost=tuple(self._lost), stacks=self.stacks, collectives=self.collectives,
                           group_restarts=() if self._groups is None else self._groups.restarted())

    def _close_all(self) -> None:
        self._loop.close()  # first: the fds below may then close in any order
        self._filtered.close()
        for rank in self._ranks:
            for stream in rank.streams:
                stream.close_fd()
                stream.close_log()
        self._reaper.close()


def _console(procs: Sequence[RankProcess], options: SuperviseOptions, *, on_close: Callable[[int], object]) -> Console:
    """The node's console; it merges identical lines (``--dedupe``) only where several ranks are echoed."""
    echoed = [p.rank for p in procs if options.console_ranks is None or p.rank in options.console_ranks]
    merge = options.dedupe and len(echoed) > 1  # one rank has nobody to repeat it: no line is held
    return Console(prefix=options.prefix, quiet=options.quiet, on_close=on_close,
                   merge_as=options.host if merge else None, ranks_shown=len(echoed), host=options.host)


class DumpTarget(NamedTuple):
    """A live rank's main process, for a stack dump (xrun.launch.doctor.stackdump). A NamedTuple rather than a
    frozen dataclass, as xrun.launch.session.events explains: the class is made at every agent's start, where it
    costs ~0.06 ms against ~0.4 ms, and the stacks as data (xrun.common.result.stacks) stay unloaded until a dump."""

    rank: int
    local_rank: int
    pid: int


def dump_targets(running: Sequence[RankState]) -> list[DumpTarget]:
    """What py-spy is pointed at."""
    return [DumpTarget(r.spec.rank, r.spec.local_rank, r.pid) for r in running]
