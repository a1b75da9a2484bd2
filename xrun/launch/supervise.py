"""Supervise one node's ranks: start them in their own sessions, relay their output, stop them together.

One single-threaded event loop (``selectors``) watches:
  * a pidfd per rank (Linux >= 5.3; SIGCHLD alone on older kernels) -> the rank's exit, seen at once;
  * one pipe per rank stdout/stderr -> complete lines get ``[host:rank] `` and go to fd 1 / fd 2 and to the
    per-rank log files;
  * the ``signal.set_wakeup_fd`` pipe -> SIGINT/SIGTERM/SIGHUP (stop) and SIGCHLD (reap);
  * readers the caller adds (the control channel).

The first rank that fails on its own stops the rest: its siblings' process groups get SIGTERM, everything is
given one monotonic deadline, and whatever is left then gets SIGKILL. When every rank's main process is gone,
the members of their sessions that are still alive (a leaked DataLoader worker, torch_shm_manager) are
stopped the same way and reported as leftovers, so the agent never hangs on them.

Safety nets: the agent is a child subreaper (orphaned grandchildren are reaped here, not left as zombies),
and a forked watchdog stops every rank session if the agent itself is killed with SIGKILL.
"""

from __future__ import annotations

import errno
import functools
import os
import selectors
import signal
import subprocess
import sys
import threading  # already imported by subprocess; only to check we are on the main thread
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

from xrun.launch import _watchdog
from xrun.launch.posix import signal_name, write_all

_CHUNK = 65536  # bytes per read: a flooding rank is drained in big pieces, a silent one still gets its turn
_TAIL_LINES = 20
_TAIL_BYTES = 16384  # how much of each stderr is kept for the tail
_TAIL_WIDTH = 1000  # characters per tail line
_MAX_PENDING = 1 << 20  # a line longer than this is emitted in pieces rather than held without bound
_KILL_WAIT = 5.0  # after SIGKILL, how long to wait for the kernel before reporting what would not die
_POLL = 0.02  # only without pidfd (Linux < 5.3): how often leftovers are rechecked
_SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RankProcess:
    """One rank to start: its complete argv and environment (the caller merged them)."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cpus: frozenset[int] | None = None  # the exact CPU affinity the child starts with
    cwd: str | None = None


@dataclass(frozen=True)
class SuperviseOptions:
    host: str  # used in the "[host:rank]" prefix, the log path and the report
    prefix: bool = True  # False = raw output (--no_prefix)
    quiet: bool = False  # no console echo (logs only)
    log_dir: str | None = None  # {log_dir}/{host}/rank{N}/stdout.log and stderr.log, raw
    shutdown_timeout: float = 30.0  # one shared deadline between SIGTERM and SIGKILL


@dataclass(frozen=True)
class RankOutcome:
    host: str
    rank: int
    local_rank: int
    pid: int  # 0 when the rank was never started
    returncode: int | None  # exit status when it exited normally (126/127 when it could not be started)
    signal: int | None  # signal number when it was killed by a signal
    runtime_s: float
    stderr_tail: tuple[str, ...]
    stopped_by_xrun: bool  # xrun signalled it (or never started it): a consequence, not the root cause
    leftovers: tuple[int, ...] = ()  # pids of its session that outlived it and had to be stopped

    @property
    def failed(self) -> bool:
        """A non-zero exit code, a signal, or no status at all."""
        return self.returncode != 0

    @property
    def started(self) -> bool:
        return self.pid > 0


@dataclass(frozen=True)
class NodeResult:
    host: str
    outcomes: tuple[RankOutcome, ...]  # in rank order
    root_cause: RankOutcome | None  # the first rank that failed on its own
    interrupted_by: int | None  # the signal that told the agent to stop (or request_stop's)
    exit_code: int


def prefix_lines(prefix: bytes, pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """Split ``pending + chunk`` into prefixed complete lines and the unfinished rest.

    Bytes in, bytes out (non-UTF-8 output passes unchanged), and one ``replace`` over the whole chunk rather
    than a Python loop per line: this is the hot path of a rank that prints a lot.
    """
    data = pending + chunk if pending else chunk
    end = data.rfind(b"\n") + 1
    if end == 0:
        return b"", data
    body = data[: end - 1].replace(b"\n", b"\n" + prefix)
    return b"".join((prefix, body, b"\n")), data[end:]


def exit_code_of(outcome: RankOutcome) -> int:
    """The shell's convention: the exit code, or 128 + the signal number."""
    if outcome.signal is not None:
        return 128 + outcome.signal
    if outcome.returncode is None:
        return 1
    return outcome.returncode


# ---------------------------------------------------------------------------------------------------------------
# Internal state.


class _Stream:
    """One of a rank's output pipes."""

    __slots__ = ("pipe", "fd", "console", "prefix", "pending", "log", "tail", "total")

    def __init__(self, pipe: BinaryIO, console: int, prefix: bytes, log: int | None, keep_tail: bool) -> None:
        self.pipe = pipe  # owns the fd: closing it any other way would let its finalizer close a reused number
        self.fd: int | None = pipe.fileno()
        self.console = console  # 1 or 2
        self.prefix = prefix
        self.pending = b""
        self.log = log
        self.tail: bytes | None = b"" if keep_tail else None
        self.total = 0

    def tail_lines(self) -> tuple[str, ...]:
        if not self.tail:
            return ()
        lines = self.tail.decode("utf-8", "replace").split("\n")
        if self.total > len(self.tail):
            lines = lines[1:]  # the first one was cut
        if lines and lines[-1] == "":
            lines.pop()
        # What a terminal would show: a progress bar's "\r" rewrites its line; a runaway line is cut.
        shown = (line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines[-_TAIL_LINES:])
        return tuple(line if len(line) <= _TAIL_WIDTH else line[: _TAIL_WIDTH - 3] + "..." for line in shown)


class _Rank:
    __slots__ = (
        "spec", "pid", "popen", "pidfd", "started", "ended", "returncode", "signal", "signalled", "reaped",
        "streams", "outcome", "start_error",
    )  # fmt: skip

    def __init__(self, spec: RankProcess) -> None:
        self.spec = spec
        self.pid = 0
        self.popen: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.started = 0.0
        self.ended: float | None = None
        self.returncode: int | None = None
        self.signal: int | None = None
        self.signalled = False
        self.reaped = False
        self.streams: list[_Stream] = []
        self.outcome: RankOutcome | None = None
        self.start_error: str | None = None

    @property
    def running(self) -> bool:
        """Started and not yet reaped: its pid (and so its process group id) is still ours."""
        return self.pid > 0 and not self.reaped


class RankGroup:
    """A node's ranks as one unit: they start together, fail together and stop against one deadline.

    Single-threaded and single-use. While ``run()`` is active it owns SIGINT, SIGTERM, SIGHUP and SIGCHLD
    (the previous handlers come back when it returns) and makes this process a child subreaper.
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
        self._quiet = options.quiet
        self._prefix = options.prefix
        self._ranks = [_Rank(p) for p in procs]
        self._on_rank_exit = on_rank_exit
        self._readers: list[tuple[object, Callable[[], None]]] = []
        self._sel: selectors.BaseSelector | None = None
        self._ran = False
        # Stopping.
        self._stop_signal: int | None = None  # what the ranks were sent
        self._interrupted_by: int | None = None
        self._deadline: float | None = None  # the one SIGTERM -> SIGKILL deadline
        self._kill_deadline: float | None = None  # set once SIGKILL went out
        self._sigints = 0
        self._root: _Rank | None = None
        # After every main process is gone: members of the sessions still alive.
        self._sweeping = False
        self._done = False
        self._progress = False  # something besides output happened: _check_progress() has work
        self._leftovers: dict[int, list[int]] = {}  # sid -> pids
        self._sent: dict[int, int] = {}  # leftover pid -> the strongest signal its group got
        self._leftover_fds: dict[int, int] = {}  # pidfd -> pid
        # Signals, recorded by the handler and acted on by the loop.
        self._signals: deque[int] = deque()
        self._have_pidfd = hasattr(os, "pidfd_open")
        self._console_ok = {1: True, 2: True}
        self._watchdog: _watchdog.Watchdog | None = None

    # -- public ---------------------------------------------------------------------------------------------

    def add_reader(self, fileobj: object, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the event loop whenever ``fileobj`` (an fd or has fileno()) is readable."""
        self._readers.append((fileobj, callback))
        if self._sel is not None:
            self._sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]

    def request_stop(self, signum: int = signal.SIGTERM, reason: str = "") -> None:
        """Stop every rank gracefully: ``signum`` now, SIGKILL at the deadline (SIGKILL: at once).

        Callable from callbacks, or before ``run()`` (then no rank is started).
        """
        if self._interrupted_by is None:
            self._interrupted_by = signum
        self._begin_stop(signum, reason or f"stop requested ({signal_name(signum)})")

    def run(self) -> NodeResult:
        """Start every rank and supervise until each one and its session are gone."""
        if self._ran:
            raise RuntimeError("a RankGroup runs once")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("RankGroup.run() must be called from the main thread: it handles the signals")
        self._ran = True
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # our own earlier prints come before the ranks' lines
            except (AttributeError, OSError, ValueError):
                pass
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        saved_handlers: dict[int, object] = {}
        saved_wakeup = -1
        saved_affinity = _get_affinity()
        saved_subreaper = None
        clean = False
        self._sel = selectors.DefaultSelector()
        try:
            saved_subreaper = _watchdog.set_child_subreaper(True)
            self._watchdog = _watchdog.Watchdog.start(self._options.shutdown_timeout)
            for signum in (*_SHUTDOWN_SIGNALS, signal.SIGCHLD):
                previous = signal.getsignal(signum)
                saved_handlers[signum] = previous
                # Started under nohup or as a background job: the caller asked us to ignore it; so do we.
                if previous is signal.SIG_IGN and signum in (signal.SIGINT, signal.SIGHUP):
                    continue
                signal.signal(signum, self._on_signal)
            saved_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            self._sel.register(wake_r, selectors.EVENT_READ, lambda: _drain(wake_r))
            for fileobj, callback in self._readers:
                self._sel.register(fileobj, selectors.EVENT_READ, callback)  # type: ignore[arg-type]

            for rank in self._ranks:
                while self._signals:  # a Ctrl-C while starting: do not start the rest
                    self._handle_signal(self._signals.popleft())
                self._start(rank, saved_affinity)
            self._loop()
            self._flush_streams()
            result = self._result()
            clean = True
            return result
        finally:
            if not clean:
                self._emergency_stop()
            for signum, previous in saved_handlers.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]
            if saved_handlers:
                signal.set_wakeup_fd(saved_wakeup)
            self._close_all()
            os.close(wake_r)
            os.close(wake_w)
            if self._watchdog is not None:
                self._watchdog.finish(clean)
            if saved_subreaper is not None:
                _watchdog.set_child_subreaper(saved_subreaper)

    # -- starting -------------------------------------------------------------------------------------------

    def _start(self, rank: _Rank, affinity: frozenset[int] | None) -> None:
        spec = rank.spec
        if self._stop_signal is not None:
            self._finish(rank, stopped=True)  # stopping already: do not start more work to kill it
            return
        logs: list[int] = []
        try:
            if self._options.log_dir is not None:
                logs = _open_logs(self._options.log_dir, self._options.host, spec.rank)
            if spec.cpus is not None:
                # The child inherits the calling thread's mask at fork; the agent is single-threaded, so setting
                # our own mask around Popen binds exactly this child, with no wrapper process.
                os.sched_setaffinity(0, spec.cpus)
            try:
                popen = subprocess.Popen(
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
        except (OSError, ValueError) as err:  # ValueError: a NUL byte in argv or env
            for fd in logs:
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
        prefix = f"[{self._options.host}:{spec.rank}] ".encode("utf-8", "surrogateescape")
        assert popen.stdout is not None and popen.stderr is not None
        for pipe, console, log, keep_tail in (
            (popen.stdout, 1, logs[0] if logs else None, False),
            (popen.stderr, 2, logs[1] if logs else None, True),
        ):
            stream = _Stream(pipe, console, prefix, log, keep_tail)
            os.set_blocking(pipe.fileno(), False)
            rank.streams.append(stream)
            self._sel.register(stream.fd, selectors.EVENT_READ, functools.partial(self._read, stream))  # type: ignore[union-attr]
        if self._have_pidfd:
            try:
                rank.pidfd = os.pidfd_open(popen.pid)
            except OSError as err:
                if err.errno not in (errno.ENOSYS, errno.EPERM):
                    raise
                self._have_pidfd = False  # Linux < 5.3 (or seccomp): SIGCHLD alone tells us
            else:
                self._sel.register(rank.pidfd, selectors.EVENT_READ, self._collect_exits)  # type: ignore[union-attr]

    # -- the loop -------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._sel is not None
        select = self._sel.select
        registered = self._sel.get_map()
        self._check_progress()
        while not self._done:
            # Output is the hot path: a batch of reads alone needs neither the clock nor the bookkeeping.
            for key, _ in select(None if self._deadline is None else self._timeout()):
                # An earlier callback of this batch may have closed this fd (and its number been reused).
                if registered.get(key.fd) is key:
                    key.data()
            while self._signals:
                self._handle_signal(self._signals.popleft())
            if self._progress or self._deadline is not None:
                self._check_progress()

    def _timeout(self) -> float | None:
        now = time.monotonic()
        if self._kill_deadline is not None:
            timeout: float | None = self._kill_deadline - now
        elif self._deadline is not None:
            timeout = self._deadline - now
        else:
            timeout = None
        if self._sweeping and not self._have_pidfd:
            timeout = _POLL if timeout is None else min(timeout, _POLL)
        return None if timeout is None else max(0.0, timeout)

    def _check_progress(self) -> None:
        """Enforce the deadlines; once every main process is gone, sweep."""
        self._progress = False
        now = time.monotonic()
        if self._kill_deadline is not None and now >= self._kill_deadline:
            self._give_up()
            return
        if self._kill_deadline is None and self._deadline is not None and now >= self._deadline:
            self._escalate("the shutdown deadline passed")
        if not self._done and not any(r.running for r in self._ranks):
            if not self._sweeping or not self._leftover_fds:
                self._sweep()

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only record: the loop acts on it (the wakeup fd has already woken select()).
        self._signals.append(signum)

    def _handle_signal(self, signum: int) -> None:
        self._progress = True
        if signum == signal.SIGCHLD:
            self._collect_exits()
            self._reap_orphans()
            return
        if signum == signal.SIGINT:
            self._sigints += 1
            if self._sigints > 1:  # a second Ctrl-C: the user is not waiting for the deadline
                if self._interrupted_by is None:
                    self._interrupted_by = signum
                self._escalate("second SIGINT")
                return
        if self._interrupted_by is None:
            self._interrupted_by = signum
        self._begin_stop(signal.SIGTERM, f"the agent got {signal_name(signum)}")

    # -- exits ----------------------------------------------------------------------------------------------

    def _collect_exits(self) -> None:
        """Reap every rank main process that has exited, then record them in the order found.

        All statuses are collected before any is acted on, so ranks that failed in the same instant all count
        as failing on their own rather than as stopped by the first one's teardown.
        """
        exited = []
        for rank in self._ranks:
            if not rank.running:
                continue
            try:
                pid, status = os.waitpid(rank.pid, os.WNOHANG)
            except ChildProcessError:  # somebody else reaped it: its status is lost
                pid, status = rank.pid, None
            if pid == 0:
                continue
            rank.reaped = True
            if status is not None:
                if os.WIFSIGNALED(status):
                    rank.signal = os.WTERMSIG(status)
                else:
                    rank.returncode = os.waitstatus_to_exitcode(status)
            if rank.popen is not None:  # so Popen never waits for a pid that is no longer ours
                rank.popen.returncode = rank.returncode if rank.signal is None else -rank.signal
            exited.append(rank)
        for rank in exited:
            self._finish(rank, stopped=rank.signalled)

    def _finish(self, rank: _Rank, *, stopped: bool) -> None:
        """Record one rank's outcome, stop the others if it is the first failure, tell the caller."""
        self._progress = True
        rank.ended = time.monotonic()
        if rank.pidfd is not None:
            self._unregister(rank.pidfd)
            os.close(rank.pidfd)
            rank.pidfd = None
        for stream in rank.streams:
            self._drain_stream(stream)  # what it wrote before exiting belongs before its outcome
        if rank.start_error:
            tail: tuple[str, ...] = (rank.start_error,)
            write_all(2, (rank.start_error + "\n").encode("utf-8", "replace"))
        else:
            tail = rank.streams[1].tail_lines() if len(rank.streams) > 1 else ()
        spec = rank.spec
        outcome = rank.outcome = RankOutcome(
            host=self._options.host,
            rank=spec.rank,
            local_rank=spec.local_rank,
            pid=rank.pid,
            returncode=rank.returncode,
            signal=rank.signal,
            runtime_s=(rank.ended - rank.started) if rank.pid else 0.0,
            stderr_tail=tail,
            stopped_by_xrun=stopped,
        )
        if outcome.failed and not stopped and self._root is None:
            self._root = rank
            self._begin_stop(signal.SIGTERM, f"rank {spec.rank} {_describe(outcome)}")
        if self._on_rank_exit is not None:
            self._on_rank_exit(outcome)
        if rank.pid and self._watchdog is not None and not _group_exists(rank.pid):
            self._watchdog.forget(rank.pid)  # its group is empty: the number may be reused

    def _reap_orphans(self) -> None:
        """As subreaper we inherit the ranks' orphans: reap those that exited (only from our sessions).

        Called after the ranks' own exits are collected, so a waitable child is normally an orphan; one
        ``waitid(WNOWAIT)`` tells whether there is any, without scanning /proc.
        """
        sids = {r.pid for r in self._ranks if r.pid}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if self._watchdog is not None and info.si_pid == self._watchdog.pid:
                self._watchdog.lost()  # somebody killed it: carry on without the safety net
                continue
            proc = _watchdog.read_proc(info.si_pid)
            if proc is None or proc.sid not in sids or proc.pid in sids:
                return  # not one of ours (a child of the caller's): leave it to its owner
            try:
                os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                return

    # -- stopping -------------------------------------------------------------------------------------------

    def _begin_stop(self, signum: int, reason: str) -> None:
        if signum == signal.SIGKILL:
            self._escalate(reason)
            return
        if self._stop_signal is not None:
            return
        self._stop_signal = signum
        self._deadline = time.monotonic() + self._options.shutdown_timeout
        if self._sel is None:  # before run(): nothing is started
            return
        self._collect_exits()  # ranks that exited in the same instant failed on their own
        count = self._signal_running(signum)
        if count:
            self._notice(
                f"{reason}; stopping {count} rank{'s' if count != 1 else ''} "
                f"({signal_name(signum)}, SIGKILL after {self._options.shutdown_timeout:g} s)"
            )

    def _signal_running(self, signum: int) -> int:
        """Signal the group of every rank whose main process is not yet reaped (so its pgid is still ours)."""
        count = 0
        for rank in self._ranks:
            if rank.running:
                rank.signalled = True
                _watchdog.signal_groups((rank.pid,), signum)
                count += 1
        return count

    def _escalate(self, reason: str) -> None:
        """SIGKILL every group now, running ranks and anything left in their sessions."""
        if self._kill_deadline is not None:
            return
        if self._stop_signal is None:
            self._stop_signal = signal.SIGKILL
        now = time.monotonic()
        self._deadline = self._deadline if self._deadline is not None else now
        self._kill_deadline = now + _KILL_WAIT
        count = self._signal_running(signal.SIGKILL)
        members = _watchdog.signal_sessions({r.pid for r in self._ranks if r.pid}, signal.SIGKILL)
        for proc in members:
            self._sent[proc.pid] = signal.SIGKILL
        if count or members:
            self._notice(f"{reason}: SIGKILL to {count} rank(s) and {len(members)} process(es) in their sessions")

    def _sweep(self) -> None:
        """Every main process is gone: stop what is still alive in their sessions, or finish."""
        members = _watchdog.live_members({r.pid for r in self._ranks if r.pid})
        if not members:
            self._done = True
            return
        if not self._sweeping:
            self._sweeping = True
            if self._deadline is None:
                self._deadline = time.monotonic() + self._options.shutdown_timeout
            shown = ", ".join(str(p.pid) for p in members[:8]) + (", ..." if len(members) > 8 else "")
            self._notice(f"{len(members)} process(es) outlived their rank ({shown}); stopping them")
        signum = signal.SIGKILL if self._kill_deadline is not None else signal.SIGTERM
        fresh = [p for p in members if self._sent.get(p.pid) != signum]
        _watchdog.signal_groups((p.pgrp for p in fresh), signum)
        watched = set(self._leftover_fds.values())
        for proc in members:
            self._sent[proc.pid] = signum
            pids = self._leftovers.setdefault(proc.sid, [])
            if proc.pid not in pids:
                pids.append(proc.pid)
            if self._have_pidfd and proc.pid not in watched:
                try:
                    fd = os.pidfd_open(proc.pid)  # works for non-children too: readable once it exits
                except OSError:  # exited meanwhile
                    continue
                self._leftover_fds[fd] = proc.pid
                self._sel.register(fd, selectors.EVENT_READ, lambda fd=fd: self._leftover_gone(fd))  # type: ignore[union-attr]

    def _leftover_gone(self, fd: int) -> None:
        self._progress = True
        self._unregister(fd)
        os.close(fd)
        del self._leftover_fds[fd]
        self._reap_orphans()
        if not self._leftover_fds:
            self._sweep()  # look again: one may have forked before it went

    def _give_up(self) -> None:
        """SIGKILL went out _KILL_WAIT ago and something is still there (uninterruptible sleep): report it."""
        stuck = [r.spec.rank for r in self._ranks if r.running]
        members = _watchdog.live_members({r.pid for r in self._ranks if r.pid})
        self._notice(
            f"giving up on rank(s) {stuck} and process(es) {[p.pid for p in members]} "
            f"still alive {_KILL_WAIT:g} s after SIGKILL"
        )
        for rank in self._ranks:
            if rank.running:
                rank.signalled = rank.reaped = True
                self._finish(rank, stopped=True)
        for proc in members:
            pids = self._leftovers.setdefault(proc.sid, [])
            if proc.pid not in pids:
                pids.append(proc.pid)
        self._done = True

    def _emergency_stop(self) -> None:
        """run() is leaving by an exception: nothing may outlive it."""
        sids = {r.pid for r in self._ranks if r.pid}
        self._signal_running(signal.SIGKILL)
        _watchdog.signal_sessions(sids, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
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

    # -- output ---------------------------------------------------------------------------------------------

    def _read(self, stream: _Stream) -> None:
        assert stream.fd is not None
        try:
            chunk = os.read(stream.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self._consume(stream, chunk)
        else:
            self._close_stream(stream)

    def _drain_stream(self, stream: _Stream, limit: int = 64) -> None:
        """Read what is already in the pipe without waiting (bounded: a surviving child may keep writing)."""
        for _ in range(limit):
            if stream.fd is None:
                return
            try:
                chunk = os.read(stream.fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._close_stream(stream)
                return
            self._consume(stream, chunk)

    def _consume(self, stream: _Stream, chunk: bytes) -> None:
        if stream.log is not None:
            write_all(stream.log, chunk)
        if stream.tail is not None:
            stream.total += len(chunk)
            stream.tail = (stream.tail + chunk)[-_TAIL_BYTES:] if len(chunk) < _TAIL_BYTES else chunk[-_TAIL_BYTES:]
        if self._quiet or not self._console_ok[stream.console]:
            return
        if not self._prefix:
            self._emit(stream.console, chunk)
            return
        out, stream.pending = prefix_lines(stream.prefix, stream.pending, chunk)
        if len(stream.pending) > _MAX_PENDING:
            out += stream.prefix + stream.pending + b"\n"
            stream.pending = b""
        if out:
            self._emit(stream.console, out)

    def _close_stream(self, stream: _Stream) -> None:
        if stream.fd is None:
            return
        self._unregister(stream.fd)
        stream.pipe.close()
        stream.fd = None
        if stream.pending:  # the last line had no newline: give it one so the next line starts clean
            self._emit(stream.console, stream.prefix + stream.pending + b"\n")
            stream.pending = b""

    def _flush_streams(self) -> None:
        for rank in self._ranks:
            for stream in rank.streams:
                self._drain_stream(stream)
                self._close_stream(stream)

    def _emit(self, fd: int, data: bytes) -> None:
        if self._console_ok[fd] and not write_all(fd, data):
            self._console_ok[fd] = False  # our reader went away (`| head`): keep logging, stop echoing

    def _notice(self, text: str) -> None:
        write_all(2, f"xrun[{self._options.host}]: {text}\n".encode("utf-8", "replace"))

    # -- the end --------------------------------------------------------------------------------------------

    def _result(self) -> NodeResult:
        outcomes = []
        for rank in sorted(self._ranks, key=lambda r: r.spec.rank):
            assert rank.outcome is not None
            leftovers = tuple(self._leftovers.get(rank.pid, ())) if rank.pid else ()
            outcomes.append(replace(rank.outcome, leftovers=leftovers) if leftovers else rank.outcome)
        by_rank = {o.rank: o for o in outcomes}
        root = by_rank[self._root.spec.rank] if self._root is not None else None
        if root is not None:
            code = exit_code_of(root)
        elif self._interrupted_by is not None:
            code = 128 + self._interrupted_by
        elif any(o.failed for o in outcomes):
            code = 1
        else:
            code = 0
        return NodeResult(
            host=self._options.host,
            outcomes=tuple(outcomes),
            root_cause=root,
            interrupted_by=self._interrupted_by,
            exit_code=code,
        )

    def _unregister(self, fd: int) -> None:
        if self._sel is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def _close_all(self) -> None:
        for rank in self._ranks:
            for stream in rank.streams:
                if stream.fd is not None:
                    self._unregister(stream.fd)
                    stream.pipe.close()
                    stream.fd = None
                if stream.log is not None:
                    os.close(stream.log)
                    stream.log = None
            if rank.pidfd is not None:
                os.close(rank.pidfd)
                rank.pidfd = None
        for fd in self._leftover_fds:
            os.close(fd)
        self._leftover_fds.clear()
        if self._sel is not None:
            self._sel.close()


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _get_affinity() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _open_logs(log_dir: str, host: str, rank: int) -> list[int]:
    """Open ``{log_dir}/{host}/rank{N}/stdout.log`` and ``stderr.log``, keeping earlier runs' files."""
    directory = os.path.join(log_dir, _safe_name(host), f"rank{rank}")
    os.makedirs(directory, exist_ok=True)
    fds = []
    try:
        for name in ("stdout", "stderr"):
            path = os.path.join(directory, f"{name}.log")
            _rotate(path, name)
            fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _rotate(path: str, name: str) -> None:
    """Rename an existing ``stdout.log`` to ``stdout.<its mtime as YYYYmmdd-HHMMSS>.log``."""
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(mtime))
    directory = os.path.dirname(path)
    target = os.path.join(directory, f"{name}.{stamp}.log")
    n = 1
    while os.path.exists(target):  # two runs in the same second
        target = os.path.join(directory, f"{name}.{stamp}.{n}.log")
        n += 1
    os.rename(path, target)


def _safe_name(host: str) -> str:
    name = host.replace(os.sep, "_")
    return name if name not in ("", ".", "..") else "_"


def _describe(outcome: RankOutcome) -> str:
    if outcome.signal is not None:
        return f"died by {signal_name(outcome.signal)}"
    return f"exited with code {outcome.returncode}"
