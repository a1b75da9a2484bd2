"""What a fork of the preload helper does to become the rank it was forked for, as ``python`` started for that
rank would be (docs/preload.md lists what is the same and the little that cannot be).

In order: its own session and process group; its command line and environment on ``/proc`` (``ps`` shows the
rank, xrun.launch.preload.kernel); the signal dispositions a fresh ``python`` has; its stdio on the agent's pipes
(stdin on /dev/null); then it waits until the agent has taken it on (its pid watched, the watchdog told): an end of
file instead means the agent or the order is gone, and it leaves before running anything. Then the environment
(``os.environ`` and the C library's), working directory and CPU affinity; the interpreter's view (``sys.argv``,
``sys.orig_argv``, ``sys.path`` with its own ``sys.path[0]`` and ``PYTHONPATH``, fresh ``sys.stdin``/``stdout``/
``stderr`` with ``-u`` honoured, ``PYTHONUNBUFFERED``, ``PYTHONDONTWRITEBYTECODE`` and ``PYTHONFAULTHANDLER`` read
from its environment, a new ``__main__``); what the preloaded modules would have made of the rank's
own environment (torch's thread count from ``OMP_NUM_THREADS``); fresh random state (``random`` reseeds itself at
fork; numpy's legacy global generator and torch's default generator are reseeded here, from the OS's entropy, as a
separate process would be); multiprocessing's per-process key and start directory; with telemetry (issue 31), what
the rank's own ``sitecustomize`` would do at start-up (xrun.launch.telemetry.site): its variables taken off the
environment first, its Flight Recorder served on its socket last (at once: torch.distributed is loaded when torch
is; the helper itself never serves). Then it runs the program:
a script (or a directory or zip archive), ``-m module`` (through runpy, as python does) or ``-c command``, and an
uncaught exception ends it as it would end python: the traceback without the helper's frames, exit code 1,
SIGINT's own death after a KeyboardInterrupt, SystemExit's code.
"""

from __future__ import annotations

import builtins
import faulthandler
import gc
import importlib.machinery
import io
import os
import runpy
import signal
import socket
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xrun.common.preload.argv import Mode, PythonCommand, has_flag, is_archive_or_dir, parse_python_argv, path0
from xrun.launch.preload import kernel
from xrun.launch.preload.wire import ForkOrder
from xrun.launch.telemetry.site import sitecustomize as rank_telemetry

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch: OMP_NUM_THREADS, then MKL_NUM_THREADS wins


@dataclass(frozen=True)
class Startup:
    """What the helper's own start decided that a rank's must decide again from the rank's environment."""

    pythonpath: tuple[str, ...]  # the sys.path entries the helper's PYTHONPATH made (after sys.path[0])
    options: tuple[str, ...]  # the interpreter's options: -u and -B say what their variables would say
    torch_threads: int | None  # torch's thread count with no variable setting it (None: torch not loaded)
    own_modules: frozenset[str]  # the helper's own modules: a rank that imports xrun gets its own copy

    @classmethod
    def here(cls, options: tuple[str, ...], own_modules: frozenset[str]) -> Startup:
        """Read in the helper after its imports; ``options``: the interpreter options it was started with."""
        torch = sys.modules.get("torch")
        threads = None
        if torch is not None:
            threads = torch.get_num_threads()
            if any(os.environ.get(v) for v in _THREAD_VARIABLES):  # the helper's own setting, not the default
                threads = len(os.sched_getaffinity(0))
        pythonpath = tuple(pythonpath_entries(os.environ.get("PYTHONPATH", "")))
        return cls(pythonpath, options, threads, own_modules)


def pythonpath_entries(value: str) -> list[str]:
    """The sys.path entries ``PYTHONPATH`` makes (getpath: each made absolute, against the working directory)."""
    return _unique(os.path.abspath(p) for p in value.split(os.pathsep)) if value else []


def _unique(paths: object) -> list[str]:
    seen: set[str] = set()
    out = []
    for path in paths:  # type: ignore[attr-defined]
        if path not in seen:
            seen.add(path)
            out.append(path)
    return out


def become(order: ForkOrder, fds: tuple[int, ...], startup: Startup, sock: socket.socket) -> None:
    """Turn this fresh fork of the helper into the rank of ``order`` and run its program (see the module doc)."""
    stdout, stderr, hold = fds
    os.setsid()
    kernel.show_as(order.argv, dict(order.env))  # the helper said at start whether this works
    _reset_signals(order.ignored_signals)
    _take_stdio(stdout, stderr)
    os.close(sock.detach())
    if not _taken_on(hold):
        os._exit(1)
    os.environ.clear()
    os.environ.update(order.env)
    records_socket = rank_telemetry.take_back_environment()  # as the rank's sitecustomize would (issue 31)
    env = dict(os.environ)
    os.chdir(order.cwd)
    if order.cpus is not None:
        os.sched_setaffinity(0, order.cpus)
    if order.memory_node is not None:
        problem = kernel.bind_memory(order.memory_node)
        if problem is not None:  # as numactl does when it cannot: say so and do not run unbound
            print(f"xrun: cannot bind the rank's memory to NUMA node {order.memory_node}: {problem}", file=sys.stderr)
            os._exit(1)
    gc.enable()  # the helper kept it off (and froze what it imported: xrun.launch.preload.helper)
    command = parse_python_argv(order.argv)
    _interpreter(command, order.argv, env, startup)
    _fresh_state(env, startup)
    if records_socket:
        rank_telemetry.serve_once_distributed(records_socket)
    _run(command)


def _reset_signals(ignored: tuple[int, ...]) -> None:
    """A fresh python's dispositions: what the agent ignores stays ignored (exec keeps SIG_IGN), the rest is
    the default, then python's own start: SIGPIPE and SIGXFSZ ignored, SIGINT raises KeyboardInterrupt."""
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
        except (OSError, ValueError):  # the C library's own (32, 33)
            pass
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _take_stdio(stdout: int, stderr: int) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)  # what Popen's stdin=DEVNULL opens
    for fd, std in ((devnull, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, std)
    for fd in (devnull, stdout, stderr):
        if fd > 2:
            os.close(fd)


def _taken_on(hold: int) -> bool:
    """Wait until the agent has the rank under watch (one byte); an end of file says it never will."""
    try:
        said = os.read(hold, 1)
    except OSError:
        said = b""
    os.close(hold)
    return bool(said)


def _interpreter(command: PythonCommand, argv: tuple[str, ...], env: Mapping[str, str], startup: Startup) -> None:
    """``sys`` as the interpreter sets it up for ``command`` in the environment ``env``."""
    sys.orig_argv = list(argv)
    sys.argv = [{Mode.SCRIPT: command.target, Mode.MODULE: "-m", Mode.COMMAND: "-c"}[command.mode],
                *command.args]
    sys.path[:] = [path0(command, os.getcwd()), *_rank_path(env, startup)]
    sys.path_importer_cache.clear()
    for name in startup.own_modules:
        sys.modules.pop(name, None)
    _python_stdio(_said(startup, env, "u", "PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = _said(startup, env, "B", "PYTHONDONTWRITEBYTECODE")
    if env.get("PYTHONFAULTHANDLER") or "faulthandler" in sys._xoptions:
        faulthandler.enable()
    else:
        faulthandler.disable()
    process = sys.modules.get("multiprocessing.process")
    if process is not None:  # read at its import: in a fresh rank, that import is the rank's
        process.ORIGINAL_DIR = os.path.abspath(os.getcwd())  # type: ignore[attr-defined]
        process.current_process().authkey = os.urandom(32)


def _said(startup: Startup, env: Mapping[str, str], flag: str, variable: str) -> bool:
    """An interpreter setting that its option or its variable (set and not empty) turns on (ignored under -E)."""
    return has_flag(startup.options, flag) or (not sys.flags.ignore_environment and bool(env.get(variable)))


def _rank_path(env: Mapping[str, str], startup: Startup) -> list[str]:
    """sys.path after [0]: the rank's PYTHONPATH, then the rest as the helper has it (the standard library, site
    packages, and whatever the preloaded modules added)."""
    rest = sys.path[1 + len(startup.pythonpath) :]
    mine = pythonpath_entries(env.get("PYTHONPATH", ""))
    if tuple(mine) == startup.pythonpath:
        return [*mine, *rest]
    return _unique([*mine, *rest])


def _python_stdio(unbuffered: bool) -> None:
    """New sys.stdin, stdout and stderr over fds 0-2, made as python makes them (pylifecycle's create_stdio)."""
    old_out, old_in = sys.__stdout__ or sys.stdout, sys.__stdin__ or sys.stdin
    encoding = old_out.encoding if old_out is not None else "utf-8"
    errors_out = old_out.errors if old_out is not None else "strict"
    errors_in = old_in.errors if old_in is not None else "strict"
    sys.stdin = sys.__stdin__ = _stream(0, "<stdin>", False, unbuffered, encoding, errors_in)  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = _stream(1, "<stdout>", True, unbuffered, encoding, errors_out)  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = _stream(2, "<stderr>", True, unbuffered, encoding, "backslashreplace")  # type: ignore[misc]


def _stream(fd: int, name: str, write: bool, unbuffered: bool, encoding: str, errors: str | None) -> io.TextIOWrapper:
    buffer: Any
    if write and unbuffered:
        buffer = raw = io.FileIO(fd, "wb", closefd=False)
    else:
        buffer = open(fd, "wb" if write else "rb", -1, closefd=False)  # noqa: SIM115 - it is sys's
        raw = buffer.raw
    raw.name = name
    line_buffering = not unbuffered and (raw.isatty() or fd == 2)
    stream = io.TextIOWrapper(buffer, encoding, errors, "\n", line_buffering, unbuffered)
    stream.mode = "w" if write else "r"  # type: ignore[misc]
    return stream


def _fresh_state(env: Mapping[str, str], startup: Startup) -> None:
    """What the preloaded modules set up at import from the helper's environment and state, set up for this rank."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # the legacy global generator: fresh entropy, as at its import
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # CUDA's generators are made (and seeded) when CUDA starts: in the rank
        torch.set_num_threads(_torch_threads(env, startup.torch_threads or 1))


def _torch_threads(env: Mapping[str, str], default: int) -> int:
    """torch's intra-op thread count in a fresh process with ``env``: MKL_NUM_THREADS, else OMP_NUM_THREADS, else
    its default (no more than the CPUs this rank may use)."""
    for variable in reversed(_THREAD_VARIABLES):
        value = env.get(variable, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return min(default, len(os.sched_getaffinity(0)))


# -- running the program ----------------------------------------------------------------------------------------


def _run(command: PythonCommand) -> None:
    """Run the program as python would. An uncaught exception is shown as python shows it (the rank's own
    ``sys.excepthook``, this module's frames left out), then raised on to the interpreter's top level with the hook
    silenced, so that the interpreter ends as it ends any program: exit code 1, or SIGINT's own death after a
    KeyboardInterrupt, once threads are joined and atexit handlers have run. SystemExit goes up as it is."""
    try:
        _execute(command)
    except SystemExit:
        raise
    except BaseException as err:
        traceback = err.__traceback__
        while traceback is not None and traceback.tb_frame.f_code.co_filename == __file__:
            traceback = traceback.tb_next
        err.__traceback__ = traceback  # what python's hook prints, whatever it is given
        sys.last_type, sys.last_value, sys.last_traceback = type(err), err, traceback
        sys.excepthook(type(err), err, traceback)
        sys.excepthook = _shown_already
        raise


def _shown_already(*_: object) -> None:
    """The top level's excepthook after ``_run`` showed the exception itself."""


def _execute(command: PythonCommand) -> None:
    main = types.ModuleType("__main__")
    main.__loader__ = importlib.machinery.BuiltinImporter
    main.__annotations__ = {}
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    if command.mode is Mode.MODULE:
        runpy._run_module_as_main(command.target, alter_argv=True)  # type: ignore[attr-defined]
        return
    if command.mode is Mode.COMMAND:
        exec(compile(command.target, "<string>", "exec", dont_inherit=True), vars(main))  # noqa: S102 - the rank's
        return
    path = os.path.abspath(command.target)
    if is_archive_or_dir(path):  # its __main__.py, found through sys.path[0] (which is the path itself)
        runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as err:  # python's own words for it, and its exit code
        print(f"{command.python}: can't open file {path!r}: [Errno {err.errno}] {err.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    exec(compile(source, path, "exec", dont_inherit=True), vars(main))  # noqa: S102 - the rank's own program
