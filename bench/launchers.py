"""The launchers under test, as data: how each turns one local job into an argv, and whether it is installed.

The floor is what any launcher must at least do: a shell that starts N ``python SCRIPT`` with the rank
variables set and waits for them. xrun, torchrun and deepspeed are found on PATH; a missing one is skipped
with a reason, never installed by the bench.
"""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalJob:
    """N ranks of ``python SCRIPT ARGS`` on this machine."""

    nproc: int
    script: str
    args: tuple[str, ...]
    master_port: int
    log_dir: str | None = None  # per-rank log files, where the launcher has them
    prefix: bool = True  # per-line rank prefixes on the console, where the launcher has them
    xrun_flags: tuple[str, ...] = ()  # xrun's own options for a variant of it (``xrun:no_stacks``)
    dedupe: bool = True  # identical lines of several ranks shown once, where the launcher does it (xrun)


@dataclass(frozen=True)
class Launcher:
    name: str
    label: str  # what the report prints
    argv: Callable[[LocalJob], list[str]]
    missing: Callable[[], str | None]  # None when usable, else why not

    def available(self) -> str | None:
        return self.missing()


# ---------------------------------------------------------------------------------------------------------------
# The floor: bash, `&`, `wait`.


def floor_argv(job: LocalJob, *, own_sessions: bool = False) -> list[str]:
    """``own_sessions``: each rank in a session of its own (``setsid``), as xrun's ranks are. Where the kernel
    schedules by session (autogroup, on by default on desktop kernels and these machines), the ranks of one session
    share one slice of the CPU against everything else running, so on a busy machine the plain floor is slower."""
    py, script = shlex.quote(sys.executable), shlex.quote(job.script)
    if own_sessions:
        py = f"setsid {py}"  # bash without job control: no process group leader, so setsid execs in place
    args = " ".join(shlex.quote(a) for a in job.args)
    body = (
        f"rc=0; pids=; for i in $(seq 0 {job.nproc - 1}); do "
        f"RANK=$i LOCAL_RANK=$i WORLD_SIZE={job.nproc} LOCAL_WORLD_SIZE={job.nproc} "
        f'MASTER_ADDR=127.0.0.1 MASTER_PORT={job.master_port} {py} {script} {args} & pids="$pids $!"; done; '
        'for p in $pids; do wait "$p" || rc=$?; done; exit $rc'
    )
    return ["bash", "-c", body]


# The Python floor: the least a launcher written in Python can do (one interpreter, Popen N ranks, wait).
# It is not a launcher anyone should use; it shows how much of a Python launcher's cost is the interpreter.

_PYFLOOR = """\
import os, subprocess, sys
n, port, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
procs = []
for i in range(n):
    env = dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    procs.append(subprocess.Popen([sys.executable] + argv, env=env))
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""


def pyfloor_argv(job: LocalJob) -> list[str]:
    return [sys.executable, "-c", _PYFLOOR, str(job.nproc), str(job.master_port), job.script, *job.args]


# ---------------------------------------------------------------------------------------------------------------
# xrun


@functools.cache
def _help_text(exe: str) -> str | None:
    try:
        done = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout + done.stderr if done.returncode == 0 else None


def _missing_exe(exe: str) -> Callable[[], str | None]:
    def check() -> str | None:
        path = shutil.which(exe)
        if path is None:
            return f"{exe} not on PATH"
        if _help_text(path) is None:
            return f"`{exe} --help` failed"
        return None

    return check


def xrun_help() -> str | None:
    path = shutil.which("xrun")
    return _help_text(path) if path else None


def xrun_supports(flag: str) -> bool:
    return flag in (xrun_help() or "")


def xrun_argv(job: LocalJob) -> list[str]:
    argv = ["xrun", "--num_gpus", str(job.nproc)]
    if xrun_supports("--master_port"):  # others on this machine may hold 29500
        argv += ["--master_port", str(job.master_port)]
    if job.log_dir:
        argv += ["--log_dir", job.log_dir]
    if not job.prefix:
        argv.append("--no_prefix")
    if not job.dedupe and xrun_supports("--no_dedupe"):
        argv.append("--no_dedupe")
    return [*argv, *job.xrun_flags, job.script, *job.args]


# ---------------------------------------------------------------------------------------------------------------
# The peers


def torchrun_argv(job: LocalJob) -> list[str]:
    argv = ["torchrun", "--standalone", "--nproc_per_node", str(job.nproc)]
    if job.log_dir:  # torchrun's nearest equivalent of prefixes + log files: --log-dir with --tee 3
        argv += ["--log-dir", job.log_dir, "--tee", "3"]
    return [*argv, job.script, *job.args]


def deepspeed_argv(job: LocalJob) -> list[str]:
    argv = ["deepspeed", "--num_gpus", str(job.nproc), "--master_port", str(job.master_port)]
    if job.log_dir:
        argv += ["--enable_each_rank_log", job.log_dir]
    return [*argv, job.script, *job.args]


LAUNCHERS: dict[str, Launcher] = {
    launcher.name: launcher
    for launcher in (
        Launcher("floor", "floor (bash & wait)", floor_argv, lambda: None if shutil.which("bash") else "no bash"),
        Launcher("pyfloor", "python floor (Popen & wait)", pyfloor_argv, lambda: None),
        Launcher("xrun", "xrun", xrun_argv, _missing_exe("xrun")),
        Launcher("torchrun", "torchrun --standalone", torchrun_argv, _missing_exe("torchrun")),
        Launcher("deepspeed", "deepspeed", deepspeed_argv, _missing_exe("deepspeed")),
    )
}


def get(name: str) -> Launcher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"unknown launcher {name!r}; known: {', '.join(LAUNCHERS)}") from None


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing torch here would cost seconds and memory)."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in ("xrun", "torch", "deepspeed", "psutil", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
