"""The agent's end of the channel: connect, TLS, prove the key, then messages both ways (blocking, thread-safe).

``open_link`` is the whole start of a connection, in the order that keeps secrets in: a TCP connection, the TLS
1.3 handshake (``tlspipe``), the server's certificate checked against the pinned fingerprint (head mode) or
bound into the proofs (pod mode: the server proves the shared key first, else the agent hangs up having sent
nothing but a nonce), then ``auth`` -> ``challenge`` -> the caller's hello with this connection's proof
(``handshake.ClientHandshake``). After it, ``send`` may be called from any thread and ``recv``/``read_some``
from one reader thread (see ``TlsPipe`` for why that is safe).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from xrun.channel.framing import READ_CHUNK, ChannelError, FrameReader, Message, encode
from xrun.channel.handshake import ClientHandshake
from xrun.channel.messages import Kind

if TYPE_CHECKING:
    import ssl

    from xrun.channel.tlspipe import TlsPipe

# ``--token``'s forms: where a connect-mode agent's key comes from (rendered by xrun.common.command, read by
# xrun.launch.session.main). There is no other form: a token on the command line would be every local user's to read.
TOKEN_ON_STDIN = "-"  # noqa: S105 - "read it from stdin's first line"
TOKEN_ENV_PREFIX = "env:"  # noqa: S105 - "env:NAME": read it from variable NAME
TOKEN_ANNOUNCE = "announce"  # noqa: S105 - make a one-time key and announce it on stderr (xrun.channel.announce)


class Credentials(NamedTuple):
    """What an agent proves with: the key, and the server's fingerprint when it is pinned (head mode).

    Typed and immutable like the frozen dataclasses elsewhere, but a ``NamedTuple``: its class costs ~0.05 ms to
    make where a frozen dataclass's costs ~0.4-1 ms, on every connecting agent's start path (issue 22 §7)."""

    key: bytes
    pinned: str | None  # head mode: the fingerprint on the agent's argv; pod mode: None (the server proves)


class PlainPipe:
    """``TlsPipe``'s surface over a socket that needs no TLS: one end of a socketpair inside one process (the
    local run, a one-node job: xrun.runner.backends.local), where both ends are this process's own."""

    closed = False

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def feed(self, raw: bytes) -> bytes:
        return raw

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)


class Link:
    """An authenticated connection to the runner (or node 0), or a plain in-process one: whole messages in and out."""

    def __init__(self, sock: socket.socket, pipe: TlsPipe | PlainPipe) -> None:
        self.sock = sock
        self._pipe = pipe
        self._reader = FrameReader()

    @classmethod
    def plain(cls, sock: socket.socket) -> Link:
        """The agent's end of an in-process socketpair: nothing to secure or prove (``PlainPipe``)."""
        return cls(sock, PlainPipe(sock))

    def send(self, msg: Message) -> None:
        """One message; an ``OSError`` (the connection broke) is the caller's."""
        self._pipe.send(encode(msg))

    def recv(self, *, timeout: float | None) -> Message:
        """The next message, blocking up to ``timeout`` s; EOF, a timeout or bad bytes raise ChannelError."""
        self.sock.settimeout(timeout)
        try:
            ready = self.read_some()
        except socket.timeout:
            raise ChannelError(f"no message within {timeout:g} s") from None
        finally:
            self.sock.settimeout(None)
        self._reader.push_back(ready[1:])
        return ready[0]

    def read_some(self) -> list[Message]:
        """Block until at least one whole message arrived, or raise ChannelError (closed, broken)."""
        ready = self._reader.feed(self._pipe.feed(b""))  # what the last read decrypted beyond its message
        while not ready:
            ready = self._reader.feed(self._pipe.feed(self._raw()))
        return ready

    def _raw(self) -> bytes:
        try:
            raw = self.sock.recv(READ_CHUNK)
        except socket.timeout:
            raise
        except OSError as err:
            raise ChannelError(f"connection failed: {err.strerror or err}") from None
        if not raw or self._pipe.closed:
            raise ChannelError("connection closed by the peer")
        return raw

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def open_link(
    sock: socket.socket,
    credentials: Credentials,
    node_rank: int,
    hello: Callable[[dict[str, object]], Message],
    *,
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> Link:
    """TLS, the server checked, the key proven: the link on which ``hello(proof_fields)`` has been sent."""
    # Lazy: TLS (``ssl``, ~5 ms) loads where a link is opened over the network, never for the local run's plain one
    from xrun.channel import tls
    from xrun.channel.tlspipe import TlsPipe, client_handshake

    pipe = TlsPipe(context or tls.client_context(), sock, server_side=False)
    client_handshake(pipe, sock, timeout=timeout)
    seen = pipe.fingerprint()
    if credentials.pinned is not None and not tls.pin_ok(credentials.pinned, seen):
        raise ChannelError("the server's certificate is not the one this run pinned (--fingerprint): refusing it")
    link = Link(sock, pipe)
    handshake = ClientHandshake(credentials.key, seen, node_rank, expect_server_proof=credentials.pinned is None)
    link.send(handshake.auth_message())
    challenge = link.recv(timeout=timeout)
    if challenge.get("type") != Kind.CHALLENGE.value:
        raise ChannelError(f"expected a challenge from the server, got {str(challenge.get('type'))[:40]!r}")
    problem = handshake.on_challenge(challenge)
    if problem is not None:
        raise ChannelError(f"the server did not prove this job's secret: {problem.reason}")
    link.send(hello(handshake.proof_fields()))
    return link
