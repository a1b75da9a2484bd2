"""Starting one rank of a RankGroup (``xrun.launch.ranks.supervise``): its logs, its process in its own session
(bound to its cores when it has some), and its stdout and stderr pipes on the group's loop. The process is started
(``subprocess.Popen``), or forked from the preload helper (xrun.launch.preload.client) when the group has one: then
it waits, held, until the group lets it run (``RankState.held``).

A rank that cannot start is not an exception: it ends at once with the shell's code and the reason as its output.
"""

from __future__ import annotations

import errno
import functools
import os
import selectors
import subprocess
import time
from typing import IO, TYPE_CHECKING

from xrun.common.output.logfiles import FilteredLogs, open_logs
from xrun.common.output.streams import Console, RankStream, grow_pipe
from xrun.common.spec import LocalEcho
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.reaper import RankState

if TYPE_CHECKING:
    from xrun.launch.preload.client import ForkedRank, PreloadHelper


def spawn_rank(
    rank: RankState,
    affinity: frozenset[int] | None,
    *,
    host: str,
    log_dir: str | None,
    preload: PreloadHelper | None = None,
) -> tuple[int, int] | None:
    """Start ``rank`` (its ``pid``, ``pipes`` and ``started`` set; ``popen``, or ``held`` when forked from
    ``preload``) and return its log fds (None: no --log_dir). One that cannot start keeps ``pid`` 0, with
    ``start_error`` and ``returncode`` saying why."""
    logs: tuple[int, int] | None = None
    try:
        if log_dir is not None:
            logs = open_logs(log_dir, host, rank.spec.rank)
        if preload is None:
            rank.popen = _spawn(rank.spec, affinity)
            rank.pid = rank.popen.pid
            assert rank.popen.stdout is not None and rank.popen.stderr is not None
            rank.pipes = (rank.popen.stdout, rank.popen.stderr)
        else:
            rank.held, rank.pipes = _fork(rank.spec, preload)
            rank.pid = rank.held.pid
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in argv or env; a command the helper cannot fork
        for fd in logs or ():
            os.close(fd)
        how = "fork" if preload is not None else "start"
        rank.start_error = f"xrun: cannot {how} rank {rank.spec.rank}: {err}"
        # The shell's conventions: 127 "command not found", 126 "found but cannot run".
        rank.returncode = 127 if getattr(err, "errno", None) == errno.ENOENT else 126
        return None
    rank.started = time.monotonic()
    return logs


def watch_output(
    sel: selectors.BaseSelector,
    console: Console,
    rank: RankState,
    logs: tuple[int, int] | None,
    *,
    console_ranks: frozenset[int] | None,
    local_echo: LocalEcho,
    filtered: FilteredLogs | None = None,
) -> None:
    """Register the rank's stdout and stderr pipes with the loop, as ``RankStream``s of ``console``."""
    assert rank.pipes is not None
    for pipe, fd_no in zip(rank.pipes, (1, 2)):
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        grow_pipe(fd)
        log = logs[fd_no - 1] if logs else None
        stream = RankStream(fd, fd_no, log=log, keep_tail=fd_no == 2, file=pipe, rank=rank.spec.rank)
        stream.echo = ((console_ranks is None or rank.spec.rank in console_ranks)
                       and local_echo.echoes(rank.spec.local_rank, fd_no))
        if filtered is not None:  # torchrun's duplicate filters
            stream.copy = filtered.copy(fd_no)
        rank.streams.append(stream)
        sel.register(fd, selectors.EVENT_READ, functools.partial(console.read, stream))


def current_affinity() -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _spawn(spec: RankProcess, affinity: frozenset[int] | None) -> subprocess.Popen[bytes]:
    """Start one rank in its own session, its stdout and stderr on pipes, bound to ``spec.cpus`` if given."""
    if spec.cpus is not None:
        # The child inherits the calling thread's mask at fork; the agent is single-threaded, so setting our
        # own mask around Popen binds exactly this child, with no wrapper process.
        os.sched_setaffinity(0, spec.cpus)
    try:
        return subprocess.Popen(
            list(spec.argv),
            env=dict(spec.env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own session and group: killpg reaches its whole tree
            close_fds=True,
            bufsize=0,
        )
    finally:
        if spec.cpus is not None and affinity is not None:
            os.sched_setaffinity(0, affinity)


def _fork(spec: RankProcess, preload: PreloadHelper) -> tuple[ForkedRank, tuple[IO[bytes], IO[bytes]]]:
    """Fork one rank from the preload helper, its stdout and stderr on new pipes (read as Popen's are: unbuffered)."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        forked = preload.fork(spec.argv, spec.env, cwd=spec.cwd or os.getcwd(), cpus=spec.cpus,
                              memory_node=spec.memory_node, stdout=out_write, stderr=err_write)
    except BaseException:
        os.close(out_read)
        os.close(err_read)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    return forked, (open(out_read, "rb", buffering=0), open(err_read, "rb", buffering=0))  # noqa: SIM115 - the streams own them
