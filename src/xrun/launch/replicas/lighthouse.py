"""torchft's Lighthouse on node 0, supervised for the whole job (issue 39 §2).

torchft's README has the user start ``torchft_lighthouse`` beside one torchrun per group; under
``--replica_groups`` the agent of node 0 runs it (``xrun.launch.replicas.torchft_main``: the same server, started
without torch): up (listening) before any rank starts, restarted when it dies (the groups' Managers reach the new
one at the same address; it keeps no state but the quorum in progress), stopped when the job ends, and never left
behind.

The agent starts a keeper (``python -m xrun.launch.replicas.lighthouse``: ``keep``), and the keeper starts the
Lighthouse and starts it again each time it dies, saying so on the console. The keeper is a process of its own
because the agent, as its ranks' subreaper, takes a child it did not have before the ranks started for a daemon a
rank left (``xrun.launch.ranks.survivors``) and sweeps it: a Lighthouse restarted by the agent itself would be.
Each dies with its parent (``PR_SET_PDEATHSIG``), so a ``kill -9`` of xrun takes both; they run in a session of
their own, so a Ctrl-C at the terminal reaches xrun alone, which stops them (SIGTERM to the session, SIGKILL after
``STOP_GRACE_S``). Dying ``GIVE_UP_AFTER`` times within ``GIVE_UP_WINDOW_S`` seconds is "gone for good": the keeper
says so and exits with ``GONE_EXIT``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

from xrun.common.output.streams import notice
from xrun.common.procs.posix import leave
from xrun.common.spec import NodeSpec
from xrun.errors import UsageError
from xrun.launch.replicas import torchft_main
from xrun.launch.replicas.torchft_main import extension
from xrun.launch.store.agent_store import listen_address
from xrun.parent_death import die_with_parent

# torchft's defaults but one: a single group may train alone (its peer restarting), as under torchrun in issue 39
ARGS = ("--min_replicas", "1")
UP_WITHIN_S = 20.0  # its start (0.07 s here) on a loaded machine
STOP_GRACE_S = 5.0
GIVE_UP_AFTER, GIVE_UP_WINDOW_S = 5, 60.0
GONE_EXIT = 3  # the keeper's exit code when the Lighthouse is gone for good


def lighthouse_argv(address: str, port: int) -> tuple[str, ...]:
    """The Lighthouse's command line (``torchft_main``: torchft's without importing torch), bound where the groups'
    stores would listen (every address: ``[::]``); refused (exit 2) where this interpreter has no torchft."""
    if extension() is None:
        raise UsageError("--replica_groups", f"torchft is not installed for {sys.executable}: pip install torchft "
                         "(and numpy) in the job's environment")
    host = address or "::"
    # by its path, not -m: torchft's parser reads the process's own argv past its first word after python
    return (sys.executable, torchft_main.__file__, *ARGS, "--bind",
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


class KeeperWatch:
    """While the ranks run, the keeper's end (a pidfd in the rank group's loop) is the Lighthouse gone for good:
    the keeper stops only when told, and ``gone(reason)`` is called once to end the job as a failure."""

    def __init__(self, keeper: subprocess.Popen[bytes], gone: Callable[[str], None]) -> None:
        self.keeper = keeper
        self._gone = gone
        self._fd: int | None = None
        self._group: Readers | None = None

    def attach(self, group: Readers) -> None:
        """Watch from ``group``'s loop (each attempt's rank group in turn)."""
        if self.keeper.poll() is not None:
            self._ended()
            return
        self._fd, self._group = os.pidfd_open(self.keeper.pid), group
        group.add_reader(self._fd, self._ended)

    def detach(self) -> None:
        if self._fd is not None:
            if self._group is not None:
                self._group.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = self._group = None

    def _ended(self) -> None:
        self.detach()
        code = self.keeper.wait()
        self._gone(f"torchft's Lighthouse is gone for good (its keeper, pid {self.keeper.pid}, exited with code "
                   f"{code}): the replica groups cannot meet any more, so the job fails (--replica_groups)")


class Readers(Protocol):
    """What ``KeeperWatch`` needs of a rank group (xrun.launch.ranks.supervise.RankGroup)."""

    def add_reader(self, fileobj: int, callback: Callable[[], None]) -> None: ...

    def remove_reader(self, fileobj: int) -> None: ...


@contextmanager
def lighthouse(spec: NodeSpec) -> Iterator[subprocess.Popen[bytes] | None]:
    """Node 0's Lighthouse of a ``--replica_groups`` job, kept for the ``with`` block (its keeper; None on another
    node or without the flag). Refused (exit 2) if it cannot start or does not listen within ``UP_WITHIN_S``."""
    if spec.replicas is None or spec.node_rank != 0 or not spec.ranks:
        yield None
        return
    address = listen_address(spec.ranks[0].env.get("MASTER_ADDR", ""))
    port = spec.replicas.lighthouse_port
    argv = lighthouse_argv(address, port)
    keeper = subprocess.Popen(
        [sys.executable, "-m", "xrun.launch.replicas.lighthouse", spec.host, *argv], stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL, os.getpid()))
    try:
        _wait_listening(keeper, address or "127.0.0.1", port)
        yield keeper
    finally:
        _stop(keeper)


def _wait_listening(keeper: subprocess.Popen[bytes], address: str, port: int) -> None:
    deadline = time.monotonic() + UP_WITHIN_S
    while not _listening(address, port):
        if keeper.poll() is not None or time.monotonic() > deadline:
            raise UsageError("--replica_groups", f"torchft's Lighthouse did not listen at {address}:{port} within "
                             f"{UP_WITHIN_S:g} s (is the port taken? run it by hand to see why)")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its session (the keeper and the Lighthouse), SIGKILL after ``STOP_GRACE_S``."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


# -- the keeper: its own process (see the module doc) --------------------------------------------------------------


class _Stop(Exception):
    pass


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    raise _Stop


def keep(node: str, argv: Sequence[str]) -> int:
    """Run ``argv`` (the Lighthouse) until a signal stops this keeper, starting it again each time it dies; 0 once
    stopped, ``GONE_EXIT`` once it died ``GIVE_UP_AFTER`` times within ``GIVE_UP_WINDOW_S``."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    arm = die_with_parent(signal.SIGKILL, os.getpid())
    deaths: list[float] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        while True:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, preexec_fn=arm)
            code = proc.wait()
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < GIVE_UP_WINDOW_S] + [now]
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            if len(deaths) >= GIVE_UP_AFTER:
                notice(node, f"torchft's Lighthouse (pid {proc.pid}) {how}, its {len(deaths)}th death in "
                             f"{GIVE_UP_WINDOW_S:g} s: it is gone for good, not restarted (--replica_groups)")
                return GONE_EXIT
            # at once: torchft 0.2.0's Manager does not recover from a quorum that finds no Lighthouse
            notice(node, f"torchft's Lighthouse (pid {proc.pid}) {how}; restarting it (--replica_groups)")
    except _Stop:
        return 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    leave(keep(sys.argv[1], sys.argv[2:]))  # the console's last line (written from a thread) first
