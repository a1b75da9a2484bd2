"""The channel's transport: TLS 1.3 with an ephemeral certificate per run, pinned by its fingerprint.

The server (the head, or node 0 in pod mode) mints a fresh EC P-256 key and a self-signed certificate when
the run starts (``ServerIdentity.mint``); the key lives only in this process's memory. A client does not
use a CA: it takes whatever certificate the server presents (``client_context``: no hostname, no chain) and
then either

* compares its SHA-256 fingerprint (``peer_fingerprint``) with the one it was given (``pin_ok``): head mode,
  where the fingerprint is public and may travel on the agent's argv; or
* binds its challenge-response to that fingerprint (``xrun.channel.proof``): pod mode, where no node knows
  node 0's certificate in advance but a man in the middle, with a certificate of its own, cannot produce the
  server's proof for the fingerprint the client saw.

Both: TLS 1.3 only (no downgrade, no renegotiation, forward secrecy), no client certificate, no session
tickets (a run's connections are made once; tickets would cost the server work and bytes for nothing).

Importing ``ssl`` costs ~5-7 ms: only code that opens a channel imports this module (lazily), so a local run
never pays it. ``cryptography`` is imported only in ``mint``: a server needs it, an agent never does.

For a selector-driven server: ``wrap_server`` gives a non-blocking ``SSLSocket`` whose handshake advances with
``handshake_step`` each time the socket is ready (``Step.READ``/``Step.WRITE`` says for what); after it, read
until ``SSLWantReadError`` on each wake-up, because TLS may hold decrypted bytes (``pending()``) that the
selector cannot see.
"""

from __future__ import annotations

import enum
import hashlib
import os
import socket
import ssl
from dataclasses import dataclass, field

from xrun.channel.framing import ChannelError
from xrun.channel.proof import same_hex

FINGERPRINT_HEX = 64
CERT_DAYS = 365  # nothing checks the dates (clients pin); a run may last weeks


@dataclass(frozen=True)
class ServerIdentity:
    """This run's certificate and key, in memory; ``fingerprint``: SHA-256 of the DER certificate, hex."""

    cert_pem: bytes
    fingerprint: str
    key_pem: bytes = field(repr=False)

    @classmethod
    def mint(cls, common_name: str = "xrun") -> ServerIdentity:
        """A fresh EC P-256 key and a self-signed certificate for it (a few ms)."""
        import datetime  # noqa: PLC0415 - only a server mints

        from cryptography import x509  # noqa: PLC0415 - only a server needs cryptography
        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import NameOID  # noqa: PLC0415

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # a node whose clock lags still accepts it
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .sign(key, hashes.SHA256())
        )
        der = cert.public_bytes(serialization.Encoding.DER)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), hashlib.sha256(der).hexdigest(), key_pem)

    def server_context(self) -> ssl.SSLContext:
        """A TLS 1.3 server context holding this identity (build it once per run: it loads the key)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.num_tickets = 0
        _load_chain(ctx, self.cert_pem + self.key_pem)
        return ctx


def _load_chain(ctx: ssl.SSLContext, pem: bytes) -> None:
    """``ssl`` loads a key only from a path: an anonymous memory file where Linux has one, else a private
    temp file (O_EXCL, 0600: ``mkstemp``) removed as soon as it is read."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("xrun-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    import tempfile  # noqa: PLC0415 - rarely needed (no memfd), and it loads random and shutil

    fd, path = tempfile.mkstemp(prefix="xrun-tls-", suffix=".pem")
    try:
        os.write(fd, pem)
        os.close(fd)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)


def client_context() -> ssl.SSLContext:
    """TLS 1.3, any certificate: the caller pins its fingerprint or binds its proof to it (module doc)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # we pin instead: see the module doc
    return ctx


def peer_fingerprint(conn: ssl.SSLSocket | ssl.SSLObject) -> str:
    """SHA-256 (hex) of the certificate the server presented on this connection."""
    der = conn.getpeercert(binary_form=True)
    if not der:
        raise ChannelError("the server presented no certificate")
    return hashlib.sha256(der).hexdigest()


def pin_ok(expected: str, actual: object) -> bool:
    """The fingerprint seen is the one pinned (constant time; False for anything malformed)."""
    return same_hex(expected, actual, FINGERPRINT_HEX)


def connect_client(sock: socket.socket, ctx: ssl.SSLContext, *, timeout: float) -> ssl.SSLSocket:
    """The agent's blocking handshake over a connected socket; any failure is a ChannelError."""
    sock.settimeout(timeout)
    try:
        tls = ctx.wrap_socket(sock)
    except (OSError, ValueError) as err:  # ssl.SSLError and socket.timeout are OSErrors
        raise ChannelError(f"TLS handshake with the server failed: {_why(err)}") from None
    tls.settimeout(None)
    return tls


class Step(enum.Enum):
    DONE = "done"
    READ = "read"  # wait until the socket is readable, then step again
    WRITE = "write"  # wait until it is writable


def wrap_server(ctx: ssl.SSLContext, sock: socket.socket) -> ssl.SSLSocket:
    """An accepted (non-blocking) connection as a TLS server socket whose handshake is still to do."""
    return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


def handshake_step(tls: ssl.SSLSocket) -> Step:
    """Advance a non-blocking handshake as far as the bytes at hand allow; a failure is a ChannelError."""
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        return Step.READ
    except ssl.SSLWantWriteError:
        return Step.WRITE
    except (OSError, ValueError) as err:
        raise ChannelError(f"TLS handshake failed: {_why(err)}") from None
    return Step.DONE


def _why(err: Exception) -> str:
    if isinstance(err, ssl.SSLError):
        return err.reason or err.__class__.__name__
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or err.__class__.__name__
