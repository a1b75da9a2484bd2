"""The agent and its preload helper talk over a private Unix stream socket pair that nobody else holds (the
helper inherits its end; no other process gets either): frames of a 4-byte big-endian length and UTF-8 JSON with
a ``"type"``, and a fork order's file descriptors passed with the first bytes of its frame (SCM_RIGHTS).

agent -> helper: ``preload`` (the modules, the ``sys.path[0]`` to import them with), then ``fork`` orders.
helper -> agent: ``importing`` (before each module: a crash names it), then ``ready`` or ``refused`` (one line;
the helper then exits 2); for each order ``forked`` (the rank's pid) or ``fork_failed``. The helper says nothing
unasked after ``ready``, so its end turning readable means it is gone. A frame is bounded (``MAX_FRAME``: a
rank's whole command line and environment, as large as exec itself accepts, fit).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

MAX_FRAME = 8 << 20  # bytes of JSON; Linux's ARG_MAX (argv + environment of one exec) is 2 MiB by default
ORDER_FDS = 3  # a fork order's descriptors: the rank's stdout, its stderr, and the read end of its hold pipe
_HEADER = struct.Struct(">I")


class Gone(Exception):
    """The other end closed the socket (the process is gone or is going)."""


class ProtocolError(Exception):
    """A frame that is not what the protocol says: a bug on one side, not a user's mistake."""


@dataclass(frozen=True)
class Preload:
    modules: tuple[str, ...]
    path0: str  # sys.path[0] while importing them: the ranks' (their script's directory)
    options: tuple[str, ...]  # the interpreter options the helper was started with (sys.orig_argv is 3.10+)


@dataclass(frozen=True)
class Importing:
    module: str


@dataclass(frozen=True)
class Ready:
    pid: int
    seconds: float  # how long the imports took
    titles: str | None  # None: forked ranks show their own command line; else why they cannot


@dataclass(frozen=True)
class Refused:
    message: str  # one line: what cannot be preloaded and what to do


@dataclass(frozen=True)
class ForkOrder:
    """One rank to fork: what ``subprocess.Popen`` would be given to start it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    cpus: tuple[int, ...] | None  # its CPU affinity (None: the helper's)
    ignored_signals: tuple[int, ...]  # ignored in the agent: a started rank inherits them ignored, so does this
    memory_node: int | None = None  # the NUMA node its memory is bound to (None: the helper's policy)


@dataclass(frozen=True)
class Forked:
    pid: int


@dataclass(frozen=True)
class ForkFailed:
    message: str


Message = Union[Preload, Importing, Ready, Refused, ForkOrder, Forked, ForkFailed]
_KINDS: dict[str, type[Any]] = {
    "preload": Preload, "importing": Importing, "ready": Ready, "refused": Refused, "fork": ForkOrder,
    "forked": Forked, "fork_failed": ForkFailed,
}  # fmt: skip
_NAMES = {kind: name for name, kind in _KINDS.items()}


def send(sock: socket.socket, message: Message, fds: Sequence[int] = ()) -> None:
    """Send one frame; ``fds`` travel with its first bytes."""
    fields = {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping) else v
              for k, v in vars(message).items()}
    body = json.dumps({"type": _NAMES[type(message)], **fields}).encode("utf-8", "surrogateescape")
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"a {_NAMES[type(message)]} frame of {len(body)} bytes is over {MAX_FRAME}")
    header = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(body)
    else:
        sock.sendall(header + body)


def recv(sock: socket.socket, *, max_fds: int = 0) -> tuple[Message, list[int]]:
    """Read one frame and the descriptors that came with it (the caller owns them). ``Gone`` at EOF."""
    try:
        header, fds, flags, _ = socket.recv_fds(sock, _HEADER.size, max(max_fds, 1))
    except ConnectionResetError:
        raise Gone() from None
    try:
        if not header:
            raise Gone()
        if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
            raise ProtocolError(f"{len(fds)} descriptors sent, at most {max_fds} expected")
        header += _exactly(sock, _HEADER.size - len(header))
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ProtocolError(f"a frame of {size} bytes is over {MAX_FRAME}")
        return decode(_exactly(sock, size)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def decode(body: bytes) -> Message:
    """One frame's JSON as its message; ``ProtocolError`` for anything else."""
    try:
        data = json.loads(body.decode("utf-8", "surrogateescape"))
        kind = _KINDS[data.pop("type")]
        if kind is ForkOrder:
            data["argv"] = tuple(data["argv"])
            data["cpus"] = None if data["cpus"] is None else tuple(data["cpus"])
            data["ignored_signals"] = tuple(data["ignored_signals"])
        elif kind is Preload:
            data["modules"] = tuple(data["modules"])
            data["options"] = tuple(data["options"])
        message: Message = kind(**data)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ProtocolError(f"a malformed frame ({type(err).__name__}: {err})") from None
    return message


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        try:
            chunk = sock.recv(min(size, 1 << 20))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise Gone()
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
