"""The control channel's framing: length-prefixed JSON messages, decoded incrementally and strictly.

Frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON, an object with a ``"type"`` key.
"""

from __future__ import annotations

import json
import socket
import struct
from collections import deque
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a spec with a large environment still fits; anything bigger is garbage
MAX_HELLO = 64 * 1024  # before authentication a peer may send only this much

Message = dict[str, Any]


class ChannelError(Exception):
    """The peer broke the protocol or went away; ``reason`` is one line for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(msg: Message) -> bytes:
    # surrogatepass: env values read with Python's surrogateescape (bytes that are not UTF-8) survive the trip.
    body = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise ChannelError(f"message {msg.get('type')!r} is {len(body)} bytes, over the {MAX_FRAME}-byte limit")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Message:
    try:
        msg = json.loads(body.decode("utf-8", "surrogatepass"))
    except (UnicodeError, ValueError) as err:
        raise ChannelError(f"undecodable message ({err.__class__.__name__})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ChannelError("message is not a JSON object with a 'type'")
    return msg


class FrameReader:
    """Incremental decoder: feed whatever ``recv`` returned, take complete messages out in order.

    ``limit`` caps one frame; the server lowers it to ``MAX_HELLO`` until the peer has authenticated.
    """

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._ready: deque[Message] = deque()

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return (and consume) every message now complete."""
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self.limit:
                raise ChannelError(f"frame of {size} bytes exceeds the {self.limit}-byte limit")
            if len(self._buffer) < HEADER.size + size:
                break
            body = bytes(self._buffer[HEADER.size : HEADER.size + size])
            del self._buffer[: HEADER.size + size]
            self._ready.append(decode_body(body))
        out = list(self._ready)
        self._ready.clear()
        return out

    def push_back(self, messages: list[Message]) -> None:
        """Keep messages that arrived together with the one a blocking reader wanted."""
        self._ready.extendleft(reversed(messages))

    @property
    def pending(self) -> int:
        return len(self._buffer)


# ---------------------------------------------------------------------------------------------------------------
# Blocking helpers for the agent's start-up phase (before the rank group's event loop runs).


def send(sock: socket.socket, msg: Message) -> None:
    sock.sendall(encode(msg))


def recv(sock: socket.socket, reader: FrameReader, *, timeout: float | None) -> Message:
    """The next message, blocking up to ``timeout`` seconds; EOF or timeout raises ChannelError."""
    sock.settimeout(timeout)
    try:
        data = b""
        while True:
            ready = reader.feed(data)
            if ready:
                reader.push_back(ready[1:])
                return ready[0]
            try:
                data = sock.recv(65536)
            except socket.timeout:
                raise ChannelError(f"no message within {timeout:g} s") from None
            except OSError as err:
                raise ChannelError(f"connection failed: {err.strerror or err}") from None
            if not data:
                raise ChannelError("connection closed by the peer")
    finally:
        sock.settimeout(None)
