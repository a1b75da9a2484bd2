"""TLS over a socket through memory buffers: the caller owns the socket, this object owns the cipher state.

The agent's end (the control server holds a non-blocking ``SSLSocket`` per connection instead, which keeps no
buffers between records: ``xrun.runner.job.connections``). Why not an ``SSLSocket`` here: the agent reads on
one thread and sends on another, OpenSSL allows one thread at a time on a connection, and a blocking
``SSLSocket`` would hold its lock inside ``recv`` while a record is half there. ``TlsPipe`` solves it: raw bytes
go in with ``feed`` (never blocks: whatever is complete comes out, the rest waits in memory), plaintext goes out
with ``send`` (encrypted in memory, then written to the socket), and one lock covers every touch of the cipher
state and every write of its records, so records never interleave.

A failure of the peer's TLS (a bad record, a handshake that does not verify, bytes that are not TLS at all) is a
``ChannelError``; ``closed`` turns True when the peer closed its TLS session cleanly.
"""

from __future__ import annotations

import socket
import ssl
import threading

from xrun.channel.framing import READ_CHUNK, ChannelError
from xrun.channel.tls import peer_fingerprint, reason


class TlsPipe:
    """One TLS session over ``sock`` (see the module doc); ``server_side`` for the end that accepted it."""

    __slots__ = ("_incoming", "_outgoing", "_tls", "_sock", "_lock", "handshake_done", "closed")

    def __init__(self, ctx: ssl.SSLContext, sock: socket.socket, *, server_side: bool) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._incoming, self._outgoing, server_side=server_side)
        self._sock = sock
        self._lock = threading.Lock()
        self.handshake_done = False
        self.closed = False

    def handshake(self, raw: bytes = b"") -> bool:
        """Advance the handshake with ``raw`` (bytes just read); True once it is complete."""
        with self._lock:
            self._incoming.write(raw)
            self._step_handshake()
            self._flush()
            return self.handshake_done

    def feed(self, raw: bytes) -> bytes:
        """The plaintext that ``raw`` completes (possibly none); the handshake first, if it is not done."""
        with self._lock:
            self._incoming.write(raw)
            if not self.handshake_done:
                self._step_handshake()
            plain = self._read_all() if self.handshake_done else b""
            self._flush()
            return plain

    def send(self, data: bytes) -> None:
        """Encrypt ``data`` and write its records (an ``OSError`` from the socket is the caller's)."""
        with self._lock:
            try:
                self._tls.write(data)
            except ssl.SSLError as err:
                raise ChannelError(f"TLS: {reason(err)}") from None
            self._flush()

    def fingerprint(self) -> str:
        """SHA-256 of the certificate the server presented (a client, after the handshake)."""
        return peer_fingerprint(self._tls)

    def _step_handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return
        except (ssl.SSLError, ValueError) as err:
            self._outgoing.read()  # no alert back: a peer that is not ours learns nothing, not even why
            raise ChannelError(f"TLS handshake failed: {reason(err)}") from None
        self.handshake_done = True

    def _read_all(self) -> bytes:
        chunks = []
        while True:
            try:
                chunk = self._tls.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except (ssl.SSLError, ValueError) as err:
                raise ChannelError(f"TLS: {reason(err)}") from None
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def _flush(self) -> None:
        out = self._outgoing.read()
        if out:
            self._sock.sendall(out)


def client_handshake(pipe: TlsPipe, sock: socket.socket, *, timeout: float) -> None:
    """Drive a client's handshake to its end on a blocking socket; any failure or silence is a ChannelError."""
    sock.settimeout(timeout)
    try:
        done = pipe.handshake()
        while not done:
            raw = sock.recv(READ_CHUNK)
            if not raw:
                raise ChannelError("the server closed the connection during the TLS handshake")
            done = pipe.handshake(raw)
    except socket.timeout:
        raise ChannelError(f"no TLS handshake from the server within {timeout:g} s") from None
    except OSError as err:
        raise ChannelError(f"TLS handshake with the server failed: {err.strerror or err}") from None
    finally:
        sock.settimeout(None)
