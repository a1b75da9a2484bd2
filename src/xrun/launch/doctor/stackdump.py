"""Take the Python stacks of a node's live ranks with ``py-spy dump``, without stopping them (issue 14).

``dump_ranks`` starts one ``py-spy dump --pid PID --json`` per rank at once and waits for all of them against
one deadline (``budget`` seconds); a dump still running then is killed and that rank reported as "no stack in
time". The rank keeps running either way: py-spy reads its memory through ``process_vm_readv`` and pauses it
only for the few milliseconds a consistent sample takes. ``--nonblocking`` would skip that pause but may read a
stack halfway through a change and print frames that never existed together; for a diagnosis the pause is the
better trade. ``--native`` is not used: it unwinds C stacks with ptrace and stops the process far longer.

``stack_problem`` says in one line why no stack can be taken on this node at all (py-spy missing) and
``explain`` turns py-spy's own refusal (ptrace not permitted in a container) into what to grant. The hang
doctor runs ``dump_ranks`` on a thread (xrun.launch.doctor.background), so rank output keeps flowing while
py-spy works, and reads the ranks' collective records while py-spy's processes run (``meanwhile``). The stacks
as data are xrun.common.result.stacks', their merged view xrun.common.result.stackview's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence

from xrun.common.result.stacks import Frame, RankStack, ThreadStack
from xrun.launch import preload

# re-exported (``as``): these lived here before the agent's start path needed them without the rest
from xrun.launch.doctor.pyspy import EXITED as EXITED
from xrun.launch.doctor.pyspy import FAILURE_BUDGET as FAILURE_BUDGET
from xrun.launch.doctor.pyspy import PTRACE_HINT as PTRACE_HINT
from xrun.launch.doctor.pyspy import PYSPY as PYSPY
from xrun.launch.doctor.pyspy import PYSPY_ENV as PYSPY_ENV
from xrun.launch.doctor.pyspy import pyspy_path as pyspy_path
from xrun.launch.doctor.pyspy import stack_problem as stack_problem
from xrun.launch.procs.proctable import read_proc
from xrun.launch.ranks.supervise import DumpTarget

_PRELOAD = os.path.dirname(os.path.abspath(preload.__file__))


def explain(stderr: str) -> str:
    """py-spy's refusal in one line; a permission problem says what to grant."""
    text = " ".join(stderr.split())
    if "ermission" in text or "ptrace" in text.lower() or "Operation not permitted" in text:
        return f"no permission to read the process ({PTRACE_HINT})"
    return f"py-spy: {text[:200]}" if text else "py-spy printed nothing"


def dump_ranks(host: str, targets: Sequence[DumpTarget], *, budget: float, pyspy: str,
               meanwhile: Callable[[], object] | None = None) -> list[RankStack]:
    """Every target's stack, taken concurrently against one deadline ``budget`` seconds from now; ``meanwhile``
    runs while py-spy's processes work."""
    deadline = time.monotonic() + budget
    started = [(t, _start(pyspy, t.pid)) for t in targets]
    if meanwhile is not None:
        meanwhile()
    return [_collect(host, target, proc, deadline) for target, proc in started]


def _start(pyspy: str, pid: int) -> subprocess.Popen[str] | OSError:
    try:
        return subprocess.Popen(
            [pyspy, "dump", "--pid", str(pid), "--json"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", close_fds=True,
        )
    except OSError as err:
        return err


def _collect(host: str, target: DumpTarget, proc: subprocess.Popen[str] | OSError, deadline: float) -> RankStack:
    def failed(why: str) -> RankStack:
        return RankStack(host, target.rank, target.local_rank, target.pid, error=why)

    if isinstance(proc, OSError):
        return failed(f"cannot run py-spy: {proc.strerror or proc}")
    try:
        out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return failed("no stack in time (py-spy did not finish within the budget)")
    if proc.returncode != 0:
        return failed(EXITED if has_exited(target.pid) else explain(err))
    try:
        threads = parse_dump(out)
    except ValueError as bad:
        return failed(f"py-spy printed something unexpected ({bad})")
    return RankStack(host, target.rank, target.local_rank, target.pid, threads)


def has_exited(pid: int) -> bool:
    """The process is gone or a zombie (py-spy then fails with a confusing "Failed to get process executable
    name"): it ended while its stack was being taken."""
    info = read_proc(pid)
    return info is None or not info.alive


def parse_dump(text: str) -> tuple[ThreadStack, ...]:
    """``py-spy dump --json``: a list of threads, frames innermost first; the main thread comes out first, the
    preload helper's frames below a forked rank's program left out (``_the_ranks_own``)."""
    try:
        data = json.loads(text)
        threads = [
            (t.get("thread_name") == "MainThread",
             ThreadStack(str(t.get("thread_name") or t.get("thread_id")),
                         _the_ranks_own(tuple(Frame(str(f["name"]), str(f["filename"]), int(f["line"]))
                                              for f in reversed(t["frames"])))))
            for t in data
        ]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(err.__class__.__name__) from None
    return tuple(stack for _, stack in sorted(threads, key=lambda pair: not pair[0]))


def _the_ranks_own(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """A rank forked from the preload helper (xrun.launch.preload) runs its program from the helper's own frames:
    its boot line (``<string>``) and the package's. Dropped, the stack reads as a started rank's does, and merges
    with one."""
    if not frames or frames[0].filename != "<string>":
        return frames
    ours = [i for i, frame in enumerate(frames) if os.path.dirname(frame.filename) == _PRELOAD]
    if not ours or ours[0] != 1 or ours != list(range(1, ours[-1] + 1)):
        return frames
    return frames[ours[-1] + 1 :]
