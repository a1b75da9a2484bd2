"""A load generator for the control plane: N simulated node agents in one process, one selector, no threads.

Each ``SimAgent`` speaks the channel protocol (``xrun.channel``) the way a real agent does (TLS 1.3 with the
server's certificate pinned by its fingerprint, ``auth`` -> ``challenge`` -> the hello proving the run token's
key, ``spec`` -> ``ready``, ``start``, ``ping`` -> ``pong``, ``stop`` -> ``done``) but starts no rank, so
10,000 of them fit in one process and what is measured is the control server (``xrun.runner.job.control_server``) alone,
handshakes included. TLS runs over memory buffers (``SSLContext.wrap_bio``), so no agent ever blocks the selector.
Connections are opened ``connect_batch`` at a time (a listen backlog is finite; a burst of 10,000 SYNs would
measure the kernel's SYN retry timer instead of xrun). Times are ``time.monotonic()`` in this process.

    gen = LoadGen("127.0.0.1", port, token, fingerprint, nodes=10_000)
    gen.join(timeout=60)          # every agent connected, proved the key, got its spec, said ready, got start
    gen.fail(node=0, code=7)      # node 0's rank exits 7: the server must stop all the others
    gen.finish(timeout=30)        # every agent got stop, said done, saw its connection close
"""

from __future__ import annotations

import errno
import selectors
import socket
import ssl
import time
from collections.abc import Callable

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.channel.handshake import ClientHandshake
from xrun.channel.proof import HEAD_PURPOSE, token_key
from xrun.channel.tls import client_context, peer_fingerprint, pin_ok


class SimAgent:
    """One simulated node agent: a non-blocking socket, its TLS session in memory, its handshake, its unsent
    bytes and when each step happened."""

    __slots__ = ("node", "sock", "tls", "incoming", "outgoing", "handshake", "reader", "out", "connected",
                 "hello_at", "start_at", "stop_at", "closed_at", "pings")

    def __init__(self, node: int, sock: socket.socket, ctx: ssl.SSLContext) -> None:
        self.node = node
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_side=False)
        self.handshake: ClientHandshake | None = None  # once TLS is up and the certificate is the pinned one
        self.reader = channel.FrameReader()
        self.out = bytearray()
        self.connected = False
        self.hello_at: float | None = None
        self.start_at: float | None = None
        self.stop_at: float | None = None
        self.closed_at: float | None = None
        self.pings = 0


class LoadGen:
    def __init__(self, host: str, port: int, token: str, fingerprint: str, *, nodes: int,
                 connect_batch: int = 256) -> None:
        self.addr = (host, port)
        self.key = token_key(token, HEAD_PURPOSE)  # what a real agent derives from --token
        self.fingerprint = fingerprint
        self.ctx = client_context()
        self.nodes = nodes
        self.batch = connect_batch
        self.sel = selectors.DefaultSelector()
        self.agents: list[SimAgent] = []
        self.connecting = 0
        self.failed_at: float | None = None
        self.errors: list[str] = []
        self.bytes_in = 0  # what the server sent, over every agent
        self.bytes_out = 0

    # -- phases ---------------------------------------------------------------------------------------------

    def join(self, *, timeout: float) -> None:
        """Connect every agent and run the start barrier until every agent has its ``start``."""
        self._run_until(lambda: len(self.agents) == self.nodes and all(a.start_at for a in self.agents), timeout)

    def fail(self, *, node: int, code: int) -> None:
        """``node``'s only rank exits ``code`` (what its agent reports), then its agent is done."""
        agent = self.agents[node]
        self.failed_at = time.monotonic()
        self._send(agent, message(Kind.RANK_EXITED, rank=node, local_rank=0, code=code, signal=None, tail=[]))
        self._send(agent, message(Kind.DONE, exit_code=code))

    def finish(self, *, timeout: float) -> None:
        """Run until the server has closed every connection (after each agent answered its stop)."""
        self._run_until(lambda: all(a.closed_at for a in self.agents), timeout)

    def serve(self, seconds: float) -> None:
        """Answer pings for a while (the job running)."""
        end = time.monotonic() + seconds
        self._run_until(lambda: time.monotonic() >= end, seconds + 1)

    # -- figures --------------------------------------------------------------------------------------------

    def last(self, field: str, *, skip: int | None = None) -> float | None:
        """The latest time ``field`` was stamped over every agent (but ``skip``); None if one never was."""
        stamps = [getattr(a, field) for a in self.agents if a.node != skip]
        return None if not stamps or any(s is None for s in stamps) else max(stamps)

    # -- the loop -------------------------------------------------------------------------------------------

    def _run_until(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        checked = 0.0
        while True:
            self._open_more()
            now = time.monotonic()
            if now - checked > 0.05 or not self.sel.get_map():  # the predicate is O(agents): not per event
                checked = now
                if done():
                    return
            if now > deadline:
                raise TimeoutError(f"load generator: not done within {timeout:g} s ({self._state()})")
            for key, events in self.sel.select(0.05):
                agent: SimAgent = key.data
                if events & selectors.EVENT_WRITE:
                    self._writable(agent)
                if events & selectors.EVENT_READ and agent.closed_at is None:
                    self._readable(agent)

    def _open_more(self) -> None:
        while self.connecting < self.batch and len(self.agents) < self.nodes:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            err = sock.connect_ex(self.addr)
            if err not in (0, errno.EINPROGRESS):
                sock.close()
                raise OSError(err, f"load generator: cannot connect to {self.addr}")
            agent = SimAgent(len(self.agents), sock, self.ctx)
            self.agents.append(agent)
            self.connecting += 1
            self.sel.register(sock, selectors.EVENT_WRITE, agent)

    def _writable(self, agent: SimAgent) -> None:
        if not agent.connected:  # the connect finished
            self.connecting -= 1
            agent.connected = True
            err = agent.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._close(agent, f"connect failed: {errno.errorcode.get(err, err)}")
                return
            self._tls_step(agent)  # the ClientHello
        self._flush(agent)

    def _tls_step(self, agent: SimAgent) -> bool:
        """Advance the TLS handshake; True once it is done and the server is the pinned one (then ``auth``)."""
        try:
            agent.tls.do_handshake()
        except ssl.SSLWantReadError:
            agent.out += agent.outgoing.read()
            return False
        except ssl.SSLError as err:
            self._close(agent, f"TLS handshake failed: {err.reason or err}")
            return False
        agent.out += agent.outgoing.read()
        if not pin_ok(self.fingerprint, peer_fingerprint(agent.tls)):
            self._close(agent, "the server's certificate is not the pinned one")
            return False
        agent.handshake = ClientHandshake(self.key, self.fingerprint, agent.node, expect_server_proof=False)
        self._send(agent, agent.handshake.auth_message())
        return True

    def _readable(self, agent: SimAgent) -> None:
        try:
            data = agent.sock.recv(65536)
        except BlockingIOError:
            return
        except ConnectionResetError as err:  # after stop and done, the server closing with our pong unread: normal
            self._close(agent, None if agent.stop_at is not None else f"recv failed: {err}")
            return
        except OSError as err:
            self._close(agent, f"recv failed: {err}")
            return
        if not data:
            self._close(agent, None)
            return
        self.bytes_in += len(data)
        agent.incoming.write(data)
        if agent.handshake is None and not self._tls_step(agent):
            self._flush(agent)
            return
        try:
            for msg in agent.reader.feed(self._plaintext(agent)):
                self._answer(agent, msg)
        except (ChannelError, ssl.SSLError) as err:
            self._close(agent, f"bad bytes from the server: {err}")

    def _plaintext(self, agent: SimAgent) -> bytes:
        chunks = []
        while True:
            try:
                chunk = agent.tls.read(65536)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def _answer(self, agent: SimAgent, msg: Message) -> None:
        kind, now = msg.get("type"), time.monotonic()
        if kind == Kind.CHALLENGE.value and agent.handshake is not None:
            problem = agent.handshake.on_challenge(msg)
            if problem is not None:
                self._close(agent, f"bad challenge: {problem.reason}")
                return
            agent.hello_at = now
            self._send(agent, self._hello(agent.node, agent.handshake.proof_fields()))
        elif kind == Kind.SPEC.value:
            port = 29500 if msg.get("pick_master_port") else None
            self._send(agent, message(Kind.READY, master_port=port))
        elif kind == Kind.START.value:
            agent.start_at = now
            self._send(agent, message(Kind.STARTED))
        elif kind == Kind.PING.value:
            agent.pings += 1
            self._send(agent, message(Kind.PONG))
        elif kind == Kind.STOP.value:
            if agent.stop_at is None:
                agent.stop_at = now
                self._send(agent, message(Kind.DONE, exit_code=128 + int(msg.get("signal") or 15)))

    def _hello(self, node: int, proof_fields: dict[str, object]) -> Message:
        return message(Kind.HELLO, **proof_fields, host=f"sim{node}", pid=node + 1,
                       addr="127.0.0.1", versions={"xrun": _xrun_version(), "spec": 1})

    def _send(self, agent: SimAgent, msg: Message) -> None:
        if agent.closed_at is not None:
            return
        agent.tls.write(channel.encode(msg))
        agent.out += agent.outgoing.read()
        self._flush(agent)

    def _flush(self, agent: SimAgent) -> None:
        try:
            sent = agent.sock.send(agent.out) if agent.out else 0
        except BlockingIOError:
            sent = 0
        except OSError as err:
            self._close(agent, f"send failed: {err}")
            return
        self.bytes_out += sent
        del agent.out[:sent]
        self.sel.modify(agent.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if agent.out else 0), agent)

    def _close(self, agent: SimAgent, error: str | None) -> None:
        if agent.closed_at is not None:
            return
        if not agent.connected:
            self.connecting -= 1
            agent.connected = True  # counted once
        agent.closed_at = time.monotonic()
        if error:
            self.errors.append(f"node {agent.node}: {error}")
        self.sel.unregister(agent.sock)
        agent.sock.close()

    def close(self) -> None:
        for agent in self.agents:
            self._close(agent, None)
        self.sel.close()

    def _state(self) -> str:
        counts = {f: sum(1 for a in self.agents if getattr(a, f)) for f in ("hello_at", "start_at", "stop_at",
                                                                           "closed_at")}
        return f"{len(self.agents)} agents, " + ", ".join(f"{k[:-3]} {v}" for k, v in counts.items())


def _xrun_version() -> str:
    from xrun import __version__

    return __version__
