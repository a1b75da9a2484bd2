"""The store's server: one selector loop on its own thread, non-blocking sockets, every connection bounded.

``StoreServer(host, port)`` binds and listens at once (a taken port fails here, before any rank starts), ``start()``
runs the loop on a daemon thread, ``close()`` stops it and closes every socket. Each instance starts empty: a
job's attempt gets a new one (torch's ``TORCHELASTIC_USE_AGENT_STORE`` contract; issue 39).

The socket is open to anyone who can reach the port, as torch's own store is, so a connection costs only itself:
a request over its bounds (``wire.py``), one the table refuses (``table.py``), bytes that are no request, or an
exception of any kind closes that connection and nothing else. Memory is bounded: a request in progress by
``max_request_bytes`` (all of them together by ``max_pending_bytes``), the store by ``max_store_bytes``, an
answer by ``max_answer_bytes``, the keys waited for by ``max_waits``, connections by ``max_connections``. A
client that does not read its answers stops being read once its unsent answers pass ``out_high_water``, and
every client once all unsent answers together pass ``max_unsent_bytes``.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from xrun.common.network.interfaces import resolvable
from xrun.launch.store.table import Refused, Table
from xrun.launch.store.wire import MAX_KEYS, MAX_VALUE_BYTES, ProtocolError, Reader

_RECV = 256 * 1024
_ACCEPTS_PER_TURN = 64
_ACCEPT_BACKOFF_S = 0.1  # out of descriptors (EMFILE): the listener rests instead of spinning


@dataclass(frozen=True)
class Limits:
    """The store's bounds; the defaults take any request torch's own libuv server takes."""

    max_connections: int = 65536
    max_store_bytes: int = 1 << 30
    max_request_bytes: int = 4 * MAX_VALUE_BYTES + 8 * MAX_KEYS  # a MULTI_SET of a few large values
    max_pending_bytes: int = 256 << 20  # requests in progress, all connections together
    max_waits: int = 1 << 20  # keys waited for, all connections together
    max_answer_bytes: int = 64 << 20
    out_high_water: int = 1 << 20
    max_unsent_bytes: int = 256 << 20


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    ident: int
    reader: Reader = field(default_factory=Reader)
    out: bytearray = field(default_factory=bytearray)
    events: int = selectors.EVENT_READ
    pending: int = 0  # its reader's bytes, as counted in the server's total


class StoreServer:
    """A TCPStore server that torch's clients (``TCPStore(host, port, is_master=False)``) talk to."""

    def __init__(self, host: str, port: int, *, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._table = Table(max_bytes=self.limits.max_store_bytes, max_answer=self.limits.max_answer_bytes,
                            max_waits=self.limits.max_waits)
        self._listener = _listen(host, port)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._waker_r, self._waker_w = socket.socketpair()
        for sock in (self._listener, self._waker_r, self._waker_w):
            sock.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._waker_r, selectors.EVENT_READ, "waker")
        self._conns: dict[int, _Conn] = {}
        self._next_ident = 0
        self._unsent = 0
        self._pending = 0  # bytes of requests read and not yet served, all connections together
        self._paused: set[int] = set()  # connections not read until their answers (or everyone's) drain
        self._listener_back_at: float | None = None  # resting after EMFILE: listening again at
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.loop_error: Exception | None = None  # the last error the loop itself met (never one of a connection's)

    # -- life -----------------------------------------------------------------------------------------------------

    def start(self) -> StoreServer:
        if self._thread is None and not self._closing.is_set():
            self._thread = threading.Thread(target=self._run, name=f"xrun-store:{self.port}", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the loop (if it runs) and close every socket: the listener, each client's, the waker. Idempotent."""
        self._closing.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            try:
                self._waker_w.send(b"x")
            except OSError:
                pass  # closed already, or its buffer is full: the loop is waking either way
            thread.join()
        elif thread is None:
            self._shutdown()

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                try:
                    self._turn()
                except Exception as err:  # noqa: BLE001 - each connection's own errors end it in _serve; what is
                    # left here is a bug of the loop's, and the ranks' store outlives it: kept, the next turn goes on
                    self.loop_error = err
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        for sock in (self._listener, self._waker_r, self._waker_w):
            sock.close()
        self._selector.close()

    def _turn(self) -> None:
        timeout = None
        if self._listener_back_at is not None:
            timeout = self._listener_back_at - time.monotonic()
            if timeout <= 0:
                self._listener_back_at, timeout = None, None
                self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        for key, mask in self._selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "waker":
                self._drain_waker()
            else:
                self._serve(key.data, mask)
        if self._paused:
            self._resume_paused()

    def _drain_waker(self) -> None:
        try:
            self._waker_r.recv(4096)
        except OSError:
            pass  # nothing there: the flag is what counts

    # -- connections ----------------------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._rest_listener()
                return  # ECONNABORTED and the like: that connection only
            if len(self._conns) >= self.limits.max_connections:
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._next_ident += 1
                conn = _Conn(sock, self._next_ident)
                self._selector.register(sock, conn.events, conn)
            except (OSError, ValueError):
                sock.close()  # gone before it was served (a reset, a descriptor the selector refuses)
                continue
            self._conns[conn.ident] = conn

    def _rest_listener(self) -> None:
        # the pending connection stays in the backlog and the listener stays readable: not listening for a while
        # is what keeps the loop from spinning on it
        self._selector.unregister(self._listener)
        self._listener_back_at = time.monotonic() + _ACCEPT_BACKOFF_S

    def _serve(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(conn)
            if mask & selectors.EVENT_READ and conn.ident in self._conns:
                self._read(conn)
        except Exception:  # noqa: BLE001 - hostile input or a broken socket costs its connection, never the loop
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.ident, None) is None:
            return
        self._table.forget(conn.ident)
        self._paused.discard(conn.ident)
        self._unsent -= len(conn.out)
        self._pending -= conn.pending
        if conn.events:
            self._selector.unregister(conn.sock)
        conn.sock.close()

    # -- reading and answering ------------------------------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._drop(conn)
            return
        conn.reader.feed(data)
        self._answer(conn)

    def _answer(self, conn: _Conn) -> None:
        """Serve the requests ``conn`` has sent in full, until its unsent answers say stop."""
        while not self._over(conn):
            try:
                request = conn.reader.parse()
                if request is None:
                    break
                answers = self._table.handle(conn.ident, request)
            except (ProtocolError, Refused):
                self._drop(conn)
                return
            for ident, data in answers:
                self._send(ident, data)
            if conn.ident not in self._conns:
                return  # its own answer could not be sent
        self._pending += conn.reader.pending - conn.pending
        conn.pending = conn.reader.pending
        if conn.pending > self.limits.max_request_bytes or self._pending > self.limits.max_pending_bytes:
            self._drop(conn)  # the one whose request would pass the bound
            return
        if self._over(conn):
            self._paused.add(conn.ident)
        self._interest(conn)

    def _over(self, conn: _Conn) -> bool:
        return len(conn.out) > self.limits.out_high_water or self._unsent > self.limits.max_unsent_bytes

    def _send(self, ident: int, data: bytes) -> None:
        conn = self._conns.get(ident)
        if conn is None:
            return
        if not conn.out:
            try:
                sent = conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self._drop(conn)
                return
            data = data[sent:]
        if data:
            conn.out += data
            self._unsent += len(data)
            self._interest(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        del conn.out[:sent]
        self._unsent -= sent
        self._interest(conn)

    def _resume_paused(self) -> None:
        """Serve again the paused connections whose answers have drained: what they sent meanwhile waited in their
        readers. Once a turn, after its events."""
        for ident in list(self._paused):
            conn = self._conns.get(ident)
            if conn is None:
                self._paused.discard(ident)
            elif not self._over(conn):
                self._paused.discard(ident)
                try:
                    self._answer(conn)
                except Exception:  # noqa: BLE001 - as in _serve: this connection only
                    self._drop(conn)

    def _interest(self, conn: _Conn) -> None:
        if conn.ident not in self._conns:
            return
        events = 0 if conn.ident in self._paused else selectors.EVENT_READ
        if conn.out:
            events |= selectors.EVENT_WRITE
        if events == conn.events:
            return
        if not events:  # paused with nothing of its own to send (everyone's answers are over the bound)
            self._selector.unregister(conn.sock)
        elif not conn.events:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host`` (``""``: every address, IPv6 and IPv4 where the system allows, as torch's
    server binds ``::`` and falls back to ``0.0.0.0``), with SO_REUSEADDR as torch sets it."""
    if host:
        family, kind, proto, _, addr = socket.getaddrinfo(resolvable(host), port, 0, socket.SOCK_STREAM, 0,
                                                         socket.AI_PASSIVE)[0]
        candidates = [(family, addr)]
    else:
        candidates = [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]  # noqa: S104 - see above
    error: OSError | None = None
    for family, addr in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not host:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(addr)
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as err:
            sock.close()
            error = err
            if err.errno == errno.EADDRINUSE:
                break  # the port is taken: IPv4 would find it taken too
    assert error is not None
    raise error
