"""What must hold on a node before its ranks start: the interpreter, the program, the working directory, the log
directory and each rank's log files, the binding, the size of each rank's exec, and room for the ranks' open files
under the hard limit (``xrun.fdlimit``).

One check, two callers, so that a dry run that passes means the run starts (issue 12): the runner runs it
for a plan whose ranks all run on this machine (``xrun.runner.validate``, before ``--dry-run`` prints and before
a real run executes), and every agent runs it on its own node after it gets its spec, pod mode's once it joined
node 0 (``xrun.launch.session``). A finding is bad input, never a rank's failure (issue 33 §2): one line, exit
code 2, no rank started; the agent's machine sends it with its exit code, which ends the job with 2 on every node,
naming the host. Nothing here starts or imports the user's code: a module is found the way ``python -m``
would find it, without importing its packages.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from importlib.machinery import PathFinder
from importlib.util import find_spec

from xrun.common.network.interfaces import interface_names, resolvable
from xrun.common.network.socket_ifname import AUTO, NONE, check_interface_name
from xrun.common.output.logfiles import LogFileRefused, check_logs
from xrun.common.ranks.cpusets import plan_bindings
from xrun.common.spec import NodeSpec, PythonMode
from xrun.errors import UsageError, XrunError
from xrun.fdlimit import agent_open_files, check_open_files
from xrun.printable import shown

_PATH_MAX = 4096  # Linux
_MAX_ARG_STRLEN = 32 * 4096  # Linux: one argv or environment string with its NUL (include/uapi/linux/binfmts.h)
_POINTER = 8  # execve copies a pointer per string too
_BINPRM_BUF_SIZE = 256  # Linux: what exec reads of a file to tell its format (include/linux/binfmts.h)
_BINFMT_MISC = "/proc/sys/fs/binfmt_misc"
_LOG_FILE_ROOM = 300  # what the logs add below the directory: /<host, at most 253>/rank<N>/stderr.log


class PreflightError(XrunError):
    """A node cannot start its ranks as asked: ``what`` names the flag or argument."""

    def __init__(self, what: str, value: str, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        super().__init__(f"{what} {shown(value, limit=200)}: {reason}")


def check_node(python: str, mode: PythonMode, script: str, log_dir: str | None) -> None:
    """Raise ``PreflightError`` for the first thing that would stop this node's ranks from starting."""
    if mode is not PythonMode.NONE:
        _check_executable("--python", python)
        _check_exec_format("--python", python)
    if mode is PythonMode.SCRIPT:
        _check_script(script)
    elif mode is PythonMode.MODULE:
        if _is_this_python(python):  # another interpreter has another sys.path: its agent cannot tell either
            _check_module(script)
    else:
        _check_executable("--no_python program", script)
        _check_exec_format("--no_python program", script)
    if log_dir is not None:
        check_log_dir(log_dir)


def check_spec(spec: NodeSpec) -> None:
    """The agent's side: the spec's working directory entered (the script and module are found from there), the
    same checks read back from the ranks' argv (``rankplan.rank_argv`` wrote them), then ``check_ranks``."""
    if spec.cwd:
        _enter(spec.cwd)
    if not spec.ranks:
        return
    check_open_files(f"the node agent on {spec.host}", agent_open_files(len(spec.ranks)))
    if spec.options.network_interface not in (AUTO, NONE):  # before the barrier: the runner says it, exit 2
        check_interface_name(spec.host, spec.options.network_interface, interface_names())
    argv = spec.ranks[0].argv
    if len(argv) >= 3 and argv[1] == "-u" and os.path.basename(argv[0]).startswith("python"):
        module = len(argv) >= 4 and argv[2] == "-m"
        mode = PythonMode.MODULE if module else PythonMode.SCRIPT
        dashed = not module and len(argv) >= 4 and argv[2] == "--"  # a script named like an option: "-u -- -x.py"
        check_node(argv[0], mode, argv[3] if module or dashed else argv[2], spec.options.log_dir)
    else:
        check_node(argv[0], PythonMode.NONE, argv[0], spec.options.log_dir)
    check_ranks(spec)


def check_ranks(spec: NodeSpec) -> None:
    """What only the node's spec tells: each rank's log files, the ranks' binding, torch for ``--elastic``, and
    each rank's exec size."""
    if spec.options.log_dir is not None:
        try:
            check_logs(spec.options.log_dir, spec.host, (rank.rank for rank in spec.ranks))
        except LogFileRefused as err:
            raise PreflightError("--log_dir", err.path, err.reason) from None
    env = {**os.environ, **spec.env}
    plan_bindings(spec, {**env, **spec.ranks[0].env})  # a BindingError: the binding the ranks would get fails
    if spec.elastic is not None and find_spec("torch") is None:
        raise PreflightError("--elastic", sys.executable, "cannot import torch here, and torch's elastic agent runs "
                                                          "the ranks; install torch on every node")
    if spec.elastic is not None and spec.elastic.rdzv_endpoint:
        check_endpoint(spec.host, spec.elastic.rdzv_endpoint)
    for rank in spec.ranks:
        _check_exec_size(rank.argv, {**env, **rank.env})


def check_endpoint(host: str, endpoint: str) -> None:
    """``--rdzv_endpoint``'s host resolves on this node (``host``): torch's c10d store retries a name that does not
    for its whole ``read_timeout`` and then dies in C++ with its stack on the console (issue 37 §3). Checked on
    every node, where torch will look the name up, not on the head: a name only the nodes resolve is fine."""
    # lazy: the rendezvous's module and the rank plan under it (~3 ms of imports, python -X importtime) are read only
    # for --elastic's endpoint, not by every agent's preflight (issue 38)
    from xrun.common.rdzv import parse_endpoint

    name, _ = parse_endpoint(endpoint)
    try:
        socket.getaddrinfo(resolvable(name), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        why = (err.strerror if isinstance(err, OSError) and err.strerror else str(err)) or type(err).__name__
        raise PreflightError("--rdzv_endpoint", endpoint, f"the host {shown(name)} does not resolve on {host} "
                             f"({why}); give a name or address of the node that hosts the store that every node "
                             "resolves, or leave --rdzv_endpoint out to use the master address") from None


def _enter(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError as err:
        raise PreflightError("working directory", cwd, f"{(err.strerror or str(err)).lower()} on this node; xrun "
                             "runs the ranks in the directory it was started in: make it on every node, or start "
                             "xrun in one that every node has") from None


def _check_exec_size(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """What ``execve`` refuses with E2BIG: one string of argv or the environment past ``MAX_ARG_STRLEN``, or all
    of them (with their pointers) past ``ARG_MAX`` (only when they alone are over it: the ranks get a few more)."""
    named = [("argument", text, text) for text in argv] + [
        ("environment variable", key, f"{key}={value}") for key, value in env.items()]
    sizes = [len(os.fsencode(text)) + 1 for _, _, text in named]
    for (what, name, _), size in zip(named, sizes):
        if size > _MAX_ARG_STRLEN:
            raise PreflightError(what, name, f"is {size - 1:,} bytes, over the {_MAX_ARG_STRLEN - 1:,} that exec "
                                             "takes in one string; pass it in a file instead")
    total, limit = sum(sizes) + _POINTER * len(sizes), os.sysconf("SC_ARG_MAX")
    if total > limit:
        raise PreflightError("the ranks' command line and environment", f"{len(sizes)} strings",
                             f"{total:,} bytes are over exec's limit of {limit:,} (ARG_MAX: a quarter of ulimit -s); "
                             "export fewer or smaller variables")


def _check_executable(what: str, program: str) -> None:
    if shutil.which(program) is None:  # a bare name is looked up on PATH, as exec does
        raise PreflightError(what, program, "is not an executable file (or not on PATH)")


def _check_exec_format(what: str, program: str) -> None:
    """What exec says of a file it found and may execute, as the kernel reads its first bytes: a ``#!`` line
    naming an interpreter that is not there fails with ENOENT (every rank reported the program itself as missing,
    code 127; a script saved with Windows line ends names ``/bin/sh\\r``), a file that is neither a script nor a
    binary with ENOEXEC (code 126)."""
    try:
        with open(shutil.which(program) or program, "rb") as handle:
            head = handle.read(_BINPRM_BUF_SIZE)
    except OSError:
        return  # not readable: exec says so itself (a setuid binary may be executable and unreadable)
    if head.startswith(b"#!"):
        # the kernel's parse: blanks, then the name up to a blank or the line end; a \r is part of the name
        words = re.split(rb"[ \t]+", head[2:].split(b"\n", 1)[0].lstrip(b" \t"), maxsplit=1)
        interpreter = os.fsdecode(words[0])
        if interpreter.endswith("\r"):
            raise PreflightError(what, program, f"has Windows line ends: its #! line names {interpreter!r}; "
                                                "convert it (dos2unix, or sed -i 's/\\r$//')")
        if not (os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)):  # not looked up on PATH
            raise PreflightError(what, program, f"its #! interpreter {interpreter!r} is not an executable file")
    elif not head.startswith(b"\x7fELF") and not _other_formats():
        raise PreflightError(what, program, "is neither a binary nor a script with a #! line, so exec cannot run "
                                            "it; begin it with one (#!/bin/sh)")


def _other_formats() -> bool:
    """binfmt_misc handlers are registered (qemu, wine, java...): a file of another format may run after all."""
    try:
        return bool(set(os.listdir(_BINFMT_MISC)) - {"register", "status"})
    except OSError:
        return False


def _check_script(script: str) -> None:
    if os.path.isdir(script):  # python runs a directory (or a zipapp) by its __main__.py
        if not os.path.isfile(os.path.join(script, "__main__.py")):
            raise PreflightError("SCRIPT", script, "is a directory without __main__.py; name the script in it")
    elif not os.path.isfile(script):
        raise PreflightError("SCRIPT", script, f"no such file in {os.getcwd()}")
    elif not os.access(script, os.R_OK):  # python would start, then fail with its own code 2 in every rank
        raise PreflightError("SCRIPT", script, "is not readable (permission denied); chmod +r it")


def _check_module(name: str) -> None:
    """``python -m name`` would find it: each dotted part found by the path finder, no package imported."""
    path = [os.getcwd(), *sys.path]  # python -m puts the working directory first
    parts = name.split(".")
    for depth, part in enumerate(parts):
        if not part.isidentifier():
            raise PreflightError("--module", name, "is not a module name")
        if depth == 0 and part in sys.builtin_module_names:  # not on sys.path: 'python -m sys' is fine
            return
        spec = PathFinder.find_spec(part, path)
        if spec is None:
            raise PreflightError("--module", name, f"no module {'.'.join(parts[: depth + 1])!r} on sys.path")
        path = list(spec.submodule_search_locations or [])
        if depth < len(parts) - 1 and not path:
            raise PreflightError("--module", name, f"{'.'.join(parts[: depth + 1])!r} is not a package")
    if path and PathFinder.find_spec("__main__", path) is None:  # python -m PACKAGE runs PACKAGE.__main__
        raise PreflightError("--module", name, "is a package without __main__.py; name the module in it to run")


def _is_this_python(python: str) -> bool:
    found = shutil.which(python)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def check_log_dir(path: str) -> None:
    """``path`` is (or can be made) a writable directory; what this creates to find out, it removes.

    Every node's agent runs this at once on a shared filesystem, each making and removing what is missing: what a
    path is gets decided by ``mkdir`` itself (``_made``), never by a look before it, which another agent's
    directory, made or removed in between, would make wrong (a directory seen as "not a directory")."""
    if len(os.fsencode(os.path.abspath(path))) > _PATH_MAX - _LOG_FILE_ROOM:
        raise UsageError("--log_dir", f"{shown(path)} is too long for the log files under it "
                         f"(at most {_PATH_MAX - _LOG_FILE_ROOM} bytes)")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError("--log_dir", f"{shown(path)} is not writable")
        return
    missing = _missing_dirs(os.path.abspath(path))
    created: list[str] = []
    try:
        for directory in missing:
            if _made(directory, shown(path if directory == missing[-1] else _as_typed(directory, path))):
                created.append(directory)
    except OSError as err:
        reason = "path too long" if err.errno == errno.ENAMETOOLONG else err.strerror or str(err)
        raise UsageError("--log_dir", f"cannot create {shown(path)}: {reason}") from None
    finally:
        for directory in reversed(created):
            try:
                os.rmdir(directory)
            except OSError:  # another agent's files are in it already, or it removed it: either way, leave it
                pass


def _as_typed(directory: str, path: str) -> str:
    """An ancestor of ``path`` (absolute) as the user would name it: relative where ``path`` was."""
    return directory if os.path.isabs(path) else os.path.relpath(directory)


_MKDIR_TRIES = 5  # another node's agent may make and remove the same directory meanwhile, each time


def _made(directory: str, named: str) -> bool:
    """Make ``directory``: True if this call made it, False if it is one already (another node's agent made it
    just now: not ours to remove). Something else by that name is a ``UsageError`` naming it as ``named``."""
    for _ in range(_MKDIR_TRIES):
        try:
            os.mkdir(directory)
            return True
        except FileExistsError:
            if os.path.isdir(directory):
                return False
            if os.path.lexists(directory):  # a file, or a link to nothing
                raise UsageError("--log_dir", f"{named} exists and is not a directory") from None
            # it was there at mkdir and is gone now: another agent removed what it had made; try again
    os.mkdir(directory)  # the last try: what it raises is the caller's
    return True


def _missing_dirs(path: str) -> list[str]:
    """``path`` and each missing ancestor, outermost first (a loop: a 2000-level path must not recurse)."""
    missing = [path]
    parent = os.path.dirname(path)
    while parent != missing[-1] and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing[::-1]
