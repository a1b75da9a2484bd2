"""Who gets into the control server (issue 22): TLS, the proof of a node's key, and bounds on the unproven.

The server listens on the cluster network for a whole run, so until a peer has proven the job's key it is a
stranger and may cost only its own connection:

* every connection is TLS 1.3 with this run's ephemeral certificate (``xrun.channel.tls_server``); the agents
  pin its fingerprint (head mode) or the server proves the shared key first (pod mode);
* each one's ``auth`` -> ``challenge`` -> hello proves the key of the node it names, bound to this connection
  (``xrun.channel.handshake``); the keys and the rule that a node's place is taken once are ``NodeKeys``';
* strangers are bounded (``xrun.channel.admission``): at most ``total`` pending connections, ``per_source`` from
  one address, and a source whose proofs keep failing is refused at ``accept`` for a while; at the open-files
  limit a spare descriptor lets the server shed the queued connection instead of spinning on ``accept``.

A stranger is closed without a word back; ``strays`` counts them for the job's last lines.
"""

from __future__ import annotations

import errno
import os
import resource
import socket
from typing import TYPE_CHECKING

from xrun.channel import Message
from xrun.channel.admission import Admission, PendingLimits, SpareFd, fd_headroom
from xrun.channel.handshake import ServerHandshake
from xrun.runner.job.keys import NodeKeys

if TYPE_CHECKING:
    from xrun.channel.tls_server import ServerIdentity
    from xrun.runner.job.connections import Conn

PENDING_TOTAL = 512  # strangers at once, all sources: a few MiB of buffers at most
PENDING_PER_SOURCE = 16  # ... from one address (a node runs one agent; all of a test's agents share loopback)
OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
REFUSALS_PER_TURN = 256


KEEP_DESCRIPTORS = 128  # beside one per node: node 0's own agent (pod mode) needs its ranks' pipes and logs


def limits_for(nodes: int, room: int | None = None) -> PendingLimits:
    """Room for every node's agent to connect at once, even from one address, and bounds for the rest; with
    ``room`` (the descriptors strangers may hold: ``descriptor_room``) never more pending than that, so a flood
    under a low ``ulimit -n`` cannot take the descriptors the nodes and node 0's agent need (issue 22 §2)."""
    total = max(PENDING_TOTAL, nodes + PENDING_PER_SOURCE)
    if room is not None:
        total = max(PENDING_PER_SOURCE, min(total, room))
    return PendingLimits(total=total, per_source=min(total, max(PENDING_PER_SOURCE, nodes)))


def descriptor_room(nodes: int) -> int | None:
    """How many descriptors pending strangers may take under ``RLIMIT_NOFILE``, keeping one per node (its
    admitted connection) and ``KEEP_DESCRIPTORS``; None where the open descriptors cannot be counted."""
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return fd_headroom(soft, in_use, keep=KEEP_DESCRIPTORS + nodes)


def _mint() -> ServerIdentity:
    # Lazy: the certificate's module (and, in a forked child, cryptography) loads only for a head that listens,
    # never for the local run's one-node job (~7 ms of its start, python -X importtime)
    from xrun.channel.tls_server import ServerIdentity

    return ServerIdentity.mint_apart()


class Gate:
    """The control server's door: the TLS context, each connection's handshake, the keys, the bounds."""

    def __init__(self, keys: NodeKeys, *, nodes: int, prove_server: bool,
                 identity: ServerIdentity | None = None, in_process: bool = False) -> None:
        # in process: the one node's link is a socketpair (xrun.joined.one_node): no certificate to mint
        self.identity = None if in_process else identity if identity is not None else _mint()
        self.tls = None if self.identity is None else self.identity.server_context()
        self.keys = keys
        self.prove_server = prove_server
        self.admission = Admission(limits_for(nodes, descriptor_room(nodes)))
        self.spare = SpareFd()
        self.held: dict[int, list[tuple[Conn, Message]]] = {}  # hellos waiting for their node's announced key
        self.strays = 0

    @classmethod
    def in_process(cls) -> Gate:
        """The door of a head whose one node is this process's own agent (the local run): no listener, no TLS; its
        one connection is a plain one (``Connections.open_plain``) whose hello is trusted."""
        return cls(NodeKeys(1, shared=b""), nodes=1, prove_server=False, in_process=True)  # no key awaited

    @property
    def fingerprint(self) -> str:
        assert self.identity is not None, "an in-process gate has no certificate"
        return self.identity.fingerprint

    def handshake(self) -> ServerHandshake:
        return ServerHandshake(self.keys.for_node, self.fingerprint, prove_server=self.prove_server)

    def accept(self, listener: socket.socket) -> tuple[socket.socket, str] | None:
        """The next queued connection that may come in; None when none is queued, none could be taken, or a run
        of refusals used up this turn (the loop comes back: a flood never holds it here)."""
        for _ in range(REFUSALS_PER_TURN):
            try:
                sock, peer = listener.accept()
            except OSError as err:
                if err.errno in OUT_OF_FILES:
                    self.spare.shed(listener)  # take it off the queue and close it, or the listener stays readable
                return None
            ip = str(peer[0])
            if self.admission.admit(ip):
                return sock, ip
            sock.close()  # over a bound, or a source that keeps failing: not a byte read or sent
            self.strays += 1
        return None

    def waits_for_key(self, conn: Conn, msg: Message) -> bool:
        """Hold a hello whose node's key is still to be announced (pdsh: it comes on the engine's stream)."""
        node = msg.get("node_rank")
        if not isinstance(node, int) or isinstance(node, bool) or not self.keys.awaited(node):
            return False
        self.held.setdefault(node, []).append((conn, msg))
        return True

    def announced(self, node: int, key_hex: str) -> list[tuple[Conn, Message]]:
        """A node's agent announced its key: the hellos that waited for it, to be judged now."""
        if not self.keys.announce(node, key_hex):
            return []
        return self.held.pop(node, [])

    def admitted(self, conn: Conn, node: int) -> None:
        self.keys.claim(node)
        self.admission.release(conn.peer)

    def dropped(self, conn: Conn, *, failed: bool) -> None:
        """A connection that never got in is closed; ``failed``: it broke the protocol or failed its proof."""
        if conn.node is not None:
            return
        self.admission.release(conn.peer)
        node = conn.handshake.node_rank
        if node is not None and node in self.held:  # a hello that waited for its key: gone with its connection
            self.held[node] = [(c, m) for c, m in self.held[node] if c is not conn]
        if failed:
            self.admission.failed(conn.peer)
            self.strays += 1

    def close(self) -> None:
        self.spare.release()
