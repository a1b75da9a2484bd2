"""Challenge-response: each side proves it holds the job's key without sending it, bound to this connection.

Both sides send a fresh 32-byte nonce. A proof is HMAC-SHA256 under the key ``K`` over a length-prefixed,
domain-separated encoding of

* a label: ``"xrun client v1"`` or ``"xrun server v1"`` (a server's proof is never a client's, and a future
  version's never this one's),
* the server certificate's SHA-256 fingerprint *as the prover saw it* (RFC 5929's tls-server-end-point idea):
  a man in the middle presents its own certificate, so a proof made for it is worthless at the real server
  and the real server's proof is worthless to a client talking to the middleman,
* the client's nonce, the server's nonce and (client proofs only) the node rank the client claims.

What this gives: a recording replays to nothing (the other side's nonce is new each time), no secret ever
crosses the wire (only MACs of public values), and a proof for node 1 is not one for node 2.

What it does not give: a low-entropy secret stays guessable *offline* by anyone who obtains one proof (a
server proof is given to whoever connects, so that a fake server learns nothing from a client). Pod mode
therefore wants a secret of at least 16 random characters, or ``stretch`` (PBKDF2) before ``derive_key``.

Pure: no socket, no clock. ``hmac``/``hashlib`` load OpenSSL (~2 ms), so they are imported inside the
functions: importing ``xrun.channel`` stays cheap for a local run that never opens a channel.
"""

from __future__ import annotations

import os
import struct

from xrun.channel.fields import HEX_DIGITS, PROOF_HEX

NONCE_BYTES = 32
CLIENT_LABEL = b"xrun client v1"
SERVER_LABEL = b"xrun server v1"
KEY_LABEL = b"xrun channel key v1"
STRETCH_ITERATIONS = 100_000  # PBKDF2-HMAC-SHA256: ~50 ms once per process; each offline guess costs as much
_LENGTH = struct.Struct(">I")


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The channel key for one ``purpose`` ("head", "pod", ...): the secret itself is never MACed over the wire.

    A key derived for one purpose proves nothing for another.
    """
    import hashlib  # noqa: PLC0415 - see the module doc
    import hmac  # noqa: PLC0415

    return hmac.new(secret, _encode(KEY_LABEL, purpose.encode("utf-8")), hashlib.sha256).digest()


HEAD_PURPOSE = "head"  # a head-mode run: the run token, or a node's announced one-time key
POD_PURPOSE = "pod"  # a pod-mode job: the shared secret (stretched), or the run id when there is none
ANNOUNCED_KEY_HEX = 64  # a one-time key an agent announces on its output stream (pdsh): 32 random bytes


def token_key(token: str, purpose: str) -> bytes:
    """The key a token (printable text: hex, a Secret's contents) stands for."""
    return derive_key(token.encode("utf-8", "surrogateescape"), purpose)


def stretch(secret: bytes, salt: bytes, *, iterations: int = STRETCH_ITERATIONS) -> bytes:
    """A user-chosen secret made expensive to guess offline (PBKDF2-HMAC-SHA256), once per process."""
    import hashlib  # noqa: PLC0415 - see the module doc

    return hashlib.pbkdf2_hmac("sha256", secret, b"xrun stretch v1" + salt, iterations)


def client_proof(key: bytes, fingerprint: str, client_nonce: bytes, server_nonce: bytes, node_rank: int) -> str:
    """The client's proof for ``node_rank`` on the connection to the server whose certificate it saw."""
    fields = (fingerprint.encode("ascii"), client_nonce, server_nonce, str(node_rank).encode("ascii"))
    return _mac(key, CLIENT_LABEL, *fields)


def server_proof(key: bytes, fingerprint: str, client_nonce: bytes, server_nonce: bytes) -> str:
    """The server's proof, over its own certificate's fingerprint."""
    return _mac(key, SERVER_LABEL, fingerprint.encode("ascii"), client_nonce, server_nonce)


def verify(expected: str, offered: object) -> bool:
    """Constant-time comparison of two proofs; False (never an exception) for anything but well-formed hex."""
    return same_hex(expected, offered, PROOF_HEX)


def same_hex(expected: str, offered: object, length: int) -> bool:
    """``offered`` is exactly ``expected``: lowercase hex of ``length`` digits, compared in constant time."""
    import hmac  # noqa: PLC0415 - see the module doc

    if not (isinstance(offered, str) and len(offered) == length and HEX_DIGITS.issuperset(offered)):
        return False
    return hmac.compare_digest(expected.encode("ascii"), offered.encode("ascii"))


def _mac(key: bytes, label: bytes, *fields: bytes) -> str:
    import hashlib  # noqa: PLC0415 - see the module doc
    import hmac  # noqa: PLC0415

    return hmac.new(key, _encode(label, *fields), hashlib.sha256).hexdigest()


def _encode(*fields: bytes) -> bytes:
    """Each field as its 4-byte length then its bytes: no two different field lists encode the same."""
    return b"".join(_LENGTH.pack(len(field)) + field for field in fields)
