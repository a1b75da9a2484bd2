"""The control server's connections (``xrun.runner.job.server``): one per accepted socket, each reading its own
frames and handing them to the server, and the bookkeeping that finds them again.

A connection is TLS from its first byte (``xrun.channel.tlspipe``: decrypted in memory, so half a record never
blocks the loop). It reads only when its socket is readable and decodes whole frames (at most ``MAX_HELLO``
bytes, strictly, until the machine admits its hello; then ``MAX_FRAME``). Its first message must be ``auth``,
answered with a ``challenge`` (``xrun.channel.handshake``); the next, the hello with its proof, goes to
``ConnOwner.on_hello``, the later ones to ``on_message``; a connection that ends, breaks or breaks the protocol
goes to ``on_closed`` with the reason, and so does one whose handling failed in any other way.
``Connections`` keeps every open one by serial, the unadmitted ones in the order they opened (the oldest is the
next to time out, so neither the loop's timeout nor its tick scans every connection: issue 15) and the admitted
ones by node.
"""

from __future__ import annotations

import itertools
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from xrun import channel
from xrun.channel import ChannelError, Message
from xrun.channel.handshake import ServerHandshake
from xrun.channel.tlspipe import TlsPipe

ACCEPTS_PER_WAKEUP = 64  # a burst of connecting agents is taken in few loop turns, yet reads are not starved
SEND_TIMEOUT = 5.0  # bounds a send to a peer that stopped reading; reads happen only when readable


class ConnOwner(Protocol):
    """What a connection hands what it reads to (the control server)."""

    def on_hello(self, conn: Conn, msg: Message) -> None:
        """The connection's first message; admitting it (``Conn.admit``) is the owner's to decide."""

    def on_message(self, node: int, msg: Message) -> None:
        """A message from the admitted agent of ``node``; a ``ChannelError`` closes its connection."""

    def on_closed(self, conn: Conn, reason: str) -> None:
        """The connection ended or broke, or its peer broke the protocol."""


@dataclass(eq=False)
class Conn:
    """One accepted connection: its TLS session, its handshake, its frames."""

    serial: int
    sock: socket.socket
    peer: str
    opened: float
    owner: ConnOwner
    pipe: TlsPipe
    handshake: ServerHandshake
    reader: channel.FrameReader = field(default_factory=channel.FrameReader.stranger)
    node: int | None = None  # set once the machine admits its hello
    challenged: bool = False  # its ``auth`` was answered: the next message is the hello

    @classmethod
    def accepted(cls, serial: int, sock: socket.socket, peer: Any, *, now: float, owner: ConnOwner,
                 tls: ssl.SSLContext, handshake: ServerHandshake) -> Conn:
        sock.setblocking(True)
        sock.settimeout(SEND_TIMEOUT)
        channel.tune_socket(sock)
        pipe = TlsPipe(tls, sock, server_side=True)
        return cls(serial=serial, sock=sock, peer=str(peer[0]), opened=now, owner=owner, pipe=pipe,
                   handshake=handshake)

    def read(self) -> None:
        """The socket is readable: hand on every whole message that arrived, or say why the connection is over.

        Whatever a peer sends costs its own connection only: every failure here, expected or not, closes this
        connection and nothing else (issue 22); an unproven peer is dropped without a word back."""
        try:
            self._read()
        except ChannelError as err:
            self.owner.on_closed(self, f"protocol error: {err.reason}")
        except Exception as err:  # noqa: BLE001 - one connection's trouble must never reach the loop
            self.owner.on_closed(self, f"protocol error: {err.__class__.__name__}")

    def _read(self) -> None:
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return
        except OSError as err:
            self.owner.on_closed(self, f"connection error: {err.strerror or err}")
            return
        if not data:
            self.owner.on_closed(self, "connection closed")
            return
        plain = self.pipe.feed(data)
        if self.pipe.closed:
            self.owner.on_closed(self, "connection closed")
            return
        for msg in self.reader.feed(plain):
            if self.node is not None:
                self.owner.on_message(self.node, msg)
            elif not self.challenged:
                self._answer_auth(msg)
            else:
                self.owner.on_hello(self, msg)
                if self.node is None:
                    return  # not admitted (yet): whatever came with the hello is not read

    def _answer_auth(self, msg: Message) -> None:
        reply = self.handshake.on_auth(msg)
        if isinstance(reply, ChannelError):
            raise reply
        self.challenged = True
        self.send(reply)

    def admit(self, node: int) -> None:
        """The machine admitted the hello: the connection is ``node``'s and may carry full-size frames."""
        self.node = node
        self.reader.trust()

    def send(self, msg: Message) -> None:
        """Send one message (an ``OSError`` is the caller's: the connection is broken)."""
        self.pipe.send(channel.encode(msg))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


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

    def __init__(self, tls: ssl.SSLContext, handshake: Callable[[], ServerHandshake]) -> None:
        self._tls = tls
        self._handshake = handshake
        self.all: dict[int, Conn] = {}
        self.pending = Unadmitted()
        self.by_node: dict[int, Conn] = {}
        self._serials = itertools.count()

    def open(self, sock: socket.socket, peer: Any, *, now: float, owner: ConnOwner) -> Conn:
        conn = Conn.accepted(next(self._serials), sock, peer, now=now, owner=owner, tls=self._tls,
                             handshake=self._handshake())
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


def accepted(listener: socket.socket) -> Iterator[tuple[socket.socket, Any]]:
    """The connections waiting on ``listener``, at most ``ACCEPTS_PER_WAKEUP`` of them."""
    for _ in range(ACCEPTS_PER_WAKEUP):
        try:
            pair = listener.accept()
        except OSError:  # none left (EAGAIN), or one that went away before we took it
            return
        yield pair


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
