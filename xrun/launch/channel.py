"""The control channel's wire format: length-prefixed JSON messages between the runner and each node agent.

``launch`` owns the wire because it is the lower layer: the agent (``xrun.launch.connect``) and the runner's
server (``xrun.runner.control``) both import this module, and neither defines a message of its own.

Frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON, an object with a ``"type"`` key.

Agent -> runner                                   Runner -> agent
  hello(token, node_rank, host, pid, addr,          spec(spec)            after a valid hello only (head mode)
        versions[, digest])                         accept                after a valid hello (pod mode)
  ready(master_port)                                waiting(ready, total, missing, elapsed)   pod mode's barrier
  started                                           start(master_addr, master_port)   the start barrier
  rank_exited(rank, local_rank, code, signal,      stop(signal, deadline, reason)
              tail, figures)
  done(exit_code, result)                           verdict(exit_code, host, rank, reason, interrupted_by,
  pong / error(message)                                     stopped_after)   pod mode: how the job ended
  want_stacks(reason)   SIGQUIT reached an agent    ping
  stacks(id, stacks, problem)   answers dump        signal(signal)        --forward_signals: to every rank
    (id "stop": taken before a stop, sent before done)
  quiet(silent_for) / spoke   --hang_timeout        dump(id, reason)      take every live rank's stack
  output(fd, text)   pod mode: its console's lines,  stop(..., stacks)     stacks: take them before stopping
                     shown on node 0's console

Pod mode (``xrun.runner.podrun``): node 0's xrun hosts the server; the hello's ``token`` is the channel key
(``xrun.runner.secret.channel_key``) and ``digest`` the node's plan digest; no spec is ever sent, and every node
exits with the code its ``verdict`` carries.

A connection that does not open with a valid hello within ``HELLO_TIMEOUT`` is closed without a byte sent
back: a stray (or hostile) client learns nothing, not even which check failed.

Liveness: both ends set TCP keepalive (idle ``KEEPALIVE_IDLE`` s, then ``KEEPALIVE_COUNT`` probes
``KEEPALIVE_INTERVAL`` s apart) and ``TCP_USER_TIMEOUT`` so unacknowledged data fails the socket after
``USER_TIMEOUT`` s; the runner also pings every ``PING_INTERVAL`` s and declares an agent lost after
``DEAD_AFTER`` s of silence. A silent cut is therefore noticed within about 10 s on either side; a process
death (``kill -9``, node power-off with the kernel alive on the other end) is noticed at once through EOF.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
from collections import deque
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a spec with a large environment still fits; anything bigger is garbage
MAX_HELLO = 64 * 1024  # before authentication a peer may send only this much
HELLO_TIMEOUT = 10.0

PING_INTERVAL = 2.0
DEAD_AFTER = 10.0
KEEPALIVE_IDLE = 2
KEEPALIVE_INTERVAL = 2
KEEPALIVE_COUNT = 3
USER_TIMEOUT = 10.0

Message = dict[str, Any]


class Kind(str, enum.Enum):
    """Every message type on the wire (the ``"type"`` field)."""

    HELLO = "hello"
    SPEC = "spec"
    READY = "ready"
    START = "start"
    STARTED = "started"
    RANK_EXITED = "rank_exited"
    DONE = "done"
    STOP = "stop"
    PING = "ping"
    PONG = "pong"
    ERROR = "error"
    ACCEPT = "accept"  # pod mode: the hello's key and plan digest match node 0's
    WAITING = "waiting"  # pod mode: the barrier's status, for every node's console
    VERDICT = "verdict"  # pod mode: the job's exit code and root cause, once every node is over
    SIGNAL = "signal"  # --forward_signals: pass this signal on to every rank; the job goes on
    DUMP = "dump"  # the hang doctor (issue 14): take every live rank's stack, answer with stacks
    STACKS = "stacks"  # a node's answer to dump: its ranks' stacks, or the problem that prevents them
    WANT_STACKS = "want_stacks"  # SIGQUIT reached an agent (pod mode: any node's xrun): dump the whole job
    QUIET = "quiet"  # --hang_timeout: none of this node's ranks has written output for that long
    SPOKE = "spoke"  # the first output after quiet
    OUTPUT = "output"  # pod mode: what a node's console wrote (fd 1 or 2), for node 0's merged console


STOP_STACKS = "stop"  # the id of the stacks a node took before its ranks were stopped (not an answer to dump)


class ChannelError(Exception):
    """The peer broke the protocol or went away; ``reason`` is one line for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def message(kind: Kind, **fields: Any) -> Message:
    return {"type": kind.value, **fields}


def encode(msg: Message) -> bytes:
    # surrogatepass: env values read with Python's surrogateescape (bytes that are not UTF-8) survive the trip.
    body = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise ChannelError(f"message {msg.get('type')!r} is {len(body)} bytes, over the {MAX_FRAME}-byte limit")
    return HEADER.pack(len(body)) + body


def output_message(fd: int, data: bytes) -> Message:
    """A console write as a message; its bytes survive the trip whatever they are (see ``output_bytes``)."""
    return message(Kind.OUTPUT, fd=fd, text=data.decode("utf-8", "surrogateescape"))


def output_bytes(msg: Message) -> tuple[int, bytes]:
    """An output message's console fd and its bytes, as the node wrote them."""
    fd, text = msg.get("fd"), msg.get("text")
    if fd not in (1, 2) or isinstance(fd, bool) or not isinstance(text, str):
        raise ChannelError(f"output: fd {fd!r} and text of type {type(text).__name__} (want 1 or 2, and a string)")
    return fd, text.encode("utf-8", "surrogateescape")


def decode_body(body: bytes) -> Message:
    try:
        msg = json.loads(body.decode("utf-8", "surrogatepass"))
    except (UnicodeError, ValueError) as err:
        raise ChannelError(f"undecodable message ({err.__class__.__name__})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ChannelError("message is not a JSON object with a 'type'")
    return msg


class FrameReader:
    """Incremental decoder: feed whatever ``recv`` returned, take complete messages out in order.

    ``limit`` caps one frame; the server lowers it to ``MAX_HELLO`` until the peer has authenticated.
    """

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._ready: deque[Message] = deque()

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return (and consume) every message now complete."""
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self.limit:
                raise ChannelError(f"frame of {size} bytes exceeds the {self.limit}-byte limit")
            if len(self._buffer) < HEADER.size + size:
                break
            body = bytes(self._buffer[HEADER.size : HEADER.size + size])
            del self._buffer[: HEADER.size + size]
            self._ready.append(decode_body(body))
        out = list(self._ready)
        self._ready.clear()
        return out

    def push_back(self, messages: list[Message]) -> None:
        """Keep messages that arrived together with the one a blocking reader wanted."""
        self._ready.extendleft(reversed(messages))

    @property
    def pending(self) -> int:
        return len(self._buffer)


def token_matches(expected: str, offered: Any) -> bool:
    """Constant-time comparison; anything that is not a string fails."""
    import hmac  # noqa: PLC0415 - the server's check; an agent never compares (hmac loads OpenSSL: ~2 ms)

    if not isinstance(offered, str):
        return False
    return hmac.compare_digest(expected.encode("utf-8"), offered.encode("utf-8"))


def tune_socket(sock: socket.socket) -> None:
    """Low latency for small messages and a bounded time to notice a silent peer (see the module doc)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", int(USER_TIMEOUT * 1000)),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has all four; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


# ---------------------------------------------------------------------------------------------------------------
# Blocking helpers for the agent's start-up phase (before the rank group's event loop runs).


def send(sock: socket.socket, msg: Message) -> None:
    sock.sendall(encode(msg))


def recv(sock: socket.socket, reader: FrameReader, *, timeout: float | None) -> Message:
    """The next message, blocking up to ``timeout`` seconds; EOF or timeout raises ChannelError."""
    sock.settimeout(timeout)
    try:
        data = b""
        while True:
            ready = reader.feed(data)
            if ready:
                reader.push_back(ready[1:])
                return ready[0]
            try:
                data = sock.recv(65536)
            except socket.timeout:
                raise ChannelError(f"no message within {timeout:g} s") from None
            except OSError as err:
                raise ChannelError(f"connection failed: {err.strerror or err}") from None
            if not data:
                raise ChannelError("connection closed by the peer")
    finally:
        sock.settimeout(None)
