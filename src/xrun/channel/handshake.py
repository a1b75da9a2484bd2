"""The channel's handshake inside TLS, as two pure state machines: who proves what, and in which order.

::

    client (agent)                                   server (head, or node 0 in pod mode)
      TLS 1.3 handshake; fingerprint_seen = SHA-256 of the server's certificate
      head mode: fingerprint_seen must be the pinned one (``tls.pin_ok``), else hang up
      auth(client_nonce, node_rank)          ->
                                             <-     challenge(server_nonce[, server_proof])
      pod mode: check server_proof, else hang up (the client's proof never leaves)
      hello(proof, node_rank, host, ...)     ->     check_hello: proof and node rank, else drop, not a word
                                             <-     spec / accept (as before)

``ServerHandshake`` (one per connection) answers ``auth`` and checks the ``hello``; ``ClientHandshake`` makes
``auth``, checks the ``challenge`` and makes the hello's proof fields. Proofs: ``xrun.channel.proof``.

Keys: the server asks ``key_for_node(node_rank)`` for the key node ``node_rank`` must prove (None: no such
node, or its place is taken: the connection is dropped). Head mode can give each node its own one-time key;
pod mode gives every node the key derived from the shared secret, and ``prove_server=True`` makes the server
prove it first. When the server does not prove itself (head mode: the pin does), the key is looked up only
when the hello arrives, so a key that reaches the head a little after the node connects still works.

A failure on either side returns a ``ChannelError`` (not raised: the caller drops the connection and goes on).
Both machines are single-use: a second ``auth``, a hello before ``auth``, or a second hello fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from xrun.channel import proof
from xrun.channel.fields import AUTH_FIELDS, CHALLENGE_FIELDS, HELLO_FIELDS, Field, fields_error
from xrun.channel.framing import ChannelError, Message
from xrun.channel.messages import Kind, message

KeyForNode = Callable[[int], "bytes | None"]


def _refused(msg: Any, kind: Kind, fields: Mapping[str, Field]) -> ChannelError | None:
    if not isinstance(msg, dict) or msg.get("type") != kind.value:
        return ChannelError(f"expected {kind.value}")
    return fields_error(msg, fields)


def _nonce(msg: Message, name: str) -> bytes:
    return bytes.fromhex(msg[name])  # checked by fields_error: 64 lowercase hex digits


class ServerHandshake:
    """The server's side of one connection (see the module doc)."""

    __slots__ = ("_key_for_node", "_fingerprint", "_prove_server", "_client_nonce", "_server_nonce", "_node_rank",
                 "_spent", "_trusted")  # one per connection: 10,000 on a large job's server

    def __init__(self, key_for_node: KeyForNode, fingerprint: str, *, prove_server: bool) -> None:
        self._key_for_node = key_for_node
        self._fingerprint = fingerprint
        self._prove_server = prove_server
        self._client_nonce: bytes | None = None
        self._server_nonce = proof.new_nonce()
        self._node_rank: int | None = None
        self._spent = False
        self._trusted = False

    @classmethod
    def trusted(cls) -> ServerHandshake:
        """The handshake of an in-process link (the local run's one node is this process's own agent): no
        ``auth``, and its one hello needs no proof."""
        trusting = cls(lambda node: None, "", prove_server=False)
        trusting._trusted = True
        return trusting

    @classmethod
    def spent(cls) -> ServerHandshake:
        """A handshake that refuses everything: what an admitted connection keeps (its own held two nonces and a
        key lookup, ~0.3 KiB on each of 10,000 connections)."""
        done = cls(lambda node: None, "", prove_server=False)
        done._spent = True
        return done

    def on_auth(self, msg: Message) -> Message | ChannelError:
        """The challenge to send back, or why the connection is to be dropped."""
        if self._client_nonce is not None or self._spent:
            return ChannelError("auth: sent twice")
        problem = _refused(msg, Kind.AUTH, AUTH_FIELDS)
        if problem:
            return problem
        self._client_nonce, self._node_rank = _nonce(msg, "client_nonce"), msg["node_rank"]
        if not self._prove_server:
            return message(Kind.CHALLENGE, server_nonce=self._server_nonce.hex())
        key = self._key_for_node(self._node_rank)
        if key is None:
            return ChannelError(f"auth: no key for node {self._node_rank}")
        mine = proof.server_proof(key, self._fingerprint, self._client_nonce, self._server_nonce)
        return message(Kind.CHALLENGE, server_nonce=self._server_nonce.hex(), server_proof=mine)

    def check_hello(self, msg: Message) -> bool:
        """The hello proves the key of the node it names, on this connection; spends the handshake either way."""
        if self._trusted and not self._spent:
            self._spent = True
            return True
        if self._spent or self._client_nonce is None or self._node_rank is None:
            return False
        self._spent = True
        if _refused(msg, Kind.HELLO, {name: HELLO_FIELDS[name] for name in ("proof", "node_rank")}):
            return False
        if msg["node_rank"] != self._node_rank:
            return False
        key = self._key_for_node(self._node_rank)
        if key is None:
            return False
        expected = proof.client_proof(key, self._fingerprint, self._client_nonce, self._server_nonce, self._node_rank)
        return proof.verify(expected, msg["proof"])

    @property
    def node_rank(self) -> int | None:
        """The node rank the client claimed in its auth (proven only once ``check_hello`` returned True)."""
        return self._node_rank


class ClientHandshake:
    """The agent's side: ``auth_message()``, then ``on_challenge(msg)``, then ``proof_fields()`` in the hello."""

    def __init__(self, key: bytes, fingerprint_seen: str, node_rank: int, *, expect_server_proof: bool) -> None:
        self._key = key
        self._fingerprint = fingerprint_seen
        self._node_rank = node_rank
        self._expect_server_proof = expect_server_proof
        self._client_nonce = proof.new_nonce()
        self._server_nonce: bytes | None = None

    def auth_message(self) -> Message:
        return message(Kind.AUTH, client_nonce=self._client_nonce.hex(), node_rank=self._node_rank)

    def on_challenge(self, msg: Message) -> ChannelError | None:
        """None when the challenge is well formed and (pod mode) the server proved the key; else why not."""
        if self._server_nonce is not None:
            return ChannelError("challenge: sent twice")
        problem = _refused(msg, Kind.CHALLENGE, CHALLENGE_FIELDS)
        if problem:
            return problem
        server_nonce = _nonce(msg, "server_nonce")
        if self._expect_server_proof:
            expected = proof.server_proof(self._key, self._fingerprint, self._client_nonce, server_nonce)
            if not proof.verify(expected, msg.get("server_proof")):
                return ChannelError("the server could not prove it holds the job's secret")
        self._server_nonce = server_nonce
        return None

    def proof_fields(self) -> dict[str, Any]:
        """The hello's ``proof`` and ``node_rank``; only after ``on_challenge`` accepted the challenge."""
        if self._server_nonce is None:
            raise RuntimeError("proof_fields() before an accepted challenge")  # a bug in the caller, not the peer
        mine = proof.client_proof(self._key, self._fingerprint, self._client_nonce, self._server_nonce,
                                  self._node_rank)
        return {"proof": mine, "node_rank": self._node_rank}
