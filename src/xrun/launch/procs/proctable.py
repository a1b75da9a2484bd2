"""The process table as the agent sees it: read ``/proc``, signal process groups, reap orphans.

Ranks run in their own sessions (``start_new_session=True``), so a rank's session id is its pid and every
process it forks stays in that session unless it calls ``setsid()`` itself. Everything here finds processes by
session id read from ``/proc/PID/stat`` and signals them by process group: never by name or pattern.

Used by the supervisor (xrun.launch.ranks.supervise, xrun.launch.ranks.reaper), by the watchdog process
(xrun.launch.procs.watchdog), which stops the same sessions when the agent itself is killed, and by the hang
doctor's clock of a rank's own time (xrun.launch.doctor.node_doctor, ``cpu_wait``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass

# prctl(2) options; PR_SET_CHILD_SUBREAPER exists since Linux 3.4.
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_DEAD_STATES = frozenset("ZXx")  # zombie or dead: exited, only waiting to be reaped


@dataclass(frozen=True)
class ProcInfo:
    """One row of the /proc table: a live process and the groups it belongs to."""

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


def cpu_wait(pid: int) -> float:
    """Seconds ``pid`` has been runnable but waiting for a CPU since it started (``/proc/PID/schedstat``'s second
    field, the kernel's sched-stats.rst); 0.0 when unreadable (a kernel without schedstats, the process gone)."""
    try:
        fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
    except OSError:
        return 0.0
    try:
        return int(os.read(fd, 128).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
    finally:
        os.close(fd)


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


def group_exists(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (one we may not signal counts: it exists)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def children() -> set[int] | None:
    """This process's children as the kernel lists them, for each of its threads (a child is listed under the
    thread that forked it); None where the kernel keeps no such list (built without CONFIG_PROC_CHILDREN)."""
    found: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as listing:
                found.update(int(pid) for pid in listing.read().split())
        except FileNotFoundError:
            if tid == str(os.getpid()):  # the main thread has none: the kernel keeps no list at all
                return None
        except OSError:  # a thread that ended meanwhile
            continue
    return found


def exited_child() -> int | None:
    """The pid of a child of ours that exited and waits to be reaped, left waitable (``WNOWAIT``); else None."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    return info.si_pid if info is not None else None


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status, if it is a child of ours that exited."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def reap_orphan(pid: int, sids: Collection[int]) -> bool:
    """Reap ``pid`` if it is an orphan from one of ``sids`` (a member, not the session leader); else False.

    A child that is not from those sessions belongs to whoever started it (the caller of the agent): leave it.
    """
    proc = read_proc(pid)
    if proc is None or proc.sid not in sids or proc.pid in sids:
        return False
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return True
