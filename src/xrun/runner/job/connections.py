"""The control server's connections (``xrun.runner.job.control_server``): one per accepted socket, each reading its own
frames and handing what it read back to the server, and the bookkeeping that finds them again.

A connection is TLS from its first byte: a non-blocking ``SSLSocket`` (half a record never blocks the loop: it
waits in OpenSSL's buffer until the rest comes), which holds no buffer between records (CPython sets OpenSSL's
``SSL_MODE_RELEASE_BUFFERS``), where a session over memory BIOs kept ~3 KiB each of 10,000 connections (issue
22 §7). It reads only when its socket is readable and decodes whole frames (at most ``MAX_HELLO``
bytes, strictly, until the machine admits its hello; then ``MAX_FRAME``). Its first message must be ``auth``,
answered here with a ``challenge`` (``xrun.channel.handshake``); ``read`` gives the server the next, the hello with
its proof, and once the server admitted it the node's messages, then ``Closed`` with the reason when the peer went
away; a peer that breaks TLS or the protocol raises ``ChannelError`` (the server closes that connection, and only
that one). ``Connections`` keeps every open one by serial, the unadmitted ones in the order they opened (the
oldest is the next to time out, so neither the loop's timeout nor its tick scans every connection: issue 15) and
the admitted ones by node.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xrun import channel
from xrun.channel import ChannelError, Message
from xrun.channel.handshake import ServerHandshake

if TYPE_CHECKING:
    import ssl

RECV_CHUNK = 65536
TLS_HANDSHAKE_RECORD, TLS_MAJOR = 0x16, 0x03  # a TLS record's first two bytes: content type, major version
READ_BUDGET = 4 * RECV_CHUNK  # plaintext read from one connection per wake-up
SEND_TIMEOUT = 5.0  # bounds a send to a peer that stopped reading; reads happen only when readable


_recv = threading.local()
SPENT = ServerHandshake.spent()


@dataclass(frozen=True)
class Closed:
    """What ``Conn.read`` gives last when the connection is over: the peer closed it, or it broke."""

    reason: str


class Conn:
    """One accepted connection: its TLS session, its handshake, its frames (slots: a server holds 10,000)."""

    __slots__ = ("serial", "sock", "peer", "opened", "tls", "secure", "handshake", "reader", "node", "challenged")

    def __init__(self, *, serial: int, sock: socket.socket, peer: str, opened: float, tls: ssl.SSLContext | None,
                 handshake: ServerHandshake) -> None:
        self.serial = serial
        self.sock: socket.socket | ssl.SSLSocket = sock  # an SSLSocket from its first TLS record on
        self.tls: ssl.SSLContext | None = tls  # until the socket is wrapped
        self.peer = peer
        self.opened = opened
        self.secure = False  # its TLS handshake is complete
        self.handshake = handshake
        self.reader = channel.FrameReader.stranger()
        self.node: int | None = None  # set once the machine admits its hello
        self.challenged = False  # its ``auth`` was answered: the next message is the hello

    @classmethod
    def accepted(cls, serial: int, sock: socket.socket, peer: Any, *, now: float, tls: ssl.SSLContext,
                 handshake: ServerHandshake) -> Conn:
        channel.tune_socket(sock)
        sock.setblocking(False)  # reads only what is there; ``send`` waits, bounded, for room
        return cls(serial=serial, sock=sock, peer=str(peer[0]), opened=now, tls=tls, handshake=handshake)

    @classmethod
    def plain(cls, serial: int, sock: socket.socket, peer: str, *, now: float) -> Conn:
        """The head's end of an in-process socketpair (the local run: xrun.runner.backends.local): no TLS, no
        ``auth``; its hello is trusted (``ServerHandshake.trusted``)."""
        sock.setblocking(False)
        conn = cls(serial=serial, sock=sock, peer=peer, opened=now, tls=None, handshake=ServerHandshake.trusted())
        conn.secure = conn.challenged = True
        return conn

    def read(self) -> Iterator[Message | Closed]:
        """The socket is readable: every whole message that arrived, in order, then ``Closed`` if the connection is
        over. The peer's ``auth`` is answered here and not given; the message after it is the hello, whose
        admission (``admit``) the reader decides before it asks for the next: what came with a hello that was not
        admitted is not read. A peer that breaks TLS or the protocol raises ``ChannelError``."""
        if not self.secure:
            ended = self._handshake_step()
            if ended:
                yield Closed(ended)
            if not self.secure:
                return
        plain, reason = self._decrypted()
        for msg in self.reader.feed(plain):
            if self.node is None and not self.challenged:
                self._answer_auth(msg)
                continue
            hello = self.node is None
            yield msg
            if hello and self.node is None:
                return  # not admitted (yet): whatever came with the hello is not read
        if reason and self.sock.fileno() >= 0:  # not closed already by what it said
            yield Closed(reason)

    def _handshake_step(self) -> str | None:
        """Advance the TLS handshake with what arrived (``secure`` once it is complete); why the connection is
        over, if the peer went away (a peer that breaks the handshake is a ``ChannelError``). Only a TLS connection
        has one: ``ssl`` loaded with its context (xrun.runner.job.gate), so it is imported here, not with the module,
        which the local run's plain connection needs without it (~5 ms)."""
        import ssl

        from xrun.channel.tls import reason

        try:
            if self.tls is not None and not self._wrap(self.tls):
                return None
            assert isinstance(self.sock, ssl.SSLSocket)
            self.sock.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, EOFError):
            return "connection closed"
        except ssl.SSLError as err:
            raise ChannelError(f"TLS handshake failed: {reason(err)}") from None
        except OSError as err:
            return f"connection error: {err.strerror or err}"
        self.secure = True
        return None

    def _wrap(self, tls: ssl.SSLContext) -> bool:
        """Start TLS once the first bytes are there, if they open a TLS handshake record: anything else is
        dropped before OpenSSL sees it, so a stray that does not speak TLS gets not a byte back (not even an
        alert). False: nothing has come yet."""
        first = self.sock.recv(3, socket.MSG_PEEK)
        if not first:
            raise EOFError("closed before TLS")
        if first[0] != TLS_HANDSHAKE_RECORD or (len(first) > 1 and first[1] != TLS_MAJOR):
            self.sock.recv(RECV_CHUNK)  # taken off the queue: closed with bytes unread, the peer would get a reset
            raise ChannelError("TLS handshake failed: not a TLS record")
        self.sock = tls.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self.tls = None
        return True

    def _decrypted(self) -> tuple[bytes, str | None]:
        """The plaintext of the records at hand (at most ``READ_BUDGET`` bytes a turn, so one busy peer does not
        hold the loop; the rest stays in the kernel's buffer and the socket stays readable: OpenSSL reads one
        record at a time), and why the connection is over, if it is."""
        buf, total = _recv_buffer(), 0
        chunks: list[bytes] = []
        while total < READ_BUDGET:
            try:
                size = self.sock.recv_into(buf)
            except BlockingIOError:  # a plain socket's "nothing more now"
                break
            except OSError as err:
                over = _read_error(err)
                if over is None:
                    break
                return b"".join(chunks), over
            if not size:  # the peer's close_notify, or its TCP close
                return b"".join(chunks), "connection closed"
            chunks.append(bytes(buf[:size]))
            total += size
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), None

    def _answer_auth(self, msg: Message) -> None:
        reply = self.handshake.on_auth(msg)
        if isinstance(reply, ChannelError):
            raise reply
        self.challenged = True
        self.send(reply)

    def admit(self, node: int) -> None:
        """The machine admitted the hello: the connection is ``node``'s and may carry full-size frames."""
        self.node = node
        self.handshake = SPENT  # its job is done: the nonces and the key lookup go
        self.reader.trust()

    def send(self, msg: Message) -> None:
        """Send one message, waiting at most ``SEND_TIMEOUT`` for room (an ``OSError`` is the caller's: the
        connection is broken or its peer stopped reading)."""
        self.sock.settimeout(SEND_TIMEOUT)
        try:
            self.sock.sendall(channel.encode(msg))
        finally:
            self.sock.settimeout(0.0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _read_error(err: OSError) -> str | None:
    """Why a failed read ends its connection; None: a TLS socket's "nothing more now" (a TLS error is a
    ``ChannelError``). ``ssl`` is imported here, as in ``_handshake_step``: a TLS socket loaded it already."""
    import ssl

    from xrun.channel.tls import reason

    if isinstance(err, (ssl.SSLWantReadError, ssl.SSLWantWriteError)):
        return None
    if isinstance(err, ssl.SSLError):
        raise ChannelError(f"TLS: {reason(err)}") from None
    return f"connection error: {err.strerror or err}"


def _recv_buffer() -> memoryview:
    """The loop thread's buffer for decrypted bytes (``recv(65536)`` allocates 64 KiB per read and shrinks it to
    what came: holes in the heap of a server that holds 10,000 TLS sessions)."""
    buf: memoryview | None = getattr(_recv, "buf", None)
    if buf is None:
        buf = _recv.buf = memoryview(bytearray(RECV_CHUNK))
    return buf


class Unadmitted(dict[int, Conn]):
    """Connections whose hello is not yet admitted, in the order they opened."""

    def deadline(self) -> float | None:
        oldest = next(iter(self.values()), None)
        return None if oldest is None else oldest.opened + channel.HELLO_TIMEOUT

    def expired(self, now: float) -> Iterator[Conn]:
        """The connections past ``HELLO_TIMEOUT``, oldest first (the caller drops each as it comes)."""
        while self and now - (oldest := next(iter(self.values()))).opened > channel.HELLO_TIMEOUT:
            yield oldest


class Connections:
    """Every open connection by serial (``all``), the unadmitted in open order, the admitted by node."""

    def __init__(self, tls: ssl.SSLContext | None, handshake: Callable[[], ServerHandshake]) -> None:
        self._tls = tls
        self._handshake = handshake
        self.all: dict[int, Conn] = {}
        self.pending = Unadmitted()
        self.by_node: dict[int, Conn] = {}
        self._serials = itertools.count()

    def open(self, sock: socket.socket, peer: Any, *, now: float) -> Conn:
        assert self._tls is not None, "an in-process head accepts no connection"
        conn = Conn.accepted(next(self._serials), sock, peer, now=now, tls=self._tls, handshake=self._handshake())
        self.all[conn.serial] = conn
        self.pending[conn.serial] = conn
        return conn

    def open_plain(self, sock: socket.socket, peer: str, *, now: float) -> Conn:
        """The head's end of an in-process link (``Conn.plain``), kept like an accepted one."""
        conn = Conn.plain(next(self._serials), sock, peer, now=now)
        self.all[conn.serial] = conn
        self.pending[conn.serial] = conn
        return conn

    def admit(self, serial: int, node: int) -> None:
        conn = self.all[serial]
        del self.pending[serial]
        conn.admit(node)
        self.by_node[node] = conn

    def forget(self, conn: Conn) -> None:
        """``conn`` is closed: it is no longer found by serial, by node or as unadmitted."""
        self.all.pop(conn.serial, None)
        self.pending.pop(conn.serial, None)
        if conn.node is not None and self.by_node.get(conn.node) is conn:
            del self.by_node[conn.node]


def listener(addr: str, port: int, *, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
    except OSError as err:
        sock.close()
        raise ChannelError(f"cannot listen on {addr}:{port}: {err.strerror}") from None
    sock.listen(max(256, backlog))  # every node may connect at once; the kernel caps it at net.core.somaxconn
    sock.setblocking(False)
    return sock
