"""The watchdog: a forked copy of the agent that stops every rank session if the agent is ``kill -9``'d.

The watchdog keeps only the read end of a pipe. The agent writes ``+SID`` for each rank it starts (a rank's
session id is its pid), ``-SID`` once that session is empty, and ``done`` when it has cleaned up. EOF without
``done`` means the agent died (SIGKILL, OOM killer), so the watchdog stops every session it was told about:
TERM, wait, KILL, by process group (xrun.launch.procs.proctable), never by name or pattern; then it removes the
agent's per-run directories (``removed_if_the_agent_dies``: the ranks' ``TORCHELASTIC_ERROR_FILE`` directory),
which the dead agent can no longer remove.

An agent connected to a head (or to pod mode's node 0) also beats: inside ``watched_for_freezes(bound)`` the loop
that supervises the ranks writes ``.`` every ``bound / 5`` s (``beat``, a timer of xrun.launch.ranks.supervise's
loop), and a watchdog that hears nothing for ``bound`` s takes the agent for frozen (SIGSTOP, a stopped container,
a machine that stopped scheduling it, a loop deadlocked in a callback) and stops the ranks the same way. The beat
comes from that loop and from nothing else (issue 33 §4): a thread beside it kept beating for a loop that hung.
The head gives such a node up after the same silence (its keepalive: the same loop answers its pings), and a
hot spare may take its place: without the beat the frozen agent's ranks ran on beside their replacements. A
local run does not beat: a Ctrl-Z of xrun there pauses the job, as it always did.
(horovod's runner uses a middleman per rank for the same reason; one per node is enough.)
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import time
from collections.abc import Collection, Iterator

from xrun.launch.procs.proctable import live_members, signal_sessions

# The agent's per-run directories. A module global on purpose: the watchdog is a fork, so it holds the set as
# it was when it was forked, with no message on the pipe and nothing for the code that starts it to pass on.
_directories: set[str] = set()
_frozen_after: list[float] = []  # the bound of the innermost watched_for_freezes block (the same reason)


@contextlib.contextmanager
def removed_if_the_agent_dies(*directories: str) -> Iterator[None]:
    """Within this block, a watchdog forked after it began removes ``directories`` if the agent dies: a ``kill -9``
    of the agent leaves nothing behind, its ranks' files included (the agent removes them itself otherwise)."""
    _directories.update(directories)
    try:
        yield
    finally:
        _directories.difference_update(directories)


@contextlib.contextmanager
def watched_for_freezes(bound: float) -> Iterator[None]:
    """Within this block, a watchdog forked after it began stops the ranks when the agent has been frozen for
    ``bound`` s (the module doc): for agents whose head gives them up after that silence."""
    _frozen_after.append(bound)
    try:
        yield
    finally:
        _frozen_after.pop()


class Watchdog:
    """The agent's end of the watchdog: a pid and the write end of its pipe. Used by one thread, the loop's."""

    def __init__(self, pid: int, fd: int, beat_every: float | None = None) -> None:
        self.pid = pid
        self._fd: int | None = fd
        self._reaped = False
        self.beat_every = beat_every  # None: no beat is expected (a local run)
        self._next_beat = time.monotonic()

    @classmethod
    def start(cls, grace: float) -> Watchdog:
        """Fork the watchdog. Call before the agent installs its signal handlers and opens rank pipes."""
        frozen_after = _frozen_after[-1] if _frozen_after else None
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the watchdog: never return into the agent's code, never run its atexit hooks
            code = 1
            try:
                code = _watchdog_main(read_fd, grace, frozen_after)
            finally:
                os._exit(code)
        os.close(read_fd)
        return cls(pid, write_fd, frozen_after / 5 if frozen_after is not None else None)

    def beat_due(self) -> float | None:
        """When the next beat is due (monotonic); None if this watchdog expects none."""
        return self._next_beat if self.beat_every is not None and self._fd is not None else None

    def beat(self) -> None:
        """The agent is alive: its loop came round."""
        if self.beat_every is not None:
            self._send(b".\n")
            self._next_beat = time.monotonic() + self.beat_every

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


def _watchdog_main(read_fd: int, grace: float, frozen_after: float | None) -> int:
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

    sids = _read_orders(read_fd, frozen_after)
    if sids is None:
        return 0
    stop_sessions(sids, grace)
    for directory in _directories:  # after the ranks are gone: none of them writes there any more
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def _read_orders(read_fd: int, frozen_after: float | None) -> set[int] | None:
    """The sessions to stop once the agent died (EOF) or froze (no byte for ``frozen_after`` s); None after
    ``done``. ``.`` is a beat: it only proves the agent alive."""
    sids: set[int] = set()
    pending = b""
    while True:
        if frozen_after is not None and not select.select([read_fd], [], [], frozen_after)[0]:
            return sids  # frozen: the head has given this node up, or is about to
        chunk = os.read(read_fd, 4096)
        if not chunk:
            return sids
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line == b"done":
                return None
            if line[:1] == b"+":
                sids.add(int(line[1:]))
            elif line[:1] == b"-":
                sids.discard(int(line[1:]))


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
