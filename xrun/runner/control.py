"""The runner's control server: one per run, single-threaded (``selectors``), on the address the nodes use.

It accepts the agents' connections, checks each hello's token (constant time; a stray connection is closed
without a byte sent back), sends each node its spec, holds every rank at a start barrier until all nodes are
ready (or ``--join_timeout`` passes, naming the missing hosts), then watches: the first rank that fails on
its own stops every other node at once; Ctrl-C / SIGTERM stop all nodes gracefully (exit 128 + signal); an
agent whose connection drops or falls silent (pings every ``PING_INTERVAL`` s, lost after ``DEAD_AFTER`` s)
ends the job naming its host. The wire format lives in ``xrun.launch.channel``.

The backend that started the agents (ssh sessions, a pdsh process) plugs in as a ``Sessions`` object: it
relays the agents' output through this loop and reports sessions that end.
"""

from __future__ import annotations

import selectors
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from xrun import __version__
from xrun.launch import channel
from xrun.launch.channel import ChannelError, Kind, message
from xrun.launch.posix import signal_name
from xrun.launch.spec import NodeSpec
from xrun.runner.plan import Plan
from xrun.runner.status import make_status, say

LINGER = 3.0  # after every agent is done: time for the sessions to deliver the last output and exit
STOP_GRACE = 5.0  # beyond the agents' own shutdown deadline before a node counts as not stopping
NODE_FAILURE_EXIT = 1  # lost node, join timeout, agent error: no rank exit code to pass on
_TAIL_SHOWN = 10


class Sessions(Protocol):
    """What a backend started to carry the agents (ssh channels, one pdsh process)."""

    def register(self, loop: ControlServer) -> None:
        """Add readers (output relay, session exits) with ``loop.add_reader``."""

    def finished(self, lost: set[str]) -> bool:
        """Every session has ended (sessions to ``lost`` hosts may stay open: they are cut off)."""

    def terminate(self) -> None:
        """End every session still open (called once, at the end)."""


@dataclass(frozen=True)
class Failure:
    """The first thing that went wrong: a rank's exit, or a node-level problem (rank is None)."""

    host: str
    reason: str
    exit_code: int
    rank: int | None = None
    tail: tuple[str, ...] = ()


@dataclass
class _Node:
    spec: NodeSpec
    state: str = "waiting"  # waiting -> joined -> ready -> running -> done | lost
    conn: _Conn | None = None
    addr: str | None = None
    master_port: int | None = None
    exit_code: int | None = None
    last_seen: float = 0.0

    @property
    def host(self) -> str:
        return self.spec.host

    @property
    def over(self) -> bool:
        return self.state in ("done", "lost")


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: str
    opened: float
    reader: channel.FrameReader = field(default_factory=lambda: channel.FrameReader(channel.MAX_HELLO))
    node: _Node | None = None


class ControlServer:
    def __init__(self, plan: Plan, token: str, *, join_timeout: float, status: Any = None) -> None:
        self.plan = plan
        self.token = token
        self.join_timeout = join_timeout
        self.nodes = [_Node(spec) for spec in plan.nodes]
        self.sel = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []
        self.conns: set[_Conn] = set()
        self.status = status if status is not None else make_status(len(self.nodes))
        self.failure: Failure | None = None
        self.interrupted_by: int | None = None
        self.stopping = False
        self.started_at: float | None = None
        self.t0 = time.monotonic()
        self.failure_at: float | None = None
        self.all_over_at: float | None = None
        self.stop_deadline: float | None = None
        self.next_ping = 0.0
        self.next_status = 0.0
        self.signals: list[int] = []
        self.sigints = 0
        self.strays = 0
        # --elastic: torch's rendezvous is the barrier (xrun starts each agent as soon as it is ready), and a
        # node that leaves is torch's to handle while at least --min_nodes remain (issue 6).
        self.elastic = plan.nodes[0].elastic if plan.nodes else None

    # -- set-up ---------------------------------------------------------------------------------------------

    def listen(self, addrs: Iterable[str]) -> int:
        """Bind one listener per distinct address, all on the same (kernel-chosen) port."""
        port = 0
        for addr in dict.fromkeys(addrs):
            family = socket.AF_INET6 if ":" in addr else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
            except OSError as err:
                sock.close()
                self.close()
                raise ChannelError(f"cannot listen on {addr}:{port}: {err.strerror}") from None
            sock.listen(256)
            sock.setblocking(False)
            port = sock.getsockname()[1]
            self.listeners.append(sock)
            self.sel.register(sock, selectors.EVENT_READ, lambda s=sock: self._accept(s))
        return port

    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        self.sel.register(fileobj, selectors.EVENT_READ, callback)

    def remove_reader(self, fileobj: Any) -> None:
        try:
            self.sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, sessions: Sessions) -> int:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        saved_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        for signum, previous in saved.items():
            if previous is signal.SIG_IGN and signum != signal.SIGTERM:
                continue  # nohup / background job: keep ignoring, as asked
            signal.signal(signum, self._on_signal)
        self.add_reader(wake_r, lambda: self._drain_wakeup(wake_r))
        self.sessions = sessions
        try:
            sessions.register(self)
            while not self._finished():
                for key, _ in self.sel.select(self._timeout()):
                    key.data()
                while self.signals:
                    self._handle_signal(self.signals.pop(0))
                self._tick()
        finally:
            signal.set_wakeup_fd(saved_wakeup)
            for signum, previous in saved.items():
                signal.signal(signum, previous)  # type: ignore[arg-type]
            self.status.close()
            sessions.terminate()
            self.close()
            wake_r.close()
            wake_w.close()
        return self._report()

    def close(self) -> None:
        for sock in self.listeners:
            self.remove_reader(sock)
            sock.close()
        self.listeners.clear()
        for conn in list(self.conns):
            self._drop(conn)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)  # acted on by the loop

    @staticmethod
    def _drain_wakeup(sock: socket.socket) -> None:
        try:
            sock.recv(4096)
        except OSError:
            pass

    def _handle_signal(self, signum: int) -> None:
        if signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints > 1:  # second Ctrl-C: do not wait for the graceful deadline
                self._stop(signal.SIGKILL, "second SIGINT")
                return
        if self.interrupted_by is None:
            self.interrupted_by = signum
        self.status.line(f"got {signal.Signals(signum).name}; stopping every node")
        self._stop(signal.SIGTERM, f"xrun got {signal.Signals(signum).name}")

    def _timeout(self) -> float:
        now = time.monotonic()
        deadlines = [self.next_ping, self.next_status]
        if self.started_at is None and not self.stopping:
            deadlines.append(self.t0 + self.join_timeout)
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if self.all_over_at is not None:
            deadlines.append(self.all_over_at + LINGER)
        deadlines += [c.opened + channel.HELLO_TIMEOUT for c in self.conns if c.node is None]
        return max(0.0, min(deadlines) - now)

    def _tick(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self.conns if c.node is None and now - c.opened > channel.HELLO_TIMEOUT]:
            self._drop(conn)  # said nothing useful in time: a stray
        if now >= self.next_ping:
            self.next_ping = now + channel.PING_INTERVAL
            for node in self.nodes:
                if node.conn is None or node.over:
                    continue
                if now - node.last_seen > channel.DEAD_AFTER:
                    self._lose(node, f"no word from its agent for {channel.DEAD_AFTER:g} s (network cut or node down?)")
                else:
                    self._send(node, message(Kind.PING))
        if self.started_at is None and not self.stopping:
            if now - self.t0 >= self.join_timeout:
                missing = [n.host for n in self.nodes if n.state not in ("ready", "running")]
                self._fail(Failure(", ".join(missing), f"not ready within --join_timeout {self.join_timeout:g} s: "
                                   f"{', '.join(missing)}", NODE_FAILURE_EXIT))
            elif now >= self.next_status:
                self.next_status = now + 1.0
                self.status.waiting(self._ready_count(), self._missing(), now - self.t0)
        else:
            self.next_status = now + 3600
        if self.stop_deadline is not None and now >= self.stop_deadline:
            for node in self.nodes:
                if not node.over:
                    self._mark_lost(node, "did not stop before the deadline")
        if self.all_over_at is None and all(n.over or (self.stopping and n.conn is None) for n in self.nodes):
            self.all_over_at = now

    def _finished(self) -> bool:
        if self.all_over_at is None:
            return False
        lost = {n.host for n in self.nodes if n.state == "lost"}
        return self.sessions.finished(lost) or time.monotonic() >= self.all_over_at + LINGER

    # -- connections ----------------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, peer = listener.accept()
        except OSError:
            return
        sock.setblocking(True)
        sock.settimeout(5.0)  # bounds a send to a peer that stopped reading; reads happen only when readable
        channel.tune_socket(sock)
        conn = _Conn(sock=sock, peer=str(peer[0]), opened=time.monotonic())
        self.conns.add(conn)
        self.add_reader(sock, lambda: self._read(conn))

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except socket.timeout:
            return
        except OSError as err:
            self._closed(conn, f"connection error: {err.strerror or err}")
            return
        if not data:
            self._closed(conn, "connection closed")
            return
        try:
            for msg in conn.reader.feed(data):
                if conn.node is None:
                    self._hello(conn, msg)
                    if conn.node is None:
                        return
                else:
                    self._on_message(conn.node, msg)
        except ChannelError as err:
            self._closed(conn, f"protocol error: {err.reason}")

    def _hello(self, conn: _Conn, msg: dict[str, Any]) -> None:
        rank = msg.get("node_rank")
        if (
            msg.get("type") != Kind.HELLO.value
            or not channel.token_matches(self.token, msg.get("token"))
            or not isinstance(rank, int)
            or not 0 <= rank < len(self.nodes)
        ):
            self.strays += 1
            self._drop(conn)  # not a word back: a stray learns nothing
            return
        node = self.nodes[rank]
        if node.state != "waiting" or self.stopping:
            self.status.line(f"ignored a second agent for node {rank} ({node.host}) from {conn.peer}")
            self._drop(conn)
            return
        conn.node = node
        conn.reader.limit = channel.MAX_FRAME
        node.conn = conn
        node.state = "joined"
        node.addr = str(msg.get("addr") or conn.peer)
        node.last_seen = time.monotonic()
        versions = msg.get("versions") or {}
        if versions.get("xrun") != __version__:
            self.status.line(f"{node.host} runs xrun {versions.get('xrun')}, this is {__version__}")
        pick = node.spec.node_rank == 0 and self.plan.rendezvous.master_port == 0
        self._send(node, message(Kind.SPEC, spec=node.spec.to_json(), pick_master_port=pick))

    def _on_message(self, node: _Node, msg: dict[str, Any]) -> None:
        node.last_seen = time.monotonic()
        kind = msg.get("type")
        if kind == Kind.READY.value:
            node.state = "ready"
            node.master_port = msg.get("master_port")
            self.status.joined(node.host, self._ready_count(), len(self.nodes))
            if self.elastic is not None and not self.stopping:
                self._start_elastic(node)
            elif self._ready_count() == len(self.nodes) and not self.stopping:
                self._start_all()
        elif kind == Kind.RANK_EXITED.value:
            self._rank_exited(node, msg)
        elif kind == Kind.DONE.value:
            node.exit_code = int(msg.get("exit_code") or 0)
            node.state = "done"
            if node.exit_code != 0 and not self.stopping:
                reason = f"agent on {node.host} exited with code {node.exit_code}"
                self._fail(Failure(node.host, reason, node.exit_code))
        elif kind == Kind.ERROR.value:
            self._fail(Failure(node.host, f"agent on {node.host}: {msg.get('message')}", NODE_FAILURE_EXIT))

    def _rank_exited(self, node: _Node, msg: dict[str, Any]) -> None:
        code, sig = msg.get("code"), msg.get("signal")
        if msg.get("stopped") or (code == 0 and sig is None):
            return
        exit_code = 128 + int(sig) if sig is not None else int(code) if code is not None else 1
        how = f"was killed by {signal_name(int(sig))}" if sig is not None else f"exited with code {code}"
        rank = msg.get("rank")
        self._fail(Failure(node.host, f"rank {rank} (local {msg.get('local_rank')}) on {node.host} {how}",
                           exit_code, rank=rank, tail=tuple(msg.get("tail") or ())))

    def _closed(self, conn: _Conn, reason: str) -> None:
        node = conn.node
        self._drop(conn)
        if node is not None and not node.over:
            self._lose(node, f"its agent's connection dropped ({reason})")

    def _drop(self, conn: _Conn) -> None:
        self.remove_reader(conn.sock)
        self.conns.discard(conn)
        try:
            conn.sock.close()
        except OSError:
            pass
        if conn.node is not None and conn.node.conn is conn:
            conn.node.conn = None

    def _send(self, node: _Node, msg: dict[str, Any]) -> None:
        if node.conn is None:
            return
        try:
            channel.send(node.conn.sock, msg)
        except OSError as err:
            conn = node.conn
            self._closed(conn, f"send failed: {err.strerror or err}")

    # -- the job --------------------------------------------------------------------------------------------

    def _start_all(self) -> None:
        node0 = self.nodes[0]
        master_addr = self.plan.request.master_addr or _reachable(node0.addr, node0.host, len(self.nodes))
        master_port = self.plan.rendezvous.master_port or node0.master_port
        self.started_at = time.monotonic()
        self.status.started(len(self.nodes), self.plan.world_size, self.started_at - self.t0, master_addr, master_port)
        for node in self.nodes:
            node.state = "running"
            self._send(node, message(Kind.START, master_addr=master_addr, master_port=master_port))

    def _start_elastic(self, node: _Node) -> None:
        """--elastic: no barrier; the endpoint is the plan's (every node must know it before node 0 is up)."""
        assert self.elastic is not None
        rdzv = self.plan.rendezvous
        node.state = "running"
        self._send(node, message(Kind.START, master_addr=rdzv.master_addr, master_port=rdzv.master_port))
        started = sum(1 for n in self.nodes if n.state == "running")
        if self.started_at is None and started >= (self.elastic.min_nodes or 1):
            self.started_at = time.monotonic()
        self.status.line(f"{node.host} up after {time.monotonic() - self.t0:.1f} s: its elastic agent joins the "
                         f"rendezvous ({started}/{len(self.nodes)} nodes up, --min_nodes {self.elastic.min_nodes})")

    def _elastic_survivable(self) -> bool:
        """--elastic: enough nodes are still running or may still join for torch to carry on."""
        return (
            self.elastic is not None
            and not self.stopping
            and sum(1 for n in self.nodes if not n.over) >= (self.elastic.min_nodes or 1)
        )

    def _ready_count(self) -> int:
        return sum(1 for n in self.nodes if n.state in ("ready", "running"))  # running: elastic, started at once

    def _missing(self) -> list[str]:
        return [n.host for n in self.nodes if n.state not in ("ready", "running")]

    def _fail(self, failure: Failure) -> None:
        if self.failure is None and self.interrupted_by is None:
            self.failure = failure
            self.failure_at = time.monotonic()
        self._stop(signal.SIGTERM, failure.reason)

    def _lose(self, node: _Node, reason: str) -> None:
        self._mark_lost(node, reason)
        if self._elastic_survivable():
            left = sum(1 for n in self.nodes if not n.over)
            self.status.line(f"lost node {node.host}: {reason}; {left} node(s) left, they re-rendezvous without it")
            return
        if not self.stopping or self.failure is None:
            self._fail(Failure(node.host, f"lost node {node.host}: {reason}", NODE_FAILURE_EXIT))

    def _mark_lost(self, node: _Node, reason: str) -> None:
        if node.state == "done":
            return
        node.state = "lost"
        if self.stopping:
            self.status.line(f"{node.host}: {reason}")
        if node.conn is not None:
            self._drop(node.conn)

    def session_ended(self, host: str | None, code: int | None, detail: str = "") -> None:
        """A backend session ended (``host`` None: the one session of every node, e.g. pdsh)."""
        affected = [n for n in self.nodes if host is None or n.host == host]
        for node in affected:
            if node.over:
                continue
            if node.conn is None and not self.stopping:
                what = f"exited with code {code}" if code is not None else "ended"
                hint = f" ({detail})" if detail else " (see its output above)"
                node.state = "lost"
                if self._elastic_survivable():
                    self.status.line(f"the session to {node.host} {what} before its agent connected{hint}; "
                                     "the elastic job goes on without it")
                    continue
                self._fail(Failure(node.host, f"the session to {node.host} {what} before its agent connected{hint}",
                                   code if code else NODE_FAILURE_EXIT))
            if node.conn is None:
                node.state = "lost"

    def _stop(self, signum: int, reason: str) -> None:
        first = not self.stopping
        self.stopping = True
        deadline = self.plan.request.options.shutdown_timeout
        if first or signum == signal.SIGKILL:
            self.stop_deadline = time.monotonic() + deadline + STOP_GRACE
            for node in self.nodes:
                if not node.over:
                    self._send(node, message(Kind.STOP, signal=int(signum), deadline=deadline, reason=reason))

    # -- the end --------------------------------------------------------------------------------------------

    def exit_code(self) -> int:
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        if self.failure is not None:
            return self.failure.exit_code or NODE_FAILURE_EXIT
        if self.elastic is not None and any(n.state == "done" for n in self.nodes):
            return max((n.exit_code or 0 for n in self.nodes if n.state == "done"), default=0)  # lost: torch's
        if any(n.state == "lost" for n in self.nodes):
            return NODE_FAILURE_EXIT
        return max((n.exit_code or 0 for n in self.nodes), default=0)

    def _report(self) -> int:
        code = self.exit_code()
        if self.strays:
            say(f"closed {self.strays} connection(s) that did not present this run's token")
        if self.failure is not None and self.interrupted_by is None:
            stopped = ""
            if self.failure_at is not None and self.all_over_at is not None:
                stopped = f"; every node stopped {self.all_over_at - self.failure_at:.2f} s later"
            say(f"job failed: {self.failure.reason} (exit code {code}){stopped}")
            for line in self.failure.tail[-_TAIL_SHOWN:]:
                say(f"  [{self.failure.host}:{self.failure.rank}] {line}")
        elif self.interrupted_by is not None:
            say(f"stopped by {signal_name(self.interrupted_by)} (exit code {code})")
        return code


def _reachable(addr: str | None, host: str, nodes: int) -> str:
    """Node 0's address as its agent saw it on the route to the head; loopback only helps a one-node job."""
    if addr is None or (nodes > 1 and (addr.startswith("127.") or addr == "::1")):
        return host
    return addr
