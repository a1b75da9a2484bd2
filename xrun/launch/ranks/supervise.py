"""Supervise one node's ranks: start them in their own sessions and stop them together, against one deadline.

``RankGroup`` is the start and the stop policy. One single-threaded event loop (``selectors``) watches:
  * a pidfd per rank (xrun.launch.ranks.reaper) -> the rank's exit, seen at once;
  * one pipe per rank stdout/stderr -> xrun.launch.output.streams prefixes the lines for fd 1 / fd 2 and logs them
    (with --dedupe, the default, identical lines of several ranks wait up to 0.1 s and are shown once: the
    loop's timeout includes that deadline);
  * the wake-up pipe of xrun.launch.procs.signals -> SIGINT/SIGTERM/SIGHUP (stop), SIGCHLD (reap) and the
    ``--forward_signals`` (SIGUSR1/SIGUSR2: passed on to every rank's main process, the job goes on);
  * readers, signals and timers the caller adds (the control channel; the hang doctor, xrun.launch.doctor.node_doctor:
    SIGQUIT, py-spy's results, the silence check).

The first rank that fails on its own stops the rest (after ``before_failure_stop``, where the doctor takes the
survivors' stacks): its siblings' process groups get SIGTERM, everything is
given one monotonic deadline, and whatever is left then gets SIGKILL. When every rank's main process is gone,
the members of their sessions that are still alive (a leaked DataLoader worker, torch_shm_manager) are
stopped the same way and reported as leftovers, so the agent never hangs on them. The result is a
``NodeResult`` (xrun.launch.result.outcome), the same type the elastic adapter returns.

Safety nets: the agent is a child subreaper (orphaned grandchildren are reaped here, not left as zombies),
and a forked watchdog (xrun.launch.procs.watchdog) stops every rank session if the agent itself gets SIGKILL.
"""

from __future__ import annotations

import errno
import functools
import os
import selectors
import signal
import subprocess
import threading  # already imported by subprocess; only to check we are on the main thread
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xrun.launch.output.streams import (
    Console,
    RankStream,
    flush_python_output,
    grow_pipe,
    notice,
    open_logs,
    rank_prefix,
)
from xrun.launch.procs import proctable
from xrun.launch.procs.posix import signal_name
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS, OwnedSignals, owned_signals
from xrun.launch.procs.watchdog import Watchdog
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.reaper import RankState, Reaper
from xrun.launch.result.outcome import NodeResult, RankOutcome, describe, node_result
from xrun.launch.result.stacks import DumpTarget, RankStack

_KILL_WAIT = 5.0  # after SIGKILL, how long to wait for the kernel before reporting what would not die
_POLL = 0.02  # only without pidfd (Linux < 5.3): how often leftovers are rechecked


@dataclass(frozen=True)
class SuperviseOptions:
    host: str  # used in the "[host:rank]" prefix, the log path and the report
    prefix: bool = True  # False = raw output (--no_prefix)
    quiet: bool = False  # no console echo (logs only)
    dedupe: bool = False  # identical lines of several ranks shown once (the CLI's default is on: AgentOptions)
    log_dir: str | None = None  # {log_dir}/{host}/rank{N}/stdout.log and stderr.log, raw
    shutdown_timeout: float = 30.0  # one shared deadline between SIGTERM and SIGKILL
    console_ranks: frozenset[int] | None = None  # --console_ranks: the ranks echoed (None: all); all are logged
    forward_signals: frozenset[int] = frozenset()  # --forward_signals: passed on to every rank, nothing stops


class Timers(list[tuple[Callable[[], float | None], Callable[[], None]]]):
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
    ) -> None:
        ranks = [p.rank for p in procs]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"duplicate ranks in {sorted(ranks)}")
        if options.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {options.shutdown_timeout}")
        self._options = options
        self._ranks = [RankState(p) for p in procs]
        self._on_rank_exit = on_rank_exit
        self._readers: list[tuple[object, Callable[[], None]]] = []
        self._sel: selectors.BaseSelector | None = None
        self._ran = False
        self._console = _console(procs, options, on_close=self._unregister)
        self._reaper = Reaper(self._ranks, options.host, self._console, on_leftovers_gone=self._leftovers_gone)
        self._teardown = _Teardown(
            options, self._reaper, collect_exits=self._collect_exits, finish=lambda r: self._finish(r, stopped=True),
            before_notice=self._console.flush_held,
        )
        self._watchdog: Watchdog | None = None
        self._have_pidfd = hasattr(os, "pidfd_open")  # Linux >= 5.3; without: SIGCHLD and a short poll
        self._interrupted_by: int | None = None  # the signal that told the agent to stop (or request_stop's)
        self._sigints = 0
        self._root: RankState | None = None  # the first rank that failed on its own
        self._progress = False  # something besides output happened: _check_progress() has work
        self._signals: deque[int] = deque()  # recorded by the handler, acted on by the loop
        self.plugins = Plugins()  # what the hang doctor adds (set before run())
        self._hang: str | None = None  # stop_hung's reason
        self.stacks: tuple[RankStack, ...] = ()  # the other ranks' stacks before the stop, for the report

    # -- public ---------------------------------------------------------------------------------------------

    def add_reader(self, fileobj: object, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the event loop whenever ``fileobj`` (an fd or has fileno()) is readable."""
        self._readers.append((fileobj, callback))
        if self._sel is not None:
            self._sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]

    @property
    def console(self) -> Console:
        return self._console

    @property
    def stopping(self) -> bool:
        return self._teardown.signum is not None

    def live_targets(self) -> list[DumpTarget]:
        """The ranks whose main process is running, for a stack dump."""
        return [DumpTarget(r.spec.rank, r.spec.local_rank, r.pid) for r in self._reaper.running()]

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

    def run(self) -> NodeResult:
        """Start every rank and supervise until each one and its session are gone."""
        if self._ran:
            raise RuntimeError("a RankGroup runs once")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("RankGroup.run() must be called from the main thread: it handles the signals")
        self._ran = True
        flush_python_output()  # our own earlier prints come before the ranks' lines
        self._sel = selectors.DefaultSelector()
        saved_subreaper = None
        clean = False
        try:
            saved_subreaper = proctable.set_child_subreaper(True)
            # Forked before the signal handlers and the rank pipes exist: it must hold neither.
            self._watchdog = Watchdog.start(self._options.shutdown_timeout)
            self._reaper.attach(self._sel, self._watchdog, pidfd=self._have_pidfd)
            owned_set = (*SHUTDOWN_SIGNALS, signal.SIGCHLD, *sorted(self._options.forward_signals),
                         *sorted(self.plugins.signals))
            with owned_signals(owned_set, self._on_signal) as owned:
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
        assert self._sel is not None
        self._sel.register(owned.wake_fd, selectors.EVENT_READ, owned.drain)
        for fileobj, callback in self._readers:
            self._sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]
        affinity = _get_affinity()
        for rank in self._ranks:
            while self._signals:  # a Ctrl-C while starting: do not start the rest
                self._handle_signal(self._signals.popleft())
            self._start(rank, affinity)
        self._loop()
        for rank in self._ranks:
            for stream in rank.streams:
                self._console.drain(stream)
                self._console.close(stream)
        self._console.flush_held()  # before the report: a rank's last lines come first
        return self._result()

    def _start(self, rank: RankState, affinity: frozenset[int] | None) -> None:
        spec = rank.spec
        if self._teardown.signum is not None:
            self._finish(rank, stopped=True)  # stopping already: do not start more work to kill it
            return
        logs: tuple[int, int] | None = None
        try:
            if self._options.log_dir is not None:
                logs = open_logs(self._options.log_dir, self._options.host, spec.rank)
            popen = _spawn(spec, affinity)
        except (OSError, ValueError) as err:  # ValueError: a NUL byte in argv or env
            for fd in logs or ():
                os.close(fd)
            rank.start_error = f"xrun: cannot start rank {spec.rank}: {err}"
            # The shell's conventions: 127 "command not found", 126 "found but cannot run".
            rank.returncode = 127 if getattr(err, "errno", None) == errno.ENOENT else 126
            self._finish(rank, stopped=False)
            return
        rank.popen = popen
        rank.pid = popen.pid
        rank.started = time.monotonic()
        if self._watchdog is not None:
            self._watchdog.watch(popen.pid)
        assert self._sel is not None
        _watch_output(self._sel, self._console, self._options, rank, popen, logs)
        self._reaper.watch(rank, self._collect_exits)

    # -- the loop -------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._sel is not None
        select = self._sel.select
        registered = self._sel.get_map()
        teardown = self._teardown
        console = self._console
        self._check_progress()
        timers = self.plugins.timers
        while not teardown.done:
            # Output is the hot path: a batch of reads alone needs neither the clock nor the bookkeeping.
            # until the next deadline or timer, or until de-duplicated lines held on the console are due
            wait = console.wait(None if teardown.deadline is None else teardown.timeout())
            for key, _ in select(timers.timeout(wait)):
                # An earlier callback of this batch may have closed this fd (and its number been reused).
                if registered.get(key.fd) is key:
                    key.data()
            while self._signals:
                self._handle_signal(self._signals.popleft())
            if timers:
                timers.run()
            if self._progress or teardown.deadline is not None:
                self._check_progress()
            console.flush_due()
            console.settle()

    def _check_progress(self) -> None:
        self._progress = False
        self._teardown.check()

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only record: the loop acts on it (the wake-up fd has already woken select()).
        self._signals.append(signum)

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
        if outcome.failed and not stopped and self._root is None:
            self._root = rank
            if self.plugins.before_failure_stop is not None and self._teardown.signum is None:
                self.plugins.before_failure_stop()
            self._teardown.begin(signal.SIGTERM, f"rank {rank.spec.rank} {describe(outcome)}")
        if self._on_rank_exit is not None:
            self._on_rank_exit(outcome)

    def _leftovers_gone(self) -> None:
        self._progress = True
        self._teardown.sweep()  # look again: one may have forked before it went

    # -- the end --------------------------------------------------------------------------------------------

    def _result(self) -> NodeResult:
        outcomes = self._reaper.outcomes()
        root = next(o for o in outcomes if o.rank == self._root.spec.rank) if self._root is not None else None
        return node_result(self._options.host, outcomes, root, self._interrupted_by, hang=self._hang,
                           stacks=self.stacks)

    def _unregister(self, fd: int) -> None:
        if self._sel is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def _close_all(self) -> None:
        if self._sel is not None:
            self._sel.close()  # first: the fds below may then close in any order
        for rank in self._ranks:
            for stream in rank.streams:
                stream.close_fd()
                stream.close_log()
        self._reaper.close()


class _Teardown:
    """The stop policy of a RankGroup: one signal to the ranks' groups, one deadline, then SIGKILL.

    Once every main process is gone, what is still alive in their sessions is swept against the same deadline
    (TERM, then KILL); ``_KILL_WAIT`` after SIGKILL, whatever still stands is reported and given up on.
    """

    def __init__(
        self,
        options: SuperviseOptions,
        reaper: Reaper,
        *,
        collect_exits: Callable[[], None],
        finish: Callable[[RankState], None],
        before_notice: Callable[[], None] = lambda: None,
    ) -> None:
        self._options = options
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
        self.deadline = time.monotonic() + self._options.shutdown_timeout
        self._collect_exits()  # ranks that exited in the same instant failed on their own
        count = self._reaper.signal_running(signum)  # none before run(): nothing is started
        if count:
            self._notice(
                f"{reason}; stopping {count} rank{'s' if count != 1 else ''} "
                f"({signal_name(signum)}, SIGKILL after {self._options.shutdown_timeout:g} s)"
            )

    def escalate(self, reason: str) -> None:
        """SIGKILL every group now, running ranks and anything left in their sessions."""
        if self._kill_deadline is not None:
            return
        if self.signum is None:
            self.signum = signal.SIGKILL
        now = time.monotonic()
        self.deadline = self.deadline if self.deadline is not None else now
        self._kill_deadline = now + _KILL_WAIT
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
            timeout = _POLL if timeout is None else min(timeout, _POLL)
        return None if timeout is None else max(0.0, timeout)

    def check(self) -> None:
        """Enforce the deadlines; once every main process is gone, sweep."""
        now = time.monotonic()
        if self._kill_deadline is not None and now >= self._kill_deadline:
            self._give_up()
            return
        if self._kill_deadline is None and self.deadline is not None and now >= self.deadline:
            self.escalate("the shutdown deadline passed")
        if not self.done and not self._reaper.running():
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
                self.deadline = time.monotonic() + self._options.shutdown_timeout
            shown = ", ".join(str(p.pid) for p in members[:8]) + (", ..." if len(members) > 8 else "")
            self._notice(f"{len(members)} process(es) outlived their rank ({shown}); stopping them")
        self._reaper.sweep(members, signal.SIGKILL if self._kill_deadline is not None else signal.SIGTERM)

    def _give_up(self) -> None:
        """SIGKILL went out _KILL_WAIT ago and something is still there (uninterruptible sleep): report it."""
        stuck = self._reaper.running()
        members = self._reaper.live()
        self._notice(
            f"giving up on rank(s) {[r.spec.rank for r in stuck]} and process(es) {[p.pid for p in members]} "
            f"still alive {_KILL_WAIT:g} s after SIGKILL"
        )
        for rank in stuck:
            rank.signalled = rank.reaped = True
            self._finish(rank)
        self._reaper.hold(members)
        self.done = True

    def _notice(self, text: str) -> None:
        self._before_notice()
        notice(self._options.host, text)


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.


def _watch_output(
    sel: selectors.BaseSelector,
    console: Console,
    options: SuperviseOptions,
    rank: RankState,
    popen: subprocess.Popen[bytes],
    logs: tuple[int, int] | None,
) -> None:
    """Register the rank's stdout and stderr pipes with the loop, as ``RankStream``s of ``console``."""
    assert popen.stdout is not None and popen.stderr is not None
    prefix = rank_prefix(options.host, rank.spec.rank)
    for pipe, fd_no in ((popen.stdout, 1), (popen.stderr, 2)):
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        grow_pipe(fd)
        log = logs[fd_no - 1] if logs else None
        stream = RankStream(fd, fd_no, prefix, log=log, keep_tail=fd_no == 2, file=pipe, rank=rank.spec.rank)
        stream.echo = options.console_ranks is None or rank.spec.rank in options.console_ranks
        rank.streams.append(stream)
        sel.register(fd, selectors.EVENT_READ, functools.partial(console.read, stream))


def _console(procs: Sequence[RankProcess], options: SuperviseOptions, *, on_close: Callable[[int], object]) -> Console:
    """The node's console; it merges identical lines (``--dedupe``) only where several ranks are echoed."""
    echoed = [p.rank for p in procs if options.console_ranks is None or p.rank in options.console_ranks]
    merge = options.dedupe and len(echoed) > 1  # one rank has nobody to repeat it: no line is held
    return Console(prefix=options.prefix, quiet=options.quiet, on_close=on_close,
                   merge_as=options.host if merge else None, ranks_shown=len(echoed))


def _spawn(spec: RankProcess, affinity: frozenset[int] | None) -> subprocess.Popen[bytes]:
    """Start one rank in its own session, its stdout and stderr on pipes, bound to ``spec.cpus`` if given."""
    if spec.cpus is not None:
        # The child inherits the calling thread's mask at fork; the agent is single-threaded, so setting our
        # own mask around Popen binds exactly this child, with no wrapper process.
        os.sched_setaffinity(0, spec.cpus)
    try:
        return subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own session and group: killpg reaches its whole tree
            close_fds=True,
            bufsize=0,
        )
    finally:
        if spec.cpus is not None and affinity is not None:
            os.sched_setaffinity(0, affinity)


def _get_affinity() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
