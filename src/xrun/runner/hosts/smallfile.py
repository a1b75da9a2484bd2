"""Reading the small files xrun is handed: hostfiles, env files, a platform's node lists, tokens.

One reader for all of them, because they share the same hazards: the path comes from an environment variable
or a flag (it may name a directory, a FIFO that blocks forever, or ``/dev/zero``), and the content is read
whole. So: regular files only, a size cap, UTF-8. Hostfiles and env files use ``read_regular_bytes`` and word
the OS's errors their own way. Symlinks are followed on purpose: Kubernetes mounts Secrets and ConfigMaps as
symlinks into a ``..data`` directory.
"""

from __future__ import annotations

import errno
import os
import stat

from xrun.errors import XrunError


class SmallFileError(XrunError):
    """A file that cannot be read as a small text file; ``missing`` tells an absent file from a bad one."""

    def __init__(self, path: str, reason: str, *, missing: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.missing = missing
        super().__init__(f"{path}: {reason}")


def read_small_file(path: str, *, limit: int) -> str:
    """The text of ``path``; ``SmallFileError`` if it is missing, not a regular file, over ``limit`` bytes or
    not UTF-8."""
    try:
        data = read_regular_bytes(path, limit=limit)
    except FileNotFoundError:
        raise SmallFileError(path, "no such file", missing=True) from None
    except IsADirectoryError:
        raise SmallFileError(path, "is not a regular file") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise SmallFileError(path, f"cannot open: {getattr(err, 'strerror', None) or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SmallFileError(path, f"is not UTF-8 text (byte {err.start})") from None


def read_regular_bytes(path: str, *, limit: int) -> bytes:
    """The bytes of the regular file ``path``, never blocking and never more than ``limit``.

    The open and read failures are ``OSError`` as the OS reports them (a directory: ``IsADirectoryError``), so
    that a caller words them its own way; a FIFO, a device or a file over ``limit`` is a ``SmallFileError``.
    """
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below refuses it anyway.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise SmallFileError(path, "is not a regular file")
        data = _read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SmallFileError(path, f"is larger than {limit} bytes; is it the right file?")
    return data


def _read_at_most(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    left = count
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
