"""xrun's telemetry inside a rank: the rank's collective records served on a Unix socket, with no code change.

xrun puts this directory first on every rank's ``PYTHONPATH`` (xrun.launch.telemetry.endpoints) with
``XRUN_TELEMETRY_SOCKET`` naming the rank's socket; Python's ``site`` imports ``sitecustomize`` at start-up, which
finds this file. It then leaves no trace a script could tell from plain ``python`` (docs/telemetry.md):

* it takes its variable and this directory off the environment and ``sys.path`` again, so the script, and every
  process it starts (multiprocessing's spawn, DataLoader workers, subprocesses), sees the ``PYTHONPATH`` xrun was
  given, unchanged;
* it runs the user's own ``sitecustomize`` (the next one on ``sys.path``), exactly as ``site`` would have;
* it imports nothing but what the interpreter has loaded already, and acts only once the script has imported
  ``torch.distributed`` (a one-shot import hook, removed when it fires): a script without torch pays a look at
  each module name it imports, nothing else.

Then, in the process that started (not in a forked child: one endpoint per rank), it starts torch's own
``_WorkerServer`` on the socket: a C++ thread that answers ``POST /handler/fr_trace_json`` (the Flight Recorder,
without the GIL) and ``dump_traceback``. The server logs one warning when it binds and more when it is shut down
or destroyed; the first is held back by raising c10's log level around the constructor (microseconds, at
import), the others never happen: the server is never shut down nor freed (the process's end stops its thread,
and xrun removes the socket's directory). Its socket's name goes when the interpreter exits, before it is
finalized (``_unlink_before_finalization`` says why). Whatever goes wrong, the rank goes on as if nothing had
been tried.

A rank forked from the preload helper (``--preload``, xrun.launch.preload.become) has no start-up of its own: the
helper's ran without these variables, so the helper never serves anything. The fork takes its rank's environment
and calls ``take_back_environment`` and ``serve_once_distributed`` itself (this module, imported by its package
name, runs nothing at import); torch being loaded already, its endpoint starts before the rank's program runs.

Python 3.7 and newer read this file; it must not import xrun (the rank's interpreter may not have it).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not loaded at start-up: importing it here would cost every rank ~5 ms
if TYPE_CHECKING:
    from typing import Any, Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOCKET_VARIABLE = "XRUN_TELEMETRY_SOCKET"
_TRIGGER = "torch.distributed"
_C10_ERROR = 2  # c10's FLAGS_caffe2_log_level: 0 info, 1 warning, 2 error


def take_back_environment() -> str | None:
    """This directory off ``PYTHONPATH`` and ``sys.path``, the socket's variable off the environment; returns it."""
    socket_path = os.environ.pop(_SOCKET_VARIABLE, None)
    value = os.environ.get("PYTHONPATH")
    if value == _HERE:
        del os.environ["PYTHONPATH"]
    elif value is not None and value.startswith(_HERE + os.pathsep):
        os.environ["PYTHONPATH"] = value[len(_HERE) + 1 :]
    while _HERE in sys.path:
        sys.path.remove(_HERE)
    sys.path_importer_cache.pop(_HERE, None)
    return socket_path


class _AfterImport:
    """A meta path finder that only watches for ``torch.distributed``: when its module has run, ``on_loaded``."""

    def __init__(self, on_loaded: Callable[[Any], None]) -> None:
        self._on_loaded = on_loaded

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _TRIGGER:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: Any) -> None:
            run(module)
            # the loader's own method again, and this finder gone: the hook fires once and leaves nothing behind
            del loader.exec_module
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                self._on_loaded(module)
            except Exception:  # noqa: S110 - telemetry must never change what the script sees
                pass

        loader.exec_module = exec_module
        return spec


def _c10_log_level() -> Any:
    """c10's log level (``FLAGS_caffe2_log_level`` of the loaded libc10), or None where it cannot be found."""
    import ctypes  # loaded already: torch itself uses it

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if line.rstrip().endswith("/libc10.so")}
    for path in paths:
        try:
            return ctypes.c_int.in_dll(ctypes.CDLL(path, mode=os.RTLD_NOLOAD), "FLAGS_caffe2_log_level")
        except (OSError, ValueError):
            continue
    return None


def _start_endpoint(socket_path: str) -> None:
    import ctypes

    torch = sys.modules["torch"]
    distributed = sys.modules[_TRIGGER]
    if not distributed.is_available():
        return
    level = _c10_log_level()
    if level is None:  # no way to keep its warning off the rank's stderr: no endpoint rather than noise
        return
    if os.path.exists(socket_path) and not _stale(socket_path):
        return  # another process of this rank serves it (a wrapper script's first python)
    saved = level.value
    level.value = max(saved, _C10_ERROR)
    try:
        server = torch._C._distributed_c10d._WorkerServer(socket_path)
    finally:
        level.value = saved
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))  # never freed: its destructor would print
    _unlink_before_finalization(socket_path)


_DRAIN_SECONDS = 0.05  # with the GIL free: a request accepted before the socket went away gets its answer


def _unlink_before_finalization(socket_path: str) -> None:
    """Take the socket away when the interpreter exits, and let the requests in flight finish, before it is
    finalized.

    A request that needs the GIL (``dump_traceback``) handled while the interpreter finalizes aborts the rank: its
    handler thread asks for the GIL, Python 3.11 ends such a thread with ``pthread_exit``, and the forced unwind
    is swallowed by the server's ``catch (...)`` ("FATAL: exception not rethrown", SIGABRT). The agent asks the
    ranks that still live for their stacks when another rank fails, so ranks ending together could all abort.
    ``atexit`` runs before finalization: once the socket's name is gone no request can reach the server (the
    agent hears "no endpoint"), and a short sleep gives the GIL to those already accepted. The server's own
    ``shutdown`` is no way out: it holds the GIL while it joins its threads, so a handler waiting for the GIL
    deadlocks it."""
    import atexit
    import time

    owner = os.getpid()

    def unlink() -> None:
        if os.getpid() != owner:  # a forked child that exits normally: the endpoint is its parent's
            return
        try:
            leave_records(socket_path)
        except Exception:  # noqa: S110 - telemetry must never change what the script sees
            pass
        try:
            os.unlink(socket_path)
        except OSError:
            return
        time.sleep(_DRAIN_SECONDS)

    atexit.register(unlink)


LAST_RECORDS_SUFFIX = ".last.json"  # rank<N>.sock -> rank<N>.last.json (xrun.launch.telemetry.endpoints)
_LAST_RECORDS_MOST = 10_000  # entries: a bigger buffer is not dumped at exit (~19 us an entry: 0.2 s at most)
_BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def last_records_path(socket_path: str) -> str:
    """Where a rank leaves its records at exit: beside its socket, in the same 0700 directory."""
    base = socket_path[: -len(".sock")] if socket_path.endswith(".sock") else socket_path
    return base + LAST_RECORDS_SUFFIX


def leave_records(socket_path: str) -> None:
    """The rank's Flight Recorder and the traceback it dies of (if any), written at exit before the socket goes
    (issue 37 §2): when gloo's timeout fails every waiting rank at once, the agent asks while they exit, finds
    their sockets gone, and reads this file instead. ``{"traceback": <faulthandler's format> | null,
    "flight_recorder": <fr_trace_json's answer>}``, mode 0600, written whole then renamed (the agent never reads
    half of it); the directory goes with the attempt. A rank killed by a signal, or that ends with
    ``os._exit``, leaves none. Costs the exiting rank ~20 ms for the default 1,000 entries."""
    torch = sys.modules.get("torch")
    if torch is None or _TRIGGER not in sys.modules:
        return
    for name in _BUFFER_VARIABLES:  # torch's order: the first one set counts
        value = os.environ.get(name)
        if value is not None:
            if not value.strip().isdigit() or int(value) > _LAST_RECORDS_MOST:
                return
            break
    dump = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    if isinstance(dump, str):
        dump = dump.encode("utf-8")
    import json  # loaded already: torch uses it

    body = b'{"traceback": ' + json.dumps(_exit_traceback()).encode("ascii") + b', "flight_recorder": ' + dump + b"}"
    path = last_records_path(socket_path)
    part = path + ".part"
    try:
        os.unlink(part)  # a process of this rank that died while writing it
    except OSError:
        pass
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(part, path)


def _exit_traceback() -> str | None:
    """The uncaught exception the interpreter is exiting with, as faulthandler writes a thread (innermost frame
    first), or None (a normal exit, ``sys.exit``)."""
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tb = getattr(error, "__traceback__", None)
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(f'  File "{code.co_filename}", line {tb.tb_lineno} in {code.co_name}')
        tb = tb.tb_next
    if not frames:
        return None
    return "Current thread 0x0 (most recent call first):\n" + "\n".join(reversed(frames)) + "\n"


def _stale(socket_path: str) -> bool:
    """Nobody listens on ``socket_path`` any more (a process of this rank that ended left it): it is removed."""
    import socket  # loaded already: torch.distributed uses it

    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(socket_path)
    except OSError:
        os.unlink(socket_path)
        return True
    finally:
        probe.close()
    return False


def serve_once_distributed(socket_path: str) -> None:
    """Serve this process's collective records on ``socket_path`` once ``torch.distributed`` is imported: at once
    where it is already (a rank forked from the preload helper, which imported torch for it), else when the
    script imports it."""
    owner = os.getpid()

    def on_loaded(_module: object) -> None:
        if os.getpid() == owner:  # a forked child (a DataLoader worker) shares its rank's endpoint
            _start_endpoint(socket_path)

    loaded = sys.modules.get(_TRIGGER)
    if loaded is None:
        sys.meta_path.insert(0, _AfterImport(on_loaded))
        return
    try:
        on_loaded(loaded)
    except Exception:  # noqa: S110 - telemetry must never change what the script sees
        pass


def _install() -> None:
    socket_path = take_back_environment()
    if socket_path:
        serve_once_distributed(socket_path)


def _chain_to_the_users_own() -> None:
    """The next ``sitecustomize`` on ``sys.path``, as ``site`` would have imported it: it takes this module's place
    in ``sys.modules``; where there is none, this import ends as ``site`` expects of a missing one."""
    del sys.modules[__name__]
    __import__("sitecustomize")  # none: its ImportError names "sitecustomize", which site passes over


if __name__ == "sitecustomize":  # site's import; the preload helper imports it by its package name instead
    _install()
    _chain_to_the_users_own()
