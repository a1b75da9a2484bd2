"""The control channel's framing: length-prefixed JSON messages, decoded incrementally and strictly.

Frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON, an object with a ``"type"`` key.

Hostile input (issue 22): whatever bytes arrive, ``decode_body`` and ``FrameReader.feed`` return messages or
raise ``ChannelError``, nothing else, so a server that catches ``ChannelError`` per connection drops only that
connection. Refused: nesting deeper than ``MAX_DEPTH``, integers longer than ``MAX_INT_DIGITS``, NaN and the
infinities, anything that is not an object with a string ``type``. A peer that has not proven itself yet (a
``strict`` reader, see ``FrameReader.stranger``) must also send valid UTF-8 whose strings hold no lone
surrogate (``"\\ud800"`` would raise ``UnicodeEncodeError`` in the first check that encodes it); after its proof
the reader is ``trust``-ed and accepts the surrogates that carry a node's non-UTF-8 bytes (``surrogateescape``).
"""

from __future__ import annotations

import json
import math
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a spec with a large environment still fits; anything bigger is garbage
MAX_HELLO = 64 * 1024  # before authentication a peer may send only this much
READ_CHUNK = 65536  # what an agent's end asks of its socket per read (TLS or plain: xrun.channel.link)
MAX_DEPTH = 32  # the deepest real message (a spec: ranks -> rank -> env -> value) is 5 levels
MAX_INT_DIGITS = 40  # an int64 has 19 digits; longer ones cost quadratic time to convert on Python < 3.11

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


class _Refused(ValueError):
    """A parse hook's refusal (caught with json's own ValueError)."""


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} characters")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: JSON has no infinity
        raise _Refused("a number out of range")
    return value


def _parse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON")


def decode_body(body: bytes, *, strict: bool = False) -> Message:
    """One frame's body as a message; any other bytes raise ChannelError (see the module doc for ``strict``)."""
    try:
        text = body.decode("utf-8") if strict else body.decode("utf-8", "surrogatepass")
        msg = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _Refused as err:
        raise ChannelError(f"undecodable message ({err})") from None
    except (UnicodeError, ValueError, RecursionError) as err:  # RecursionError: json's own depth limit (~1000)
        raise ChannelError(f"undecodable message ({err.__class__.__name__})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ChannelError("message is not a JSON object with a 'type'")
    problem = shape_problem(msg, strict=strict)
    if problem:
        raise ChannelError(f"undecodable message ({problem})")
    return msg


def shape_problem(value: Any, *, strict: bool) -> str | None:
    """Why a decoded value is refused (too deep; with ``strict``, a string no encoder accepts), or None.

    Iterative, so a deep value cannot exhaust the stack here either.
    """
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH}"
        children = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in children:
            if strict and not (_encodable(key) and _encodable(child)):
                return "a string with a lone surrogate"
            if isinstance(child, (dict, list)):
                todo.append((child, depth + 1))
    return None


def _encodable(value: Any) -> bool:
    if not isinstance(value, str) or value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class FrameReader:
    """Incremental decoder: feed whatever ``recv`` returned, take complete messages out in order.

    ``limit`` caps one frame and ``strict`` refuses what only a trusted peer may send (see the module doc):
    a server reads a new connection with ``FrameReader.stranger()`` and calls ``trust()`` once the peer has
    proven itself; an agent does the same with a server it has not authenticated yet (pod mode's challenge).
    """

    # A server holds one reader per agent (10,000 in the control-plane scenario): slots, and no queue object
    # of its own (an empty deque is a 528-byte block) for the rare messages pushed back.
    __slots__ = ("limit", "strict", "_buffer", "_held")

    def __init__(self, limit: int = MAX_FRAME, *, strict: bool = False) -> None:
        self.limit = limit
        self.strict = strict
        self._buffer = bytearray()
        self._held: list[Message] | None = None  # pushed back by a blocking reader, returned before new ones

    @classmethod
    def stranger(cls) -> FrameReader:
        """A reader for a peer that has proven nothing yet: small frames, strict text."""
        return cls(MAX_HELLO, strict=True)

    def trust(self) -> None:
        """The peer has proven itself: full-size frames, and the surrogates that carry non-UTF-8 bytes."""
        self.limit = MAX_FRAME
        self.strict = False

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return (and consume) every message now complete."""
        out, self._held = self._held or [], None
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self.limit:
                raise ChannelError(f"frame of {size} bytes exceeds the {self.limit}-byte limit")
            if len(self._buffer) < HEADER.size + size:
                break
            body = bytes(self._buffer[HEADER.size : HEADER.size + size])
            del self._buffer[: HEADER.size + size]
            out.append(decode_body(body, strict=self.strict))
        return out

    def push_back(self, messages: list[Message]) -> None:
        """Keep messages that arrived together with the one a blocking reader wanted."""
        if messages:
            self._held = [*messages, *(self._held or [])]

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
