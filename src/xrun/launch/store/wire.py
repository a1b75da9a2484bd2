"""torch's c10d TCPStore wire protocol, as torch 2.13's client speaks it: the requests read, the answers written.

Pure: bytes in, ``Request`` out, and the encodings of the answers; no socket. The facts, checked against torch
2.13's client through a proxy (``tests/test_store.py`` runs the real client against this server):

* every integer is little-endian (torch writes its native order; every platform it ships on is little-endian);
  a string or a byte vector is a ``u64`` length, then the bytes;
* a request is one ``u8`` query type, then its fields; the client's first request on a connection is VALIDATE
  (``u32`` magic 0x3C85F7CE, no answer), then PING (``u32`` nonce, echoed);
* the client prefixes every key with ``/`` and strips it from LIST_KEYS' answer; GET is sent after a WAIT for its
  key; a blocking QUEUE_POP after a WAIT for the queue's name; a timed-out WAIT or BARRIER is followed by
  CANCEL_WAIT, answered WAIT_CANCELED (and a STOP_WAITING sent meanwhile is read first);
* a client made with ``use_libuv=False`` refuses the QUEUE_* calls itself ("not implemented on legacy TCPStore
  backend") and sends nothing; otherwise both clients send the same bytes.

Every byte is hostile: a length or a count over its bound is refused as soon as it is read (``ProtocolError``),
before any buffer is sized by it. The bounds are torch's own libuv server's (8 KiB keys, 8 MiB values, 128 Ki keys
a request), so a request torch's default server takes is taken here.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from enum import IntEnum

VALIDATION_MAGIC = 0x3C85F7CE
MAX_KEY_BYTES = 8 * 1024  # torch's MAX_STRING_LEN (TCPStoreLibUvBackend.cpp)
MAX_VALUE_BYTES = 8 * 1024 * 1024  # torch's MAX_PAYLOAD_LEN
_COMPACT_AFTER = 64 * 1024
MAX_KEYS = 128 * 1024  # torch's MAX_KEY_COUNT: keys in one CHECK, WAIT, MULTI_GET or MULTI_SET


class Query(IntEnum):
    """The query types, in the order of torch's ``QueryType`` (TCPStoreBackend.hpp): the byte is the index."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


# Answers of one byte: CHECK's CheckResponseType, WAIT's and BARRIER's WaitResponseType.
READY, NOT_READY = b"\x00", b"\x01"
STOP_WAITING, WAIT_CANCELED = b"\x00", b"\x01"


class ProtocolError(Exception):
    """What a connection sent is not a request: the connection is closed, nothing else is touched."""


@dataclass(frozen=True)
class Request:
    """One request: its query, its keys and values in the order sent, and its number (ADD's delta, BARRIER's
    world size, PING's nonce, VALIDATE's magic)."""

    query: Query
    keys: tuple[bytes, ...] = ()
    values: tuple[bytes, ...] = ()
    number: int = 0


Parse = Generator[None, None, Request]


class Reader:
    """The bytes a connection has sent and not yet consumed, read by a resumable parser.

    ``parse`` starts (or goes on with) one request: it returns the request once its last byte is here, else None,
    keeping its place, so a request that trickles in a byte at a time costs a step per arrival, not a new parse.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0  # where the request in progress begins
        self._pos = 0  # how far it has been read
        self._parse: Parse | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes held: the request in progress and whatever follows it."""
        return len(self._buf) - self._start

    def parse(self) -> Request | None:
        if self._parse is None:
            if self._pos >= len(self._buf):
                self._buf.clear()
                self._start = self._pos = 0
                return None
            self._parse = _request(self)
        try:
            next(self._parse)
        except StopIteration as done:
            self._parse = None
            self._start = self._pos
            if self._start > _COMPACT_AFTER:  # dropped in bulk, not per request: many small ones stay linear
                del self._buf[: self._start]
                self._start = self._pos = 0
            request: Request = done.value
            return request
        return None

    def take(self, n: int) -> Generator[None, None, bytes]:
        while len(self._buf) - self._pos < n:
            yield
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out


def _u8(r: Reader) -> Generator[None, None, int]:
    return (yield from r.take(1))[0]


def _u32(r: Reader) -> Generator[None, None, int]:
    value: int = struct.unpack("<I", (yield from r.take(4)))[0]
    return value


def _u64(r: Reader) -> Generator[None, None, int]:
    value: int = struct.unpack("<Q", (yield from r.take(8)))[0]
    return value


def _i64(r: Reader) -> Generator[None, None, int]:
    value: int = struct.unpack("<q", (yield from r.take(8)))[0]
    return value


def _sized(r: Reader, bound: int, what: str) -> Generator[None, None, bytes]:
    n = yield from _u64(r)
    if n > bound:
        raise ProtocolError(f"{what} of {n} bytes (at most {bound})")
    return (yield from r.take(n))


def _key(r: Reader) -> Generator[None, None, bytes]:
    return (yield from _sized(r, MAX_KEY_BYTES, "a key"))


def _value(r: Reader) -> Generator[None, None, bytes]:
    return (yield from _sized(r, MAX_VALUE_BYTES, "a value"))


def _count(r: Reader) -> Generator[None, None, int]:
    n = yield from _u64(r)
    if n > MAX_KEYS:
        raise ProtocolError(f"{n} keys in one request (at most {MAX_KEYS})")
    return n


def _keys(r: Reader) -> Generator[None, None, tuple[bytes, ...]]:
    n = yield from _count(r)
    keys = []
    for _ in range(n):
        keys.append((yield from _key(r)))
    return tuple(keys)


def _request(r: Reader) -> Parse:
    byte = yield from _u8(r)
    try:
        query = Query(byte)
    except ValueError:
        raise ProtocolError(f"unknown query type {byte}") from None
    if query is Query.VALIDATE:
        return Request(query, number=(yield from _u32(r)))
    if query is Query.PING:
        return Request(query, number=(yield from _u32(r)))
    if query in (Query.SET, Query.APPEND, Query.QUEUE_PUSH):
        key = yield from _key(r)
        return Request(query, (key,), ((yield from _value(r)),))
    if query is Query.COMPARE_SET:
        key = yield from _key(r)
        expected = yield from _value(r)
        return Request(query, (key,), (expected, (yield from _value(r))))
    if query in (Query.GET, Query.DELETE_KEY, Query.QUEUE_POP, Query.QUEUE_LEN):
        return Request(query, ((yield from _key(r)),))
    if query in (Query.ADD, Query.BARRIER):
        key = yield from _key(r)
        return Request(query, (key,), number=(yield from _i64(r)))
    if query in (Query.CHECK, Query.WAIT, Query.MULTI_GET):
        return Request(query, (yield from _keys(r)))
    if query is Query.MULTI_SET:
        return (yield from _multi_set(r))
    return Request(query)  # GETNUMKEYS, CANCEL_WAIT, LIST_KEYS: the query type alone


def _multi_set(r: Reader) -> Parse:
    n = yield from _count(r)
    keys, values = [], []
    for _ in range(n):
        keys.append((yield from _key(r)))
        values.append((yield from _value(r)))
    return Request(Query.MULTI_SET, tuple(keys), tuple(values))


# -- answers ----------------------------------------------------------------------------------------------------


def vector(data: bytes) -> bytes:
    """A byte vector or a string as torch's ``sendVector``/``sendString`` write it: ``u64`` length, the bytes."""
    return struct.pack("<Q", len(data)) + data


def i64(value: int) -> bytes:
    return struct.pack("<q", value)


def u32(value: int) -> bytes:
    return struct.pack("<I", value)
