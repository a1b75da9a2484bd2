"""What the store holds and how each request changes it: pure, requests in, answers out.

``Table.handle(conn, request)`` returns the answers it causes, each addressed to a connection (a SET answers the
clients whose WAIT it ends, not the one that sent it). It knows nothing of sockets: the server
(``server.py``) owns the connections and hands their requests here one at a time. Semantics follow torch 2.13's
libuv server (``TCPStoreLibUvBackend.cpp``), the default one, with two departures, both for a hostile client:
a request this table cannot serve (the store over its size bound, an ADD to a value that is no number, an answer
over its bound, a request before VALIDATE) raises ``Refused`` and costs the connection that sent it, where torch
would grow without bound or throw; and a COMPARE_SET on a missing key with a non-empty expected value wakes no
waiter (torch wakes them although the key is still missing).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable

from xrun.launch.store.wire import (
    NOT_READY,
    READY,
    STOP_WAITING,
    VALIDATION_MAGIC,
    WAIT_CANCELED,
    Query,
    Request,
    i64,
    u32,
    vector,
)

Answer = tuple[int, bytes]  # (connection, bytes to send it)
_ENTRY_COST = 64  # what a key costs beside its bytes, so a flood of empty keys counts too
_INT = re.compile(rb"\s*[+-]?\d+")  # what std::stoll reads: leading blanks, a sign, digits; the rest ignored
_I64 = (-(2**63), 2**63 - 1)


class Refused(Exception):
    """A request this store will not serve: the connection that sent it is closed."""


class Table:
    """The keys, the queues, and the connections waiting for keys."""

    def __init__(self, *, max_bytes: int, max_answer: int, max_waits: int = 1 << 20) -> None:
        self._max_bytes = max_bytes
        self._max_waits = max_waits  # (connection, key) pairs waited for, all connections together
        self._waits = 0
        self._max_answer = max_answer
        self._size = 0
        self._values: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        self._validated: set[int] = set()
        # key -> connections waiting for it, in arrival order (a dict: an ordered set); connection -> keys it waits for
        self._waiters: dict[bytes, dict[int, None]] = {}
        self._awaiting: dict[int, set[bytes]] = {}
        self._handlers: dict[Query, Callable[[int, Request], list[Answer]]] = {
            Query.VALIDATE: self._validate, Query.PING: self._ping, Query.SET: self._set,
            Query.COMPARE_SET: self._compare_set, Query.GET: self._get, Query.ADD: self._add,
            Query.CHECK: self._check, Query.WAIT: self._wait, Query.GETNUMKEYS: self._num_keys,
            Query.DELETE_KEY: self._delete, Query.APPEND: self._append, Query.MULTI_GET: self._multi_get,
            Query.MULTI_SET: self._multi_set, Query.CANCEL_WAIT: self._cancel_wait,
            Query.QUEUE_PUSH: self._queue_push, Query.QUEUE_POP: self._queue_pop, Query.QUEUE_LEN: self._queue_len,
            Query.LIST_KEYS: self._list_keys, Query.BARRIER: self._barrier,
        }

    @property
    def size(self) -> int:
        """Bytes held (keys, values, queued items, and a fixed cost per entry)."""
        return self._size

    def handle(self, conn: int, request: Request) -> list[Answer]:
        if conn not in self._validated and request.query is not Query.VALIDATE:
            raise Refused(f"{request.query.name} before VALIDATE")
        return self._handlers[request.query](conn, request)

    def forget(self, conn: int) -> None:
        """The connection is gone: it waits for nothing any more."""
        self._validated.discard(conn)
        self._clear_wait(conn)

    # -- the connection -----------------------------------------------------------------------------------------

    def _validate(self, conn: int, request: Request) -> list[Answer]:
        if conn in self._validated or request.number != VALIDATION_MAGIC:
            raise Refused("not a TCPStore client (validation)")
        self._validated.add(conn)
        return []

    def _ping(self, conn: int, request: Request) -> list[Answer]:
        return [(conn, u32(request.number))]

    # -- keys -----------------------------------------------------------------------------------------------------

    def _set(self, conn: int, request: Request) -> list[Answer]:
        self._put(request.keys[0], request.values[0])
        return self._wake(request.keys[0])

    def _compare_set(self, conn: int, request: Request) -> list[Answer]:
        key, (expected, desired) = request.keys[0], request.values
        current = self._values.get(key)
        if current is None and expected:
            return [(conn, vector(expected))]  # torch's answer: the expected value, though nothing is stored
        if current is None or current == expected:
            self._put(key, desired)
            return [(conn, vector(desired))] + self._wake(key)
        return [(conn, vector(current))]

    def _get(self, conn: int, request: Request) -> list[Answer]:
        return [(conn, vector(self._values.get(request.keys[0], b"")))]

    def _add(self, conn: int, request: Request) -> list[Answer]:
        key = request.keys[0]
        total = self._number(key) + request.number
        if not _I64[0] <= total <= _I64[1]:
            raise Refused("ADD past a 64-bit integer")
        self._put(key, str(total).encode())
        return [(conn, i64(total))] + self._wake(key)

    def _check(self, conn: int, request: Request) -> list[Answer]:
        return [(conn, READY if all(self._present(k) for k in request.keys) else NOT_READY)]

    def _num_keys(self, conn: int, request: Request) -> list[Answer]:
        return [(conn, i64(len(self._values)))]

    def _delete(self, conn: int, request: Request) -> list[Answer]:
        old = self._values.pop(request.keys[0], None)
        if old is not None:
            self._size -= _ENTRY_COST + len(request.keys[0]) + len(old)
        return [(conn, i64(0 if old is None else 1))]

    def _append(self, conn: int, request: Request) -> list[Answer]:
        key = request.keys[0]
        self._put(key, self._values.get(key, b"") + request.values[0])
        return self._wake(key)

    def _multi_get(self, conn: int, request: Request) -> list[Answer]:
        values = [self._values.get(k, b"") for k in request.keys]
        self._bound_answer(sum(8 + len(v) for v in values))
        return [(conn, b"".join(vector(v) for v in values))]

    def _multi_set(self, conn: int, request: Request) -> list[Answer]:
        answers: list[Answer] = []
        for key, value in zip(request.keys, request.values):
            self._put(key, value)
            answers += self._wake(key)
        return answers

    def _list_keys(self, conn: int, request: Request) -> list[Answer]:
        self._bound_answer(8 + sum(8 + len(k) for k in self._values))
        return [(conn, i64(len(self._values)) + b"".join(vector(k) for k in self._values))]

    # -- waiting --------------------------------------------------------------------------------------------------

    def _wait(self, conn: int, request: Request) -> list[Answer]:
        self._clear_wait(conn)  # torch's client waits for one thing at a time; a second WAIT replaces the first
        missing = {k for k in request.keys if not self._present(k)}
        if not missing:
            return [(conn, STOP_WAITING)]
        self._await(conn, missing)
        return []

    def _cancel_wait(self, conn: int, request: Request) -> list[Answer]:
        self._clear_wait(conn)
        return [(conn, WAIT_CANCELED)]

    def _barrier(self, conn: int, request: Request) -> list[Answer]:
        # torch's BARRIER: the key counts the arrivals; the one that makes it world_size ends every waiter's wait
        key = request.keys[0]
        count = (self._number(key) if key in self._values else 0) + 1
        self._put(key, str(count).encode())
        self._clear_wait(conn)
        if count >= request.number:
            return self._wake(key) + [(conn, STOP_WAITING)]
        self._await(conn, {key})
        return []

    # -- queues ---------------------------------------------------------------------------------------------------

    def _queue_push(self, conn: int, request: Request) -> list[Answer]:
        key, item = request.keys[0], request.values[0]
        self._charge(_ENTRY_COST + len(key) + len(item))
        self._queues.setdefault(key, deque()).append(item)
        return self._wake_one(key)

    def _queue_pop(self, conn: int, request: Request) -> list[Answer]:
        # torch's answer: the queue's length before the pop, then the item when there was one
        key = request.keys[0]
        queue = self._queues.get(key)
        if not queue:
            return [(conn, i64(0))]
        answer = i64(len(queue))
        item = queue.popleft()
        if not queue:
            del self._queues[key]
        self._size -= _ENTRY_COST + len(key) + len(item)
        return [(conn, answer + vector(item))]

    def _queue_len(self, conn: int, request: Request) -> list[Answer]:
        return [(conn, i64(len(self._queues.get(request.keys[0], ()))))]

    # -- helpers --------------------------------------------------------------------------------------------------

    def _present(self, key: bytes) -> bool:
        return key in self._values or bool(self._queues.get(key))

    def _number(self, key: bytes) -> int:
        match = _INT.match(self._values.get(key, b"0"))
        if match is None:
            raise Refused("ADD or BARRIER on a value that is no number")
        return int(match.group())

    def _charge(self, extra: int) -> None:
        if self._size + extra > self._max_bytes:
            raise Refused(f"the store would hold over {self._max_bytes} bytes")
        self._size += extra

    def _put(self, key: bytes, value: bytes) -> None:
        old = self._values.get(key)
        self._charge(len(value) - len(old) if old is not None else _ENTRY_COST + len(key) + len(value))
        self._values[key] = value

    def _bound_answer(self, size: int) -> None:
        if size > self._max_answer:
            raise Refused(f"an answer of {size} bytes (at most {self._max_answer})")

    def _await(self, conn: int, keys: set[bytes]) -> None:
        if self._waits + len(keys) > self._max_waits:
            raise Refused(f"over {self._max_waits} keys waited for")
        self._waits += len(keys)
        self._awaiting[conn] = keys
        for key in keys:
            self._waiters.setdefault(key, {})[conn] = None

    def _clear_wait(self, conn: int) -> None:
        keys = self._awaiting.pop(conn, set())
        self._waits -= len(keys)
        for key in keys:
            waiting = self._waiters[key]
            del waiting[conn]
            if not waiting:
                del self._waiters[key]

    def _arrived(self, conn: int, key: bytes) -> list[Answer]:
        keys = self._awaiting[conn]
        keys.discard(key)
        self._waits -= 1
        if keys:
            return []
        del self._awaiting[conn]
        return [(conn, STOP_WAITING)]

    def _wake(self, key: bytes) -> list[Answer]:
        answers: list[Answer] = []
        for conn in self._waiters.pop(key, {}):
            answers += self._arrived(conn, key)
        return answers

    def _wake_one(self, key: bytes) -> list[Answer]:
        # torch's queue push: waiters are told one by one, until one of them has all it waited for
        waiting = self._waiters.get(key, {})
        while waiting:
            conn = next(iter(waiting))
            del waiting[conn]
            answers = self._arrived(conn, key)
            if answers:
                break
        else:
            answers = []
        if not waiting:
            self._waiters.pop(key, None)
        return answers
