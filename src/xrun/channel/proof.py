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

Pure: no socket, no clock. The primitives are CPython's own, loaded inside the functions so that importing
``xrun.channel`` stays cheap for a local run that never opens a channel: SHA-256 from the built-in ``_sha256``,
HMAC over it as ``hmac.HMAC`` computes it for such a hash (``hmac_sha256``; the tests hold it to ``hmac.digest``),
the constant-time comparison ``hmac.compare_digest`` is (``_operator._compare_digest``). Not ``hashlib``/``hmac``
themselves: importing them loads OpenSSL's ``_hashlib``, which lists every digest its providers offer, and builds
a constructor per algorithm: ~1.5 ms on every connecting agent's start path, where issue 22 §7 allows the
channel's security 10 ms in all. ``stretch`` (pod mode, PBKDF2) still uses ``hashlib``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from hashlib import _Hash

from xrun.channel.fields import HEX_DIGITS, PROOF_HEX

NONCE_BYTES = 32
CLIENT_LABEL = b"xrun client v1"
SERVER_LABEL = b"xrun server v1"
KEY_LABEL = b"xrun channel key v1"
STRETCH_ITERATIONS = 100_000  # PBKDF2-HMAC-SHA256: ~50 ms once per process; each offline guess costs as much
_LENGTH = struct.Struct(">I")
_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """The channel key for one ``purpose`` ("head", "pod", ...): the secret itself is never MACed over the wire.

    A key derived for one purpose proves nothing for another.
    """
    return hmac_sha256(secret, _encode(KEY_LABEL, purpose.encode("utf-8")))


HEAD_PURPOSE = "head"  # a head-mode run: the run token, or a node's announced one-time key
POD_PURPOSE = "pod"  # a pod-mode job: the shared secret (stretched), or the run id when there is none
ANNOUNCED_KEY_HEX = 64  # a one-time key an agent announces on its output stream (pdsh): 32 random bytes


def token_key(token: str, purpose: str) -> bytes:
    """The key a token (printable text: hex, a Secret's contents) stands for."""
    return derive_key(token.encode("utf-8", "surrogateescape"), purpose)


def stretch(secret: bytes, salt: bytes, *, iterations: int = STRETCH_ITERATIONS) -> bytes:
    """A user-chosen secret made expensive to guess offline (PBKDF2-HMAC-SHA256), once per process."""
    import hashlib  # lazy: see the module doc

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
    if not (isinstance(offered, str) and len(offered) == length and HEX_DIGITS.issuperset(offered)):
        return False
    from _operator import _compare_digest  # lazy, and what hmac.compare_digest is: see the module doc

    return _compare_digest(expected.encode("ascii"), offered.encode("ascii"))


def _mac(key: bytes, label: bytes, *fields: bytes) -> str:
    return hmac_sha256(key, _encode(label, *fields)).hex()


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) of ``data`` under ``key``: what ``hmac.digest(key, data, "sha256")`` returns, computed
    as ``hmac.HMAC`` itself does for a hash OpenSSL does not provide (see the module doc for why not ``hmac``)."""
    sha256 = _sha256()
    if len(key) > _BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = sha256(key.translate(_IPAD))
    inner.update(data)
    outer = sha256(key.translate(_OPAD))
    outer.update(inner.digest())
    return outer.digest()


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data``, lowercase hex (a certificate's fingerprint)."""
    return _sha256()(data).hexdigest()


def _sha256() -> Callable[[bytes], _Hash]:
    """CPython's built-in SHA-256 (``_sha256``: loads in ~0.15 ms; ``_hashlib``, OpenSSL's, lists every digest its
    providers offer when it loads, ~0.7 ms), or ``hashlib``'s where a build has no built-in one."""
    try:
        import _sha256  # lazy: see the function doc
    except ImportError:  # pragma: no cover - a Python built without its own hashes
        import hashlib

        return hashlib.sha256
    return cast("Callable[[bytes], _Hash]", _sha256.sha256)


def _encode(*fields: bytes) -> bytes:
    """Each field as its 4-byte length then its bytes: no two different field lists encode the same."""
    return b"".join(_LENGTH.pack(len(field)) + field for field in fields)
