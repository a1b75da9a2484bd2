"""The preload helper: the program of the one process per node that imports the heavy modules and forks ranks.

Started by the agent (xrun.launch.preload.client) as ``PYTHON OPTIONS -c BOOT ROOT FD AGENT_PID``: the ranks'
own interpreter with the ranks' own options, so ``sys.flags`` and ``sys.executable`` are theirs. It

* dies with the agent (``PR_SET_PDEATHSIG``, ``xrun.parent_death``; and an end of file on its socket: it then
  just exits);
* imports the modules it is told, in order, and nothing else; never runs user code;
* refuses, in one line (exit 2), a module that cannot be imported, one whose import initialised CUDA (a fork
  after that breaks every rank's GPU: "Cannot re-initialize CUDA in forked subprocess"), and one that leaves a
  thread running (a fork copies only the thread that forks; a pool that stops itself at fork, as OpenBLAS's does,
  is fine: a trial fork after each import tells them apart);
* then forks one rank per order, twice over: a short-lived middle process forks the rank and exits at once, so
  the rank's parent becomes the nearest child subreaper above: the agent (xrun.launch.ranks.supervise makes it
  one), whose ``wait4`` then gets its status and its CPU and memory figures as for a rank it started itself.

The rank, a fork of this process, returns from ``_serve`` into ``main`` and becomes the rank there
(xrun.launch.preload.become): no frame of the helper is left below the user's program but ``main`` itself.
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

from xrun.common.preload.argv import NotForkable, parse_python_argv
from xrun.launch.preload import become, kernel, wire
from xrun.parent_death import die_with_parent

_PID = struct.Struct("=i")


@dataclass(frozen=True)
class _Rank:
    """What a freshly forked rank takes from ``_serve`` back to ``main``."""

    order: wire.ForkOrder
    fds: tuple[int, ...]  # stdout, stderr, hold (xrun.launch.preload.wire.ORDER_FDS)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[2]))
    arm = die_with_parent(signal.SIGKILL, int(sys.argv[3]))  # the agent; dead already: SIGKILL at once
    if arm is not None:
        arm()
    try:
        preload, _ = wire.recv(sock)
    except wire.Gone:
        os._exit(0)
    if not isinstance(preload, wire.Preload):
        raise wire.ProtocolError(f"expected preload, got {preload}")
    gc.disable()  # no collection while importing: it would leave holes in pages the ranks then share
    own = frozenset(name for name in sys.modules if name == "xrun" or name.startswith("xrun."))
    sys.path[0] = preload.path0
    sys.argv = sys.argv[:1]
    started = time.monotonic()
    refusal = _preload(sock, preload.modules)
    if refusal is not None:
        wire.send(sock, wire.Refused(refusal))
        os._exit(2)
    startup = become.Startup.here(preload.options, own)
    gc.freeze()  # what is imported now is never scanned by a rank's collections, which would copy its every page
    wire.send(sock, wire.Ready(os.getpid(), time.monotonic() - started, _titles()))
    rank = _serve(sock)
    become.become(rank.order, rank.fds, startup, sock)  # only a forked rank gets here


def _preload(sock: socket.socket, modules: tuple[str, ...]) -> str | None:
    """Import ``modules`` in order; the first one that cannot be preloaded, in one line (None: all are in)."""
    for name in modules:
        wire.send(sock, wire.Importing(name))
        try:
            importlib.import_module(name)
        except BaseException as err:  # noqa: BLE001 - whatever the import raised, SystemExit included, is the answer
            said = " ".join(str(err).split())[:300]
            return (f"--preload: cannot import {name!r} ({type(err).__name__}: {said}): install it for "
                    f"{sys.executable} or leave it out of --preload")
        problem = _fork_hazard()
        if problem is not None:
            return f"--preload: importing {name!r} {problem}: leave {name!r} out of --preload"
    return None


def _fork_hazard() -> str | None:
    """What the modules imported so far left that a fork would break, in words (None: nothing)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return ('initialised CUDA, and a rank forked after that cannot use the GPU ("Cannot re-initialize CUDA in '
                'forked subprocess")')
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"started {len(others)} Python thread(s) ({', '.join(others[:3])}) that a fork would not copy"
    _trial_fork()  # thread pools that stop themselves before a fork (pthread_atfork) do it now
    native = len(os.listdir("/proc/self/task")) - 1
    if native:
        return f"left {native} native thread(s) running through a fork, which a forked rank would not have"
    return None


def _trial_fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _titles() -> str | None:
    """Whether a forked rank can show its own command line: the helper shows its own again, to find out."""
    with open("/proc/self/cmdline", "rb") as f:
        argv = [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
    return kernel.show_as(argv, dict(os.environ))


def _serve(sock: socket.socket) -> _Rank:
    """Fork one rank per order until the agent closes its end; returns only in a forked rank."""
    while True:
        try:
            order, fds = wire.recv(sock, max_fds=wire.ORDER_FDS)
        except wire.Gone:
            os._exit(0)
        if not isinstance(order, wire.ForkOrder) or len(fds) != wire.ORDER_FDS:
            raise wire.ProtocolError(f"expected a fork order and {wire.ORDER_FDS} descriptors, got {order}")
        forked = _fork(order, tuple(fds))
        if isinstance(forked, _Rank):
            return forked
        for fd in fds:  # the rank has its copies
            os.close(fd)
        wire.send(sock, forked)


def _fork(order: wire.ForkOrder, fds: tuple[int, ...]) -> wire.Forked | wire.ForkFailed | _Rank:
    try:
        parse_python_argv(order.argv)
    except NotForkable as err:
        return wire.ForkFailed(str(err))
    if not os.path.isdir(order.cwd):
        return wire.ForkFailed(f"[Errno 2] No such directory: {order.cwd!r}")
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
        middle = os.fork()
    except OSError as err:
        os.close(read_end)
        os.close(write_end)
        return wire.ForkFailed(f"fork: {err}")
    if middle == 0:  # the middle process: fork the rank, say its pid, go
        os.close(read_end)
        try:
            pid = os.fork()
        except OSError as err:
            os.write(write_end, f"fork: {err}".encode())
            os._exit(1)
        if pid == 0:
            os.close(write_end)
            return _Rank(order, fds)
        os.write(write_end, _PID.pack(pid))
        os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)  # once it is gone, the rank's parent is the nearest subreaper: the agent
    with os.fdopen(read_end, "rb") as said:
        answer = said.read()
    if len(answer) != _PID.size:
        return wire.ForkFailed(answer.decode(errors="replace") or "the middle process died before it forked")
    return wire.Forked(_PID.unpack(answer)[0])
