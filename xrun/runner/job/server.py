"""The runner's control server: the socket loop around the job state machine (``xrun.runner.job.machine``).

One per run, single-threaded (``selectors``), on the address the nodes use. It listens, accepts through its ``Gate``
(TLS, each hello's proof of its node's key, bounds on connections that have proven nothing: a stray, or one silent past
``HELLO_TIMEOUT``, is closed without a byte sent back; xrun.runner.job.gate), reads frames, and turns what arrives into
the machine's events: agents' messages (``xrun.runner.job.wire``), dropped connections, backend sessions that end
(``session_ended``), signals and time passing. Its ``Dispatch`` (``xrun.runner.job.dispatch``) feeds them to the
machine and carries out the actions that come back: sends, closed connections and status lines; at the end the
machine's verdict is the report (``xrun.runner.job.report``) and the exit code. Barrier, failure, keepalive and
exit-code decisions are all the machine's; the wire format lives in ``xrun.channel``, the status display in
``xrun.launch.output.status``.

It holds 10,000 agents on its one thread (issue 15, ``python -m bench control_plane``): nothing done per message
or per loop turn scans every connection or node (connections not yet admitted wait in open order, so the oldest
is the next to time out; the machine keeps counts), and a burst of connecting agents is accepted in batches.
Each connection reads its own frames and hands them here (``xrun.runner.job.connections``); the selector, the
timers and the signals' recording are the loop's (``xrun.runner.job.loop``).

Beside the machine, its ``Extras`` (``xrun.runner.job.extras``) read what concerns neither the barrier nor the
verdict: every rank's figures, the hang doctor's messages, ``--precheck``'s answers.

The backend that started the agents (ssh sessions, a pdsh process) plugs in as a ``Sessions`` object: it
relays the agents' output through this loop and reports sessions that end. ``run`` takes over SIGINT, SIGTERM
and SIGHUP (a stop: the machine's event), SIGQUIT (a stack dump) and the ``--forward_signals``
(SIGUSR1/SIGUSR2: a ``signal`` message to every connected agent, which passes it on to its ranks; the job goes
on) on the main thread;
``own_signals=False`` lets the loop run on another thread.

Pod mode's flavour (``xrun.runner.pod.server``) overrides a few seams: ``_make_job`` (its hello policy, the
verdict sent to every node), ``_hello_event`` (the digest goes to the machine's policy), ``drop`` (a node's place
may reopen) and some of the dispatch's doers.
"""

from __future__ import annotations

import functools
import signal
import socket
import time
from collections.abc import Iterable
from typing import Any, Callable, Protocol

from xrun.channel import ChannelError, Kind, Message, message
from xrun.launch.output.status import PlainStatus, make_status, say
from xrun.launch.output.writer import writer
from xrun.launch.procs.posix import signal_name
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS
from xrun.runner.job.config import JobConfig
from xrun.runner.job.connections import ACCEPTS_PER_WAKEUP, Conn, Connections, listener
from xrun.runner.job.dispatch import Dispatch
from xrun.runner.job.events import (
    Admit,
    ConnectionLost,
    Failure,
    HelloReceived,
    NodesFaulty,
    SessionEnded,
    SignalReceived,
    Tick,
)
from xrun.runner.job.extras import Extras
from xrun.runner.job.gate import Gate
from xrun.runner.job.loop import SelectLoop
from xrun.runner.job.machine import Job
from xrun.runner.job.report import report_lines
from xrun.runner.job.wire import agent_event, hello_event
from xrun.runner.plan import Plan


class Sessions(Protocol):
    """What a backend started to carry the agents (ssh channels, one pdsh process)."""

    def register(self, loop: ControlServer) -> None:
        """Add readers (output relay, session exits) with ``loop.add_reader``."""

    def finished(self, lost: set[str]) -> bool:
        """Every session has ended (sessions to ``lost`` hosts may stay open: they are cut off)."""

    def terminate(self) -> None:
        """End every session still open (called once, at the end)."""


class ControlServer:
    """One run's loop and its connections: what arrives goes to the machine through ``dispatch``."""

    def __init__(self, plan: Plan, gate: Gate, *, join_timeout: float, status: PlainStatus | None = None) -> None:
        self.plan = plan
        self.gate = gate
        self.job = self._make_job(plan, join_timeout)
        self.loop = SelectLoop()
        self.listeners: list[socket.socket] = []
        self.links = Connections(gate.tls, gate.handshake)
        # what the tests and the pod flavour read: every open connection, the unadmitted ones, the admitted by node
        self.conns, self.pending, self.node_conns = self.links.all, self.links.pending, self.links.by_node
        self.status = status if status is not None else make_status(len(plan.nodes))
        self.forwarded = frozenset(plan.request.options.forward_signals)  # passed on, not a stop
        self.extras = Extras(self)  # the hang doctor, every rank's figures, --precheck's check
        self.dispatch = Dispatch(self)  # events in, the machine's actions carried out

    # What the tests (and a curious caller) read of the outcome.
    @property
    def failure(self) -> Failure | None:
        return self.job.failure

    @property
    def strays(self) -> int:
        return self.gate.strays

    @property
    def failure_at(self) -> float | None:
        return self.job.failure_at

    @property
    def all_over_at(self) -> float | None:
        return self.job.all_over_at

    # -- set-up ---------------------------------------------------------------------------------------------

    def _make_job(self, plan: Plan, join_timeout: float) -> Job:
        return Job(JobConfig.from_plan(plan, join_timeout=join_timeout), now=time.monotonic())

    def listen(self, addrs: Iterable[str], *, port: int = 0) -> int:
        """Bind one listener per distinct address, all on the same port (0: the kernel chooses)."""
        for addr in dict.fromkeys(addrs):
            try:
                sock = listener(addr, port, backlog=len(self.plan.agent_hosts))
            except ChannelError:
                self.close()
                raise
            port = sock.getsockname()[1]
            self.listeners.append(sock)
            self.add_reader(sock, functools.partial(self._accept, sock))
        return port

    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        self.loop.add_reader(fileobj, callback)

    def add_timer(self, due: Callable[[], float | None], fire: Callable[[], None]) -> None:
        """``fire()`` after every wake-up; ``due()`` (a monotonic time, or None) bounds the wait for the next."""
        self.loop.add_timer(due, fire)

    def remove_reader(self, fileobj: Any) -> None:
        self.loop.remove_reader(fileobj)

    def session_ended(self, host: str | None, code: int | None, detail: str = "") -> None:
        """A backend session ended (``host`` None: the one session of every node, e.g. pdsh)."""
        self.dispatch.feed(SessionEnded(host, code, detail))

    def nodes_faulty(self, node_ranks: tuple[int, ...], reason: str) -> None:
        """These nodes are bad (``--precheck``, issue 24): replaced by hot spares before the start, else lost."""
        self.dispatch.feed(NodesFaulty(node_ranks, reason))

    def stop_echoed(self, host: str, code: int) -> bool:
        """A launcher's word that ``host``'s session exited with ``code`` only echoes the job's stop (pdsh)."""
        return self.job.stop.echoed(host, code)

    def next_attempt(self) -> None:
        """--max_restarts: what the doctor and the figures held was the attempt before's."""
        self.extras = Extras(self)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, sessions: Sessions, *, own_signals: bool = True) -> int:
        """Serve until every node is over; the job's exit code. ``own_signals`` needs the main thread."""
        owned = (*SHUTDOWN_SIGNALS, signal.SIGQUIT, *sorted(self.forwarded)) if own_signals else ()
        try:
            with self.loop.owning(owned):
                sessions.register(self)
                while not self._finished(sessions):
                    self.loop.turn([self.job.next_deadline(), self.pending.deadline(), self.extras.doctor.deadline()])
                    for signum in self.loop.take_signals():
                        self._on_signal_received(signum)
                    self._tick()
        finally:
            self.status.close()
            sessions.terminate()
            self.close()
            writer().drain()  # every node's last lines (queued for the console) before the report
        verdict = self.job.verdict()
        for line in report_lines(verdict, strays=self.gate.strays + self.job.strays):
            say(line)
        self.extras.sum_up(verdict)
        return verdict.exit_code

    def close(self) -> None:
        for sock in self.listeners:
            self.remove_reader(sock)
            sock.close()
        self.listeners.clear()
        for conn in list(self.conns.values()):
            self.drop(conn)
        self.gate.close()

    def _on_signal_received(self, signum: int) -> None:
        if signum == signal.SIGQUIT:
            self.extras.want("SIGQUIT")
            return
        if signum not in self.forwarded:
            self.dispatch.feed(SignalReceived(signum))
            return
        nodes = sorted(self.node_conns)
        say(f"forwarding {signal_name(signum)} to the ranks of {len(nodes)} node(s)")
        self.dispatch.send_all(nodes, message(Kind.SIGNAL, signal=int(signum)))

    def _tick(self) -> None:
        now = time.monotonic()
        for conn in self.pending.expired(now):
            self.drop(conn)  # said nothing useful in time: a stray
        self.dispatch.feed(Tick())
        self.extras.tick(now)

    def _finished(self, sessions: Sessions) -> bool:
        if self.job.all_over_at is None:
            return False
        return sessions.finished(self.job.lost_hosts()) or self.job.linger_over(time.monotonic())

    # -- connections: what each one reads comes here (``ConnOwner``) ----------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):  # a burst is taken in few loop turns, yet reads are not starved
            taken = self.gate.accept(listener)
            if taken is None:
                return
            conn = self.links.open(taken[0], (taken[1], 0), now=time.monotonic(), owner=self)
            self.add_reader(conn.sock, conn.read)

    def key_announced(self, node: int, key_hex: str) -> None:
        """Node ``node``'s agent announced its one-time key on its own output stream (pdsh): the hellos that
        waited for it are judged now."""
        for conn, msg in self.gate.announced(node, key_hex):
            if self.conns.get(conn.serial) is conn:
                self.on_hello(conn, msg)

    def on_message(self, node: int, msg: Message) -> None:
        self.extras.message(node, msg)
        self.dispatch.feed(agent_event(node, msg))

    def on_hello(self, conn: Conn, msg: Message) -> None:
        if self.gate.waits_for_key(conn, msg):
            return  # its node's key is still on its way (pdsh): judged when it comes, or dropped at the deadline
        event = self._hello_event(conn, msg) if conn.handshake.check_hello(msg) else None
        if event is None:
            self.drop(conn, failed=True)  # not a word back: a stray learns nothing
            return
        self.dispatch.feed(event)

    def _hello_event(self, conn: Conn, msg: Message) -> HelloReceived | None:
        """The proven hello as the machine's event; None: a stray (here: a malformed hello)."""
        return hello_event(conn.serial, conn.peer, msg, len(self.plan.agent_hosts))

    def on_closed(self, conn: Conn, reason: str) -> None:
        # a peer that broke the protocol, or hung up once challenged (it could not check node 0's proof, or had
        # nothing to prove), failed to get in
        self.drop(conn, failed=reason.startswith("protocol error") or conn.challenged)
        if conn.node is not None:
            self.dispatch.feed(ConnectionLost(conn.node, reason))

    def drop(self, conn: Conn, *, failed: bool = False) -> None:
        self.remove_reader(conn.sock)
        self.links.forget(conn)
        self.gate.dropped(conn, failed=failed)
        conn.close()

    def admit(self, action: Admit) -> None:
        self.links.admit(action.conn, action.node)
        self.gate.admitted(self.conns[action.conn], action.node)
