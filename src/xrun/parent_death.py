"""Dying with the parent: ``prctl(PR_SET_PDEATHSIG)`` (Linux), one helper for the head and the node.

The kernel sends a process a chosen signal when the thread that started it exits, ``kill -9`` included. Two
users: the head's engine backends (``mpirun``, ``srun``: the engine gets SIGTERM if xrun is SIGKILLed, so a
pending ``srun`` does not later start agents with no runner to talk to) and the node's preload helper (SIGKILL
when its agent dies). Shared by both layers; imports nothing of xrun.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

_PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(signum: int, parent: int) -> Callable[[], None] | None:
    """A call that makes its caller get ``signum`` when its parent dies; None where there is no prctl (not
    Linux). ``parent`` is the pid the caller's parent should have: one that died before the call (its child then
    has another parent, and no signal would ever come) gets the caller ``signum`` at once.

    The C library is looked up here, before any fork: the call itself only makes system calls, so it can be a
    ``preexec_fn`` (between fork and exec, where a threaded parent's child may not load a library)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between the fork and prctl
            os.kill(os.getpid(), signum)

    return arm
