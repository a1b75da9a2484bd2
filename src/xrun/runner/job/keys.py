"""Who may take each node's place on the control channel: the key its agent must prove, and each place once.

The head never sends a key: an agent proves it holds one (``xrun.channel.handshake``), bound to this TLS
connection. Where the key comes from depends on the backend (``xrun.runner.backends``):

* one run secret for every node (``NodeKeys.shared``): the ssh backend hands it to each agent on its session's
  stdin, the engines (mpirun, hydra, srun) in their own environment, exported by name; no other user can read
  either (``/proc/PID/environ`` is the owner's alone);
* a key per node that the node's own agent makes and announces on its own output stream (``NodeKeys.announced``:
  pdsh, whose remote command line every user of the node can read in ``ps``); the stream reaches the head over
  the engine's encrypted ssh session, labelled with the host, and only that host's announcement sets that node's
  key. A hello that comes before its node's key waits for it (``awaited``).

Either way a place is taken once: after its agent is admitted, no key opens it again (``claim``), so a second
agent for the same node (a stray copy, or another user who read something) proves nothing. The one exception is
pod mode with ``--max_restarts``: once the admitted agent's connection is closed, its place reopens (``release``)
for a node that comes back, so one live agent at most holds it at any time.
"""

from __future__ import annotations

from xrun.channel.proof import ANNOUNCED_KEY_HEX, HEAD_PURPOSE, token_key


class NodeKeys:
    """The key each node's agent must prove, until its place is taken."""

    def __init__(self, nodes: int, *, shared: bytes | None) -> None:
        self._nodes = nodes
        self._shared = shared
        self._announced: dict[int, bytes] = {}
        self._claimed: set[int] = set()

    @classmethod
    def shared_secret(cls, nodes: int, secret: str) -> NodeKeys:
        """Every node proves the key derived from ``secret`` (the run's token)."""
        return cls(nodes, shared=token_key(secret, HEAD_PURPOSE))

    @classmethod
    def announced(cls, nodes: int) -> NodeKeys:
        """Each node proves the one-time key its agent announces (``announce``)."""
        return cls(nodes, shared=None)

    def for_node(self, node: int) -> bytes | None:
        """The key node ``node`` must prove; None: no such node, its place is taken, or no key yet."""
        if not 0 <= node < self._nodes or node in self._claimed:
            return None
        return self._shared if self._shared is not None else self._announced.get(node)

    def awaited(self, node: int) -> bool:
        """Is ``node``'s key still to be announced (its hello waits for it)?"""
        return self._shared is None and 0 <= node < self._nodes and node not in self._claimed \
            and node not in self._announced

    def announce(self, node: int, key_hex: str) -> bool:
        """Node ``node``'s agent announced its one-time key; the first announcement counts, later ones do not."""
        if self._shared is not None or not 0 <= node < self._nodes or node in self._announced:
            return False
        if len(key_hex) != ANNOUNCED_KEY_HEX or not all(c in "0123456789abcdef" for c in key_hex):
            return False
        self._announced[node] = token_key(key_hex, HEAD_PURPOSE)
        return True

    def claim(self, node: int) -> None:
        """Node ``node``'s agent is admitted: its place is taken (for good, unless ``release``)."""
        self._claimed.add(node)

    def release(self, node: int) -> None:
        """Pod mode with --max_restarts only: node ``node``'s admitted connection is closed, so its place opens
        again for one agent that proves the key (a re-created pod: xrun.runner.job.machine)."""
        self._claimed.discard(node)

