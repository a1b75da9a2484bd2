"""Starting one rank of a RankGroup (``xrun.launch.ranks.supervise``): its logs, its process in its own session
(bound to its cores when it has some), and its stdout and stderr pipes on the group's loop.

A rank that cannot start is not an exception: it ends at once with the shell's code and the reason as its output.
"""

from __future__ import annotations

import errno
import functools
import os
import selectors
import subprocess
import time

from xrun.launch.output.logfiles import open_logs
from xrun.launch.output.streams import Console, RankStream, grow_pipe, rank_prefix
from xrun.launch.ranks.processes import RankProcess
from xrun.launch.ranks.reaper import RankState


def spawn_rank(
    rank: RankState, affinity: frozenset[int] | None, *, host: str, log_dir: str | None
) -> tuple[int, int] | None:
    """Start ``rank`` (its ``popen``, ``pid`` and ``started`` set) and return its log fds (None: no --log_dir).
    One that cannot start keeps ``popen`` None, with ``start_error`` and ``returncode`` saying why."""
    logs: tuple[int, int] | None = None
    try:
        if log_dir is not None:
            logs = open_logs(log_dir, host, rank.spec.rank)
        popen = _spawn(rank.spec, affinity)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in argv or env
        for fd in logs or ():
            os.close(fd)
        rank.start_error = f"xrun: cannot start rank {rank.spec.rank}: {err}"
        # The shell's conventions: 127 "command not found", 126 "found but cannot run".
        rank.returncode = 127 if getattr(err, "errno", None) == errno.ENOENT else 126
        return None
    rank.popen = popen
    rank.pid = popen.pid
    rank.started = time.monotonic()
    return logs


def watch_output(
    sel: selectors.BaseSelector,
    console: Console,
    rank: RankState,
    logs: tuple[int, int] | None,
    *,
    host: str,
    console_ranks: frozenset[int] | None,
) -> None:
    """Register the rank's stdout and stderr pipes with the loop, as ``RankStream``s of ``console``."""
    popen = rank.popen
    assert popen is not None and popen.stdout is not None and popen.stderr is not None
    prefix = rank_prefix(host, rank.spec.rank)
    for pipe, fd_no in ((popen.stdout, 1), (popen.stderr, 2)):
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        grow_pipe(fd)
        log = logs[fd_no - 1] if logs else None
        stream = RankStream(fd, fd_no, prefix, log=log, keep_tail=fd_no == 2, file=pipe, rank=rank.spec.rank)
        stream.echo = console_ranks is None or rank.spec.rank in console_ranks
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
