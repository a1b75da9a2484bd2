"""The agent's end of its preload helper (xrun.launch.preload.helper): start it, wait until its modules are in,
fork ranks from it, and notice at once when it is gone (its socket turns readable: it never speaks unasked).

A fork is one order and one answer, bounded (``FORK_TIMEOUT``). The rank it makes is the agent's child (the agent
is the ranks' child subreaper while it forks: ``fork`` checks the rank's parent) and waits on a hold pipe whose
only write end the agent keeps: ``ForkedRank.release`` lets it run once the agent watches it; closing the pipe
unreleased (the agent failed, or died) makes it leave before running anything. So a rank forked while the helper
is being killed is never left running: its order's answer never comes, the agent closes the hold pipe, and the
rank, if the helper got as far as forking it, exits on the end of file.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence

import xrun
from xrun.common.preload.argv import NotForkable, fork_refusal, parse_python_argv, path0
from xrun.common.procs.posix import signal_name
from xrun.errors import PreloadError
from xrun.launch.preload import wire
from xrun.launch.procs.proctable import read_proc

# The helper's command line: the ranks' interpreter and options, then this; the package's root to load it from, the
# socket's descriptor and the agent's pid follow as its arguments.
BOOT = "import sys; sys.path[0] = sys.argv[1]; from xrun.launch.preload.helper import main; main()"
CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch.cuda.is_available() asks NVML instead of initialising CUDA
FORK_TIMEOUT = 30.0  # a fork is milliseconds; a helper silent this long is taken for dead (and killed)
STOP_WAIT = 2.0  # after its socket closes, how long the helper has to exit before SIGKILL
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(xrun.__file__)))  # where the helper loads xrun from


class HelperGone(OSError):
    """The helper died (or stopped answering): no rank can be forked from it."""


class ForkFailed(OSError):
    """The helper could not fork this rank (the kernel's refusal, a working directory that is gone)."""


class ForkedRank:
    """A rank just forked, held before its program until ``release`` (or let go by ``abandon``)."""

    def __init__(self, pid: int, hold: int) -> None:
        self.pid = pid
        self._hold: int | None = hold

    def release(self) -> None:
        """Let the rank run its program (the agent watches it now)."""
        if self._hold is not None:
            try:
                os.write(self._hold, b"g")
            except BrokenPipeError:  # it died meanwhile: its exit is seen the usual way
                pass
            self.abandon()

    def abandon(self) -> None:
        """Close the hold pipe unreleased: the rank exits before running anything."""
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None


class PreloadHelper:
    """One preload helper, started by ``start``: the agent's child, in its own session."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, *, python: str,
                 options: tuple[str, ...], modules: tuple[str, ...]) -> None:
        self._proc = proc
        self._sock = sock
        self.python = python
        self.options = options
        self.modules = modules
        self.ready: wire.Ready | None = None
        self._importing: str | None = None
        self._gone: str | None = None  # how it ended, once it did

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    def start(cls, modules: Sequence[str], *, python: str, options: Sequence[str] = ("-u",),
              env: Mapping[str, str], cwd: str, path0: str) -> PreloadHelper:
        """Start a helper that imports ``modules`` with ``python OPTIONS`` (the ranks' interpreter and options),
        ``env`` (what the ranks share: a module reads it as it loads), in ``cwd``, with ``path0`` as sys.path[0]
        (the ranks' script's directory). Returns at once; ``wait_ready`` waits for the imports."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        helper_env = dict(env)
        helper_env.setdefault(CUDA_CHECK, "1")  # a module asking torch.cuda.is_available() must not start CUDA
        argv = [python, *options, "-c", BOOT, _ROOT, str(theirs.fileno()), str(os.getpid())]
        try:
            proc = subprocess.Popen(
                argv, env=helper_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=2, stderr=2, close_fds=True,
                pass_fds=(theirs.fileno(),), start_new_session=True,  # out of the terminal's reach: the agent stops it
            )
        except OSError as err:
            mine.close()
            raise PreloadError(f"--preload: cannot start the helper with {python}: {err.strerror or err}") from None
        finally:
            theirs.close()
        helper = cls(proc, mine, python=python, options=tuple(options), modules=tuple(modules))
        try:
            wire.send(mine, wire.Preload(tuple(modules), path0, tuple(options)))
        except OSError:
            pass  # it died at once: wait_ready says how
        return helper

    @classmethod
    def start_for(cls, modules: Sequence[str], argv: Sequence[str], *, env: Mapping[str, str],
                  cwd: str) -> PreloadHelper:
        """``start`` a helper for ranks that run ``argv`` in ``cwd``: their interpreter and its options, and their
        sys.path[0]. ``PreloadError`` (exit code 2) when ``argv`` cannot be forked (``fork_refusal``)."""
        try:
            command = parse_python_argv(argv)
        except NotForkable as err:
            raise PreloadError(f"--preload: the ranks' command cannot be forked: {err}") from None
        refusal = fork_refusal(command, command.python, ("-u",))
        if refusal is not None:
            raise PreloadError(f"--preload: the ranks' command cannot be forked: {refusal}")
        return cls.start(modules, python=command.python, options=command.options, env=env, cwd=cwd,
                         path0=path0(command, cwd))

    def fileno(self) -> int:
        """Readable while it imports (it says each module) and once it is gone (it never speaks unasked after it is
        ready): watch it in an event loop, then ``poll_ready`` or ``gone``."""
        return self._sock.fileno()

    def wait_ready(self, timeout: float | None = None) -> wire.Ready:
        """Wait until every module is imported. ``PreloadError`` (exit code 2) when one cannot be preloaded, the
        helper died while importing, or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ready is None:
            if not self._readable(deadline):
                self._kill()
                raise PreloadError(f"--preload: the helper took over {timeout:g} s{self._where()}",
                                   module=self._importing)
            self._hear()
        return self.ready

    def poll_ready(self) -> wire.Ready | None:
        """``wait_ready`` without waiting: what the helper said so far (call it when ``fileno`` is readable)."""
        while self.ready is None and self._readable(time.monotonic()):
            self._hear()
        return self.ready

    def _hear(self) -> None:
        """One word of the helper while it imports (``PreloadError`` as ``wait_ready`` says)."""
        try:
            message, _ = wire.recv(self._sock)
        except (wire.Gone, wire.ProtocolError):
            raise PreloadError(f"--preload: the helper (pid {self.pid}) {self.lost()}{self._where()}",
                               module=self._importing) from None
        if isinstance(message, wire.Importing):
            self._importing = message.module
        elif isinstance(message, wire.Refused):
            self.lost()
            raise PreloadError(message.message, module=self._importing)
        elif isinstance(message, wire.Ready):
            self.ready = message
        else:
            self._kill()
            raise PreloadError(f"--preload: the helper said {message} before it was ready")

    def gone(self) -> str | None:
        """How the helper ended, if it did (``was killed by SIGKILL``); None while it is there to fork from."""
        if self._gone is None and self.ready is not None and self._readable(time.monotonic()):
            self.lost()
        return self._gone

    def fork(self, argv: Sequence[str], env: Mapping[str, str], *, cwd: str, cpus: frozenset[int] | None,
             stdout: int, stderr: int, memory_node: int | None = None) -> ForkedRank:
        """Fork a rank as ``Popen(argv, env=env, cwd=cwd)`` would start it, bound to ``cpus`` (and its memory to
        ``memory_node``, as ``numactl --membind``), with ``stdout`` and ``stderr`` as its fds 1 and 2 (the caller
        keeps its own copies). ``NotForkable`` (a ValueError), ``HelperGone`` or ``ForkFailed`` (OSErrors) when it
        cannot."""
        order = wire.ForkOrder(tuple(argv), dict(env), cwd, tuple(sorted(cpus)) if cpus is not None else None,
                               ignored_signals(), memory_node)
        refusal = fork_refusal(parse_python_argv(order.argv), self.python, self.options)
        if refusal is not None:
            raise NotForkable(refusal)
        if self._gone is not None or self.ready is None:
            raise HelperGone(f"the preload helper (pid {self.pid}) {self._gone or 'is not ready'}")
        hold, hold_end = os.pipe()
        try:
            reply = self._ask(order, (stdout, stderr, hold))
        except BaseException:
            os.close(hold_end)
            raise
        finally:
            os.close(hold)
        if isinstance(reply, wire.ForkFailed):
            os.close(hold_end)
            raise ForkFailed(reply.message)
        if not isinstance(reply, wire.Forked):
            os.close(hold_end)
            raise HelperGone(f"the preload helper (pid {self.pid}) answered {reply}")
        proc = read_proc(reply.pid)
        if proc is None or proc.ppid != os.getpid():  # then nobody could wait4 it: let it go
            os.close(hold_end)
            raise ForkFailed(f"the forked rank (pid {reply.pid}) is not the agent's child: the agent must be the "
                             "ranks' child subreaper while it forks them")
        return ForkedRank(reply.pid, hold_end)

    def _ask(self, order: wire.ForkOrder, fds: tuple[int, int, int]) -> wire.Message:
        try:
            wire.send(self._sock, order, fds)
            if not self._readable(time.monotonic() + FORK_TIMEOUT):
                self._kill()
                raise HelperGone(f"the preload helper (pid {self.pid}) did not answer a fork in {FORK_TIMEOUT:g} s")
            return wire.recv(self._sock)[0]
        except (OSError, wire.Gone, wire.ProtocolError) as err:
            if isinstance(err, HelperGone):
                raise
            raise HelperGone(f"the preload helper (pid {self.pid}) {self.lost()}") from None

    def lost(self) -> str:
        """The helper is gone (or going): reap it; how it ended, in words (``exited with code 0``)."""
        if self._gone is None:
            try:
                code = self._proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                self._kill()
                code = self._proc.returncode
            self._gone = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return self._gone

    def close(self) -> None:
        """Stop the helper: the end of file on its socket makes it exit; SIGKILL after ``STOP_WAIT``."""
        self._sock.close()
        self.lost()

    def _kill(self) -> None:
        try:
            self._proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()

    def _readable(self, deadline: float | None) -> bool:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        return bool(select.select([self._sock], [], [], timeout)[0])

    def _where(self) -> str:
        return f" while importing {self._importing!r}" if self._importing else ""


def ignored_signals() -> tuple[int, ...]:
    """The signals this process ignores that a rank started by Popen would inherit ignored (exec keeps SIG_IGN;
    Popen's restore_signals gives SIGPIPE and SIGXFSZ back their default first)."""
    skip = {signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ}
    return tuple(int(s) for s in signal.valid_signals() if s not in skip and _ignored(s))


def _ignored(signum: int) -> bool:
    try:
        return signal.getsignal(signum) == signal.SIG_IGN
    except ValueError:
        return False
