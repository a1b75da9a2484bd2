"""Where py-spy is, and why no stack can be taken on a node (checked by xrun.launch.doctor.dumps when the doctor
first acts), and a failure's budget of a dump (an on-demand dump's is the spec's: the head waits for it too), which
the node doctor every agent loads at its start needs: kept apart from ``xrun.launch.doctor.stackdump``
(subprocess, threads, the stacks as data) (issue 25 §4: the agent's start path)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Mapping

PYSPY = "py-spy"
PYSPY_ENV = "XRUN_PYSPY"  # another py-spy binary than the one on PATH (tests, odd installs)
FAILURE_BUDGET = 2.0  # at the first failure the survivors wait for their stop: keep it short
EXITED = "exited before its stack was taken"  # py-spy failed because the rank had ended meanwhile (no diagnosis)
PTRACE_HINT = (
    "py-spy needs ptrace permission: run as the ranks' user with kernel.yama.ptrace_scope <= 1 "
    "(sysctl kernel.yama.ptrace_scope=0 for non-root), and in a container add the SYS_PTRACE capability "
    "(docker run --cap-add SYS_PTRACE; Kubernetes securityContext.capabilities.add: [SYS_PTRACE])"
)


def pyspy_path(environ: Mapping[str, str] = os.environ, scripts: str | None = None) -> str | None:
    """The py-spy to run: ``$XRUN_PYSPY``, else the one installed beside the agent's interpreter (``pip install
    py-spy`` in its environment puts it there), else the one on PATH; None when there is none.

    Beside the interpreter comes first because PATH often finds a version manager's shim (pyenv's is a bash
    script), whose start doubles the time a failure's stacks delay the stop (about 40 against 20 ms here).
    """
    if environ.get(PYSPY_ENV):
        return shutil.which(environ[PYSPY_ENV], path=environ.get("PATH"))
    for folder in _scripts_dirs(scripts):
        beside = os.path.join(folder, PYSPY)
        if os.access(beside, os.X_OK) and os.path.isfile(beside):
            return beside
    return shutil.which(PYSPY, path=environ.get("PATH"))


def _scripts_dirs(scripts: str | None) -> Iterator[str]:
    """Where the agent's environment installs scripts: the interpreter's own folder (a venv's or pyenv's ``bin``,
    checked without loading ``sysconfig``, which costs about 1 ms of every node's start), then sysconfig's
    scripts folder where that differs (a system Python's ``/usr/local/bin``)."""
    if scripts is not None:
        yield scripts
        return
    if sys.executable:
        yield os.path.dirname(sys.executable)
    import sysconfig  # lazy: only when py-spy is not beside the interpreter

    yield sysconfig.get_path("scripts")


def stack_problem(host: str, environ: Mapping[str, str] = os.environ, scripts: str | None = None) -> str | None:
    """Why no stack can be taken on this node at all, in one line with the fix; None when py-spy is there."""
    if pyspy_path(environ, scripts) is None:
        return (f"no stacks from {host}: py-spy is not installed there (pip install py-spy, in the environment "
                f"of the agent's python); the job goes on")
    return None
