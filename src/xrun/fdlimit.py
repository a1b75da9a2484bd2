"""The open-files limit (``RLIMIT_NOFILE``): raised at start, and checked against what the job will hold.

A login gives a process a soft limit of 1,024 open files on most distributions while the hard limit is far
higher (524,288 under systemd). The head holds a socket per node (the ssh backend also a TCP connection and a
paramiko wake-up pipe per host) and a node agent a pipe pair, a pidfd and two log files per rank, so with the
soft limit as it comes a ~1,000-node job dies of ``EMFILE`` half way through its start (issue 15).

Both entry points (``xrun`` and ``python -m xrun.launch``) therefore raise the soft limit to the hard one before
anything else; the ranks inherit it (a ``DataLoader`` sharing tensors through fds is glad of it, and a rank that
would have hit 1,024 fds failed anyway). Where the job needs more than even the hard limit allows, the head
(``xrun.runner.validate``, so ``--dry-run`` says it too) and every agent (``xrun.common.preflight``) end with one
line naming the number needed and how to raise the hard limit, before anything starts.

The estimates are upper bounds with room to spare, not a count: a job refused here would not have fit.
"""

from __future__ import annotations

import resource

from xrun.errors import XrunError

FDS_BASE = 64  # std streams, the selector, signal and watchdog pipes, listeners, modules being imported
FDS_PER_RANK = 6  # stdout and stderr pipes, a pidfd, two log files, and the pipe ends Popen holds briefly
FDS_PER_CHANNEL_NODE = 1  # the control channel's socket to the node's agent
_NR_OPEN = "/proc/sys/fs/nr_open"  # what an unlimited hard limit really allows (Linux)
HOW_TO_RAISE = ("raise the hard limit: 'ulimit -Hn {n}' as root, a 'nofile' line in /etc/security/limits.conf, "
                "LimitNOFILE={n} in a systemd unit, or --ulimit nofile={n}:{n} for a container")


class OpenFilesError(XrunError):
    """The job needs more open files than this process may ever hold (``needed`` > the hard ``limit``)."""

    def __init__(self, what: str, needed: int, limit: int) -> None:
        self.what = what
        self.needed = needed
        self.limit = limit
        super().__init__(f"{what} needs about {needed} open files, over the hard limit of {limit} "
                         f"(ulimit -Hn); {HOW_TO_RAISE.format(n=needed)}")


def agent_open_files(ranks: int) -> int:
    """What one node agent holds while ``ranks`` ranks run (plus the channel socket, in the base)."""
    return FDS_BASE + FDS_PER_RANK * ranks


def raise_open_files_limit() -> int:
    """Raise the soft limit to the hard one (once, at start); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _reachable(hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a seccomp'd or odd kernel: keep what we have; the check below still holds
            return soft
        return target
    return soft


def check_open_files(what: str, needed: int) -> None:
    """``OpenFilesError`` if ``needed`` fds cannot fit under the hard limit; else make sure the soft limit fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    limit = _reachable(hard)
    if needed > limit:
        raise OpenFilesError(what, needed, limit)
    raise_open_files_limit()


def _reachable(hard: int) -> int:
    """The highest soft limit the kernel accepts under ``hard``: an unlimited hard limit is capped at nr_open."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(_NR_OPEN, "rb") as handle:
            return int(handle.read().strip() or 0) or 1 << 20
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open
