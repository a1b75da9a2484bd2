"""The channel's transport: TLS 1.3 with an ephemeral certificate per run, pinned by its fingerprint.

The server (the head, or node 0 in pod mode) mints a fresh EC P-256 key and a self-signed certificate when
the run starts (``xrun.channel.tls_server.ServerIdentity.mint``); the key lives only in this process's memory.
This module is what both sides need (an agent imports nothing else of TLS). A client does not
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
never pays it; the server's half (minting, the server context) is in ``tls_server``,
so an agent does not load ``cryptography`` or define what only a server uses.
"""

from __future__ import annotations

import ssl

from xrun.channel.framing import ChannelError
from xrun.channel.proof import same_hex, sha256_hex

FINGERPRINT_HEX = 64


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
    return sha256_hex(der)


def pin_ok(expected: str, actual: object) -> bool:
    """The fingerprint seen is the one pinned (constant time; False for anything malformed)."""
    return same_hex(expected, actual, FINGERPRINT_HEX)


def reason(err: Exception) -> str:
    """A failed handshake's cause, in a few words."""
    if isinstance(err, ssl.SSLError):
        return err.reason or err.__class__.__name__
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or err.__class__.__name__
