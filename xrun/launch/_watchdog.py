"""The process table as the agent sees it, and the watchdog that outlives a ``kill -9``'d agent.

Ranks run in their own sessions (``start_new_session=True``), so a rank's session id is its pid and every
process it forks stays in that session unless it calls ``setsid()`` itself. Everything here finds processes by
session id read from ``/proc/PID/stat`` and signals them by process group: never by name or pattern.

The watchdog is a forked copy of the agent that keeps only the read end of a pipe. The agent writes
``+SID`` for each rank it starts and ``done`` when it has cleaned up. EOF without ``done`` means the agent
died (SIGKILL, OOM killer), so the watchdog stops every session it was told about: TERM, wait, KILL.
(horovod's runner uses a middleman per rank for the same reason; one per node is enough.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

# prctl(2) options; PR_SET_CHILD_SUBREAPER exists since Linux 3.4.
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_DEAD_STATES = frozenset("ZXx")  # zombie or dead: exited, only waiting to be reaped


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgrp: int
    sid: int
    state: str

    @property
    def alive(self) -> bool:
        return self.state not in _DEAD_STATES


def read_proc(pid: int) -> ProcInfo | None:
    """One process's ids and state from ``/proc/PID/stat``; None when it is gone."""
    data = _read_stat(str(pid))
    return _parse_stat(pid, data) if data else None


def _read_stat(name: str, dir_fd: int | None = None) -> bytes:
    try:
        fd = os.open(f"{name}/stat" if dir_fd is not None else f"/proc/{name}/stat", os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return b""
    try:
        return os.read(fd, 512)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _parse_stat(pid: int, data: bytes) -> ProcInfo | None:
    # proc(5): "pid (comm) state ppid pgrp session ..."; comm may contain spaces and parentheses.
    fields = data[data.rfind(b")") + 2 :].split(b" ", 4)
    if len(fields) < 5:
        return None
    return ProcInfo(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode("ascii", "replace"))


def session_members(sids: Collection[int]) -> list[ProcInfo]:
    """Every process (zombies included) whose session is one of ``sids``: one pass over ``/proc``."""
    if not sids:
        return []
    found = []
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in os.listdir(proc_fd):
            if name.isdigit():
                data = _read_stat(name, proc_fd)
                if not data:  # gone meanwhile
                    continue
                fields = data[data.rfind(b")") + 2 :].split(b" ", 4)  # state ppid pgrp session rest
                sid = int(fields[3])
                if sid in sids:
                    found.append(ProcInfo(int(name), int(fields[1]), int(fields[2]), sid, fields[0].decode()))
    finally:
        os.close(proc_fd)
    return found


def live_members(sids: Collection[int]) -> list[ProcInfo]:
    """Members of ``sids`` that have not exited (a zombie has exited: only its parent's wait is missing)."""
    return [p for p in session_members(sids) if p.alive]


def signal_groups(pgids: Iterable[int], signum: int) -> None:
    """``killpg`` each group; a group that is already gone or not ours is skipped."""
    for pgid in set(pgids):
        if pgid > 1:
            try:
                os.killpg(pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def signal_sessions(sids: Collection[int], signum: int) -> list[ProcInfo]:
    """Signal every process group that has a live member in ``sids``; return those members.

    Only groups seen alive in the scan are signalled: a session leader that is gone and reaped frees its
    pid, which may since name somebody else's group.
    """
    members = live_members(sids)
    signal_groups((p.pgrp for p in members), signum)
    return members


def set_child_subreaper(on: bool) -> bool | None:
    """Make orphaned descendants reparent to this process (so it reaps them); return the previous setting.

    None when prctl is not available (not Linux): orphans then go to init, which is only untidy.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        previous = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
            return None
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            return None
        return bool(previous.value)
    except (OSError, AttributeError):
        return None


# ---------------------------------------------------------------------------------------------------------------
# The watchdog process.


class Watchdog:
    """The agent's end of the watchdog: a pid and the write end of its pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd: int | None = fd
        self._reaped = False

    @classmethod
    def start(cls, grace: float) -> Watchdog:
        """Fork the watchdog. Call before the agent installs its signal handlers and opens rank pipes."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the watchdog: never return into the agent's code, never run its atexit hooks
            code = 1
            try:
                code = _watchdog_main(read_fd, grace)
            finally:
                os._exit(code)
        os.close(read_fd)
        return cls(pid, write_fd)

    def watch(self, sid: int) -> None:
        self._send(b"+%d\n" % sid)

    def forget(self, sid: int) -> None:
        self._send(b"-%d\n" % sid)

    def finish(self, clean: bool) -> None:
        """Release the watchdog: ``done`` if every session is gone; otherwise EOF alone makes it clean up."""
        if clean:
            self._send(b"done\n")
        self._close()
        # After "done" it exits at once; after a bare EOF it may still be sweeping, so do not block then.
        self._reap(blocking=clean)

    def lost(self) -> None:
        """The watchdog exited before its time (somebody killed it): reap it, carry on without it."""
        self._reap(blocking=False)
        self._close()

    def _send(self, message: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, message)  # a few bytes: atomic on a pipe
        except BrokenPipeError:  # it was killed; the agent carries on without it
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _reap(self, *, blocking: bool) -> None:
        if self._reaped:
            return
        try:
            pid, _ = os.waitpid(self.pid, 0 if blocking else os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        self._reaped = pid == self.pid


def _watchdog_main(read_fd: int, grace: float) -> int:
    os.setsid()  # out of the agent's process group: a terminal's Ctrl-C or a killpg of the agent misses it
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    # Keep only the pipe: holding the agent's other pipes (its stdout, the ranks' output) would keep
    # readers waiting for an EOF that never comes.
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != read_fd:
            try:
                os.close(fd)
            except OSError:  # the directory's own fd, already closed
                pass
    os.chdir("/")

    sids: set[int] = set()
    pending = b""
    while True:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line == b"done":
                return 0
            if line[:1] == b"+":
                sids.add(int(line[1:]))
            elif line[:1] == b"-":
                sids.discard(int(line[1:]))
    stop_sessions(sids, grace)
    return 0


def stop_sessions(sids: Collection[int], grace: float, *, tick: float = 0.02) -> None:
    """TERM every group in ``sids``, wait up to ``grace`` for them to go, KILL what is left.

    A bounded poll, used only by the watchdog after the agent died: the agent itself is event-driven.
    """
    if not signal_sessions(sids, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        time.sleep(tick)
        if not live_members(sids):
            return
    signal_sessions(sids, signal.SIGKILL)
