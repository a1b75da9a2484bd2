"""The agent's connection to the runner (head mode) or to node 0 (pod mode): reached, secured, read and written.

``connect`` is the whole opening, written once for both modes: TCP, TLS, the server checked (head mode: its
certificate against the pinned fingerprint; pod mode: its proof of the job's secret, first), this agent's proof
and its hello (xrun.channel.link). A server that is not up yet, or that closes before the handshake is through
(at its bound of unproven connections, or still starting), is tried again until the ``Server``'s timeout; one that
is not the pinned one, or cannot prove the key, is refused at once. Head mode retries only a refused connection
for ``CONNECT_TIMEOUT`` s (the runner listens before any agent starts); pod mode's node 0 may start last, so any
failure is retried until ``--join_timeout``, with a line now and then.

``Connection`` is an open link's two directions. One reader thread turns each message into the machine's event
(``xrun.launch.session.events.message_event``) and posts it; silence longer than the keepalive's bound
(``DEAD_AFTER``), or a broken or closed link, is ``LinkLost``. Sends go out at once from whichever thread calls,
except while the console's thread is in a forward of the node's line records (``forward_lines``): then they wait
in order and that thread sends them after its own, so the loop that supervises the ranks never waits on a slow
head or node 0 (issue 25 §3). ``send_final`` waits (up to ``DEAD_AFTER``) for its message to go out: a node's last word.
"""

from __future__ import annotations

import collections
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from xrun import __version__
from xrun.channel import DEAD_AFTER, HELLO_TIMEOUT, ChannelError, Kind, Message, lines_messages, message, tune_socket
from xrun.channel.link import Credentials, Link, open_link
from xrun.common.network.interfaces import resolvable
from xrun.common.output.render import Lines
from xrun.common.output.status import say
from xrun.common.spec import SPEC_VERSION
from xrun.launch.session.events import Event, LinkLost, message_event

CONNECT_TIMEOUT = 15.0  # head mode: the runner listens before any agent starts; this covers only a slow network
SPEC_TIMEOUT = 30.0  # head mode: the spec follows the hello at once
# A server at its bound of unproven connections closes new ones at once: try again (xrun.runner.job.gate).
RETRYABLE = ("the server closed the connection during the TLS handshake", "TLS handshake with the server failed")
RETRY_EVERY = 0.5  # pod mode: between attempts to reach node 0
RETRY_LINE_EVERY = 10.0  # pod mode: the "still waiting for node 0" line
WRONG_KEY = ("node 0 could not prove this job's secret: is XRUN_TOKEN/--token_file the same on every node? "
             "(without one: the run id, --run_id, --master_addr, --master_port)")


class Server(NamedTuple):
    """Where the agent connects, and for how long it keeps trying (a typed record: see
    ``xrun.launch.session.events`` for why a NamedTuple)."""

    addr: str
    port: int
    timeout: float
    node0: str | None = None  # pod mode: node 0's name in the plan; it may come up after this node


def connect(server: Server, credentials: Credentials, node_rank: int, *,
            hello_extra: Mapping[str, Any] | None = None) -> Link:
    """Reach ``server``, secure the link, prove the key and say hello (with ``hello_extra``: pod mode's digest).
    A ``ChannelError`` says why not, in one line."""
    deadline = time.monotonic() + server.timeout
    while True:
        sock = _reach(server, deadline)
        left = deadline - time.monotonic()
        try:
            return open_link(sock, credentials, node_rank,
                             functools.partial(hello, addr=sock.getsockname()[0], extra=hello_extra),
                             timeout=max(1.0, left) if server.node0 is None else max(2.0, min(HELLO_TIMEOUT, left)))
        except ChannelError as err:
            sock.close()
            _handshake_again(server, err, deadline)


def _handshake_again(server: Server, err: ChannelError, deadline: float) -> None:
    """Return to try the handshake again, or raise why not."""
    late = time.monotonic() >= deadline
    if server.node0 is None:  # head mode
        if late or not err.reason.startswith(RETRYABLE):
            raise err
        time.sleep(0.2)
        return
    if err.reason.startswith("the server did not prove"):
        raise ChannelError(WRONG_KEY) from None
    if late:
        raise ChannelError(f"node 0 ({server.node0}) did not complete the channel's handshake within --join_timeout "
                           f"{server.timeout:g} s: {err.reason}") from None
    time.sleep(RETRY_EVERY)


def _reach(server: Server, deadline: float) -> socket.socket:
    """A TCP connection to ``server``: head mode retries a refusal (a listener still coming up), pod mode any
    failure (a refused, unreachable or unresolvable node 0), until ``deadline``."""
    next_line = None
    while True:
        left = deadline - time.monotonic()
        try:
            sock = socket.create_connection(
                (resolvable(server.addr), server.port),  # type: ignore[arg-type] # bytes: getaddrinfo takes them
                timeout=max(0.1, left) if server.node0 is None else max(0.2, min(5.0, left)))
        except OSError as err:
            why = err.strerror or str(err)
            if server.node0 is None:
                if left <= 0 or not isinstance(err, ConnectionRefusedError):
                    raise ChannelError(f"cannot reach the runner at {server.addr}:{server.port}: {why}") from None
                time.sleep(0.2)
                continue
            if left <= 0:
                raise ChannelError(f"node 0 ({server.node0}) did not open the control channel at {server.addr}:"
                                   f"{server.port} within --join_timeout {server.timeout:g} s ({why}): is it "
                                   "running?") from None
            next_line = _say_waiting(server, why, left, next_line)
            time.sleep(min(RETRY_EVERY, max(0.0, left)))
            continue
        sock.settimeout(None)
        tune_socket(sock)
        return sock


def _say_waiting(server: Server, why: str, left: float, next_line: float | None) -> float:
    """Pod mode: one line at the first failure to reach node 0, then one every ``RETRY_LINE_EVERY`` s."""
    now = time.monotonic()
    if next_line is None:
        say(f"node 0's control channel at {server.addr}:{server.port} is not up yet ({why}); retrying until "
            f"--join_timeout ({left:.0f} s left)")
    elif now >= next_line:
        say(f"still waiting for node 0 ({server.node0}) at {server.addr}:{server.port}: {left:.0f} s left")
    else:
        return next_line
    return now + RETRY_LINE_EVERY


def hello(proof_fields: Mapping[str, Any], addr: str, extra: Mapping[str, Any] | None = None) -> Message:
    """The hello, with this connection's proof (``proof``, ``node_rank``: xrun.channel.handshake; an in-process
    link's: ``node_rank`` alone), from ``addr``: this node's address on the route to the server, what peers can
    use."""
    return message(
        Kind.HELLO,
        **proof_fields,
        host=socket.gethostname(),
        pid=os.getpid(),
        addr=addr,
        versions={"xrun": __version__, "spec": SPEC_VERSION, "python": sys.version.split()[0],
                  "executable": sys.executable},
        **(extra or {}),
    )


class Connection:
    """An open link read by one thread and written from any (see the module doc)."""

    def __init__(self, link: Link, post: Callable[[Event], None], *, first_timeout: float = DEAD_AFTER) -> None:
        self._link = link
        self._post = post
        self._first_timeout = first_timeout
        self._send_lock = threading.Lock()
        self._outbox: collections.deque[Message] = collections.deque()  # to send, in order
        self._connected = True
        self._closing = False
        self._reader = threading.Thread(target=self._read_forever, name="xrun-channel", daemon=True)
        self._reader.start()

    @property
    def near(self) -> str:
        """This end's address: where rank 0's store should listen to be reached on the same route."""
        return str(self._link.sock.getsockname()[0])

    def send(self, msg: Message) -> None:
        """Send now, or leave it to the thread that is sending (see the module doc)."""
        if self._connected:
            self._outbox.append(msg)
            self._send_waiting()

    def send_final(self, msg: Message) -> bool:
        """Send ``msg`` and wait (up to ``DEAD_AFTER``) for it, and what went before, to go out; whether it did."""
        if not self._connected:
            return False
        self._outbox.append(msg)
        self._send_waiting(wait=DEAD_AFTER)  # the node's last word: worth waiting for a forward in flight
        return self._connected and not self._outbox

    def forward_lines(self, fd: int, lines: Lines) -> bool:
        """Hand a console write, the node's line records, to the head or node 0 (xrun.common.output.consoleroute).
        False: the channel is gone. Called by the console's thread (xrun.common.output.writer), never by the loop:
        it may block."""
        if not self._connected:
            return False
        try:
            with self._send_lock:
                for msg in lines_messages(fd, lines.host, lines.records):
                    self._link.send(msg)
        except OSError:
            self._connected = False
            return False
        self._send_waiting()  # what the loop handed over meanwhile
        # sent: the lines are the head's to show, even if the connection closed since (a False here had the caller
        # write them here too: the last lines of a one-node job, and of pod mode's node 0, twice)
        return True

    def close(self) -> None:
        """End the reader first, then release the socket it reads."""
        self._closing = True
        self._connected = False
        try:
            self._link.sock.shutdown(socket.SHUT_RDWR)  # the reader's recv returns at once
        except OSError:
            pass
        self._reader.join(timeout=2.0)
        self._link.close()

    def _send_waiting(self, wait: float = 0.0) -> None:
        """Send what waits, unless another thread is sending (within ``wait`` s): that one sends it after its own."""
        while self._outbox and self._send_lock.acquire(timeout=wait if wait > 0 else -1, blocking=wait > 0):
            try:
                while self._outbox:
                    self._link.send(self._outbox.popleft())
            except OSError:
                self._connected = False  # the reader reports the loss
                self._outbox.clear()
            finally:
                self._send_lock.release()

    def _read_forever(self) -> None:
        timeout, heard = self._first_timeout, False
        while True:
            try:
                msg = self._link.recv(timeout=timeout)
            except ChannelError as err:
                if self._closing:
                    return
                self._connected = False
                silent = heard and err.reason.startswith("no message")
                self._post(LinkLost(f"runner silent for {timeout:g} s" if silent else err.reason))
                return
            timeout, heard = DEAD_AFTER, True
            self._post(message_event(msg, clock_ns=time.time_ns()))
