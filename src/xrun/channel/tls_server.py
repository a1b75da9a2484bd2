"""The server's half of the channel's TLS: this run's identity, and a handshake a selector loop can drive.

``ServerIdentity.mint()`` makes a fresh EC P-256 key and a self-signed certificate (well under a millisecond
once ``cryptography`` is loaded; loading it costs ~30 ms, once, on the head or node 0 only). The key stays in
memory: ``ssl`` can load a key only from a path, so ``server_context`` hands it over through an anonymous
memory file (Linux's ``memfd``), else through a private temp file (``O_EXCL``, 0600) removed as soon as it is
read. Clients pin ``fingerprint`` (head mode: it may travel on argv, it is public) or bind their proof to it
(pod mode): see ``xrun.channel.tls``.

The control server drives each connection's handshake itself, non-blocking (``xrun.runner.job.connections``).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import threading
from dataclasses import dataclass, field

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
        # Lazy: cryptography only where a certificate is minted (in mint_apart's child, ~12 MiB of RSS kept off
        # the head); an agent never loads it.
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

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

    @classmethod
    def mint_apart(cls) -> ServerIdentity:
        """``mint()`` in a forked child when this process runs one thread (a head): the child loads
        ``cryptography`` and hands the PEMs back through a pipe, so the server never maps it (~12 MiB of RSS
        for the whole run, on a head that may hold 10,000 sessions; the wall time is the same, the import
        only moves). With other threads running (pod mode's node 0), without ``fork``, or if the child fails:
        ``mint()`` here."""
        if not hasattr(os, "fork") or threading.active_count() != 1:
            return cls.mint()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: mint, write, leave without running the parent's exit handlers
            code = 1
            try:
                os.close(read_fd)
                made = cls.mint()
                _write_all(write_fd, b"\0".join((made.fingerprint.encode("ascii"), made.cert_pem, made.key_pem)))
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        parts = data.split(b"\0")
        if status != 0 or len(parts) != 3:
            return cls.mint()
        return cls(parts[1], parts[0].decode("ascii"), parts[2])

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
    import tempfile  # lazy: rarely needed (no memfd), and it loads random and shutil

    fd, path = tempfile.mkstemp(prefix="xrun-tls-", suffix=".pem")
    try:
        os.write(fd, pem)
        os.close(fd)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
