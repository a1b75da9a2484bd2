"""The prctl(2) calls of the preload helper and of a rank forked from it.

``show_as``: what ``/proc/PID/cmdline`` and ``/proc/PID/environ`` (so ``ps``, ``top``, psutil, and xrun's own
tests and benchmarks, which find processes by their environment) show for a forked rank. A fork keeps the
helper's argument and environment areas; ``PR_SET_MM_MAP`` points the kernel at new ones, the rank's exact
command line and environment, each NUL-terminated as exec would have laid them out. Unlike rewriting the old
area in place (setproctitle's way, which must fit the helper's own argv and leaves one space-joined string), the
rank's words come out one by one, whatever their length. It needs no privilege where the kernel has
``CONFIG_CHECKPOINT_RESTORE`` (every major distribution's; CRIU uses it the same way) and only changes what this
process reports about itself. ``PR_SET_NAME`` sets the short name (``comm``) that exec would have set.

``bind_memory``: what ``numactl --membind=NODE`` does before it executes a rank (``set_mempolicy(MPOL_BIND)``),
for a rank forked from the helper, which has no command of its own to prefix (``--bind_cores_to_rank``).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

_PR_SET_NAME = 15
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
_COMM_LEN = 15  # TASK_COMM_LEN - 1
# struct prctl_mm_map (linux/prctl.h): eleven u64 bounds, the auxv pointer, then auxv_size and exe_fd (u32 each)
_MM_MAP = struct.Struct("=11QQII")
_KEEP_EXE = 0xFFFFFFFF  # exe_fd -1: leave /proc/PID/exe alone (changing it needs CAP_SYS_ADMIN)
_MPOL_BIND = 2  # linux/mempolicy.h
# set_mempolicy(2) has no C library wrapper: its number where xrun runs (asm/unistd_64.h of each architecture)
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 270}

# The buffers the kernel now reads /proc/PID/cmdline and environ from: they must live as long as the process.
_shown: list[ctypes.Array[ctypes.c_char]] = []


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def show_as(argv: list[str] | tuple[str, ...], env: dict[str, str]) -> str | None:
    """Make this process show ``argv`` and ``env`` as its command line and environment, and ``argv[0]``'s base name
    as its name. None when done, else the kernel's refusal in words."""
    libc = _libc()
    libc.prctl(_PR_SET_NAME, os.path.basename(argv[0]).encode()[:_COMM_LEN], 0, 0, 0)
    args = _block(os.fsencode(a) for a in argv)
    environ = _block(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError as err:
        return f"cannot read /proc/self/stat: {err.strerror}"
    # proc(5), counted from field 3 (state), after the parenthesised name (which may hold anything)
    fields = stat[stat.rfind(b")") + 2 :].split()

    def field(n: int) -> int:
        return int(fields[n - 3])

    libc.sbrk.restype = ctypes.c_void_p
    brk = libc.sbrk(0) or field(47)
    a, e = ctypes.addressof(args), ctypes.addressof(environ)
    packed = _MM_MAP.pack(
        field(26), field(27), field(45), field(46), field(47), brk, field(28),
        a, a + len(args), e, e + len(environ), 0, 0, _KEEP_EXE,
    )  # fmt: skip
    mm_map = ctypes.create_string_buffer(packed, len(packed))
    if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, mm_map, len(packed), 0) != 0:
        return f"prctl(PR_SET_MM_MAP) refused: {os.strerror(ctypes.get_errno())}"
    _shown[:] = [args, environ]
    return None


def _block(words: Iterable[bytes]) -> ctypes.Array[ctypes.c_char]:
    data = b"".join(w + b"\0" for w in words)
    return ctypes.create_string_buffer(data, len(data))


def bind_memory(node: int) -> str | None:
    """Bind this process's future allocations to NUMA node ``node`` (``MPOL_BIND``); None when done, else why not."""
    number = _SET_MEMPOLICY.get(os.uname().machine)
    if number is None:
        return f"set_mempolicy's number on {os.uname().machine} is not known to xrun"
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    mask = (ctypes.c_ulong * (node // bits + 1))()
    mask[node // bits] = 1 << (node % bits)
    if _libc().syscall(number, _MPOL_BIND, mask, ctypes.c_ulong(len(mask) * bits + 1)) != 0:
        return f"set_mempolicy refused: {os.strerror(ctypes.get_errno())}"
    return None
