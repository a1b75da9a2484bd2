"""The runner's control server: the socket loop around the job state machine (``xrun.runner.job.machine``).

One per run, single-threaded, on the address the nodes use. Three classes, each one thing:

* ``SelectLoop`` (``xrun.runner.job.server_loop``): the selector, the timers, the signals recorded between turns;
* ``Conn`` (``xrun.runner.job.connections``): one connection's TLS, frames and ``auth`` -> ``challenge``, found
  again by serial, by node and in the order the unadmitted ones opened (``Connections``);
* ``ControlServer``, here: it listens and accepts through its ``Gate`` (TLS, each hello's proof of its node's key,
  bounds on connections that have proven nothing: a stray, or one silent past ``HELLO_TIMEOUT``, is closed without
  a byte sent back; ``xrun.runner.job.gate``), turns what arrives into the machine's events (a proven hello, an
  admitted agent's message, a dropped connection, a backend session that ends, a signal, time passing), feeds each
  to the machine (``feed``) and carries out the actions that come back (``_carry_out``): sends, admitted and
  closed connections, status lines (``xrun.common.output.status``), ``--precheck``'s check
  (``xrun.runner.network.precheck_head``). At the end the machine's verdict is the report
  (``xrun.runner.job.last_words``) and the exit code. Barrier, failure, keepalive and exit-code decisions are all the
  machine's; the wire format is ``xrun.channel``'s.

The path of a ``ready``: the loop finds its connection readable -> ``Conn.read`` decodes the frame ->
``ControlServer.read_from`` -> ``_agent_message`` (no feature reads it) -> ``agent_event`` (xrun.runner.job.wire)
makes it ``Ready`` -> ``feed`` -> ``Job.handle`` (the barrier: ``xrun.runner.job.barrier``) -> ``SendStart`` ->
``_carry_out`` -> ``send`` -> ``Conn.send`` to every node.

Beside the machine, each feature reads the message kinds it owns (issue 38 §3): its head half registers them in one
lookup table, ``readers`` (kind -> reader), built here at construction, one line a feature; a message is read there
first (a malformed field is the sender's protocol error), then the machine gets it. The features: the job's console
(``_lines``: every node's ``lines``, rendered and merged in one place, ``xrun.runner.job.relay``; the machine never
hears them), every rank's figures (``xrun.runner.job.figures``), the hang doctor (``xrun.runner.job.doctor_head``:
``stacks``, ``collectives``, ``want_stacks``, ``quiet``, ``spoke``; SIGQUIT to xrun asks it for a job-wide dump),
telemetry (``xrun.runner.job.telemetry_head``: the straggler samples, the pongs' clocks, the ranks' usage) and
``--precheck``'s answers (``xrun.runner.network.precheck_head``). A restart begins each anew (``_begin_attempt``).
The job's record (``--log_dir``, ``--metrics_port``: ``xrun.runner.job.record``) is handed each event fed with its
actions and every message heard.

It holds 10,000 agents on its one thread (issue 15, ``python -m bench control_plane``): nothing done per message
or per loop turn scans every connection or node (connections not yet admitted wait in open order, so the oldest
is the next to time out; the machine keeps counts), and a burst of connecting agents is accepted in batches.

The backend that started the agents (ssh sessions, a pdsh process) plugs in as a ``Sessions`` object: it relays what
its own streams carry to the job's console (``console``) through this loop and reports sessions that end. ``run``
takes over SIGINT, SIGTERM and SIGHUP (a stop: the machine's event), SIGQUIT (a stack dump) and the
``--forward_signals`` (SIGUSR1/SIGUSR2: a ``signal`` message to every connected agent, which passes it on to its
ranks; the job goes on) on the main thread; ``own_signals=False`` lets the loop run on another thread.

Pod mode's flavour (``xrun.runner.pod.node0_server``) overrides a few seams: ``_make_job`` (its hello policy, the
verdict sent to every node), ``_hello_event`` (the digest goes to the machine's policy), ``drop`` (a node's place
may reopen) and the barrier's status (``_show_*``: sent to every node).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Callable, Protocol

from xrun.channel import ChannelError, Kind, Message, Reader, lines_of, message
from xrun.common.output.render import Lines
from xrun.common.output.status import PlainStatus, make_status, say
from xrun.common.output.writer import writer
from xrun.common.procs.posix import signal_name
from xrun.common.procs.signals import SHUTDOWN_SIGNALS
from xrun.common.result.outcome import HANG_EXIT
from xrun.common.spec import moved_to
from xrun.runner.job.config import JobConfig
from xrun.runner.job.connections import Closed, Conn, Connections, listener
from xrun.runner.job.doctor_head import DoctorHead
from xrun.runner.job.end_files import write_end_files
from xrun.runner.job.events import (
    Action,
    Admit,
    ConnectionLost,
    Drop,
    Event,
    Failure,
    GroupRestartedAcross,
    GroupsMoved,
    HelloReceived,
    PrecheckDone,
    RunPrecheck,
    SendAccept,
    SendGroupOrder,
    SendPing,
    SendRestart,
    SendSpec,
    SendStart,
    SendStop,
    SendVerdict,
    SessionEnded,
    ShowJoined,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    SignalReceived,
    Tick,
    TurnAway,
    Verdict,
)
from xrun.runner.job.figures import JobFigures
from xrun.runner.job.gate import Gate
from xrun.runner.job.last_words import report_lines
from xrun.runner.job.machine import Job
from xrun.runner.job.metrics import record_and_metrics
from xrun.runner.job.nodes import NodeState
from xrun.runner.job.relay import head_console
from xrun.runner.job.server_loop import SelectLoop
from xrun.runner.job.telemetry_head import TelemetryHead
from xrun.runner.job.wire import agent_event, hello_event, verdict_message
from xrun.runner.network.precheck_head import PrecheckHead
from xrun.runner.plan import Plan

ACCEPTS_PER_WAKEUP = 64  # a burst of connecting agents is taken in few loop turns, yet reads are not starved


class Sessions(Protocol):
    """What a backend started to carry the agents (ssh channels, one pdsh process, an engine; none in pod mode)."""

    def register(self, loop: ControlServer) -> None:
        """Add readers (their streams onto ``loop.console``, session exits) with ``loop.add_reader``."""

    def finished(self, lost: set[str]) -> bool:
        """Every session has ended (sessions to ``lost`` hosts may stay open: they are cut off)."""

    def terminate(self) -> None:
        """End every session still open (called once, at the end)."""


class NoSessions:
    """No backend sessions (pod mode, the local run): the job is over once every node has closed its connection
    (so every node's console lines are read before the report)."""

    def __init__(self) -> None:
        self.server: ControlServer | None = None

    def register(self, loop: ControlServer) -> None:
        self.server = loop

    def finished(self, lost: set[str]) -> bool:
        return self.server is not None and not self.server.node_conns

    def terminate(self) -> None:
        pass


class ControlServer:
    """One run's loop and its connections: what arrives goes to the machine (``feed``), its actions are carried
    out (``_carry_out``)."""

    alone = False  # the job is one node in this process (the local run): its node's own words and clock

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
        self.console = head_console(plan)  # every node's lines, rendered and merged here only
        self.forwarded = frozenset(plan.request.options.forward_signals)  # passed on, not a stop
        self.events: deque[Event] = deque()  # fed to the machine one at a time (``feed``)
        self.feeding = False
        self.doers = self._how_to_carry_out()
        # the features' head halves, each registering the message kinds it reads (issue 38 §3)
        options, world_size = plan.request.options, plan.heard_world_size
        self.figures = JobFigures()
        self.doctor = DoctorHead(options, world_size, host=self._host, running=self._running, send_all=self.send_all,
                                 feed=self.feed)
        self.telemetry = TelemetryHead(world_size, host=self._host, status=self.status, record=lambda: self.record,
                                       alone=self.alone)
        self.precheck = PrecheckHead(send=self.send, add_timer=self.add_timer, stopping=lambda: self.job.stopping,
                                     done=lambda result: self.feed(PrecheckDone(result)))
        self.readers: dict[str, Reader] = {kind.value: read for reads in (
            {Kind.LINES: self._lines},
            self.figures.reads(),
            self.doctor.reads(),
            self.telemetry.reads(),
            self.precheck.reads(),
        ) for kind, read in reads.items()}
        self._wake_r, self._wake_w = os.pipe()  # post_signal's wake-up, from the main thread
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.add_reader(self._wake_r, self._drain_wake)
        self.record, self.metrics = record_and_metrics(plan, self.job, lambda: self.telemetry.scores,
                                                       now=time.monotonic())

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

    # -- set-up, and what a backend's sessions call -----------------------------------------------------------

    def _make_job(self, plan: Plan, join_timeout: float) -> Job:
        return Job(JobConfig.from_plan(plan, join_timeout=join_timeout), now=time.monotonic())

    def _begin_attempt(self) -> None:
        """What an attempt's agents tell beside the machine, begun anew (--max_restarts: the attempt before's
        dumps, figures and scores are not this one's)."""
        self.figures.begin_attempt()
        self.doctor.begin_attempt()
        self.telemetry.begin_attempt()
        self.precheck.begin_attempt()

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

    def open_plain(self, sock: socket.socket, peer: str) -> None:
        """Serve this process's own agent on ``sock``, one end of a socketpair (the local run: its one node)."""
        conn = self.links.open_plain(sock, peer, now=time.monotonic())
        self.add_reader(conn.sock, functools.partial(self.read_from, conn))

    def post_signal(self, signum: int) -> None:
        """The main thread's xrun got ``signum`` (called there, from the signal handler) while this loop runs on
        another (``own_signals=False``: pod mode's node 0, the local run): the loop takes it on its next turn, as
        its own signal (``SelectLoop.take_signals``)."""
        self.loop.signals.append(signum)  # one append: atomic, the loop pops
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # closed: the job is over; or the pipe is full: a wake-up is pending anyway

    def _drain_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass

    def session_ended(self, host: str | None, code: int | None, detail: str = "") -> None:
        """A backend session ended (``host`` None: the one session of every node, e.g. pdsh)."""
        self.feed(SessionEnded(host, code, detail))

    def stop_echoed(self, host: str, code: int) -> bool:
        """A launcher's word that ``host``'s session exited with ``code`` only echoes the job's stop (pdsh)."""
        return self.job.stop.echoed(host, code)

    def key_announced(self, node: int, key_hex: str) -> None:
        """Node ``node``'s agent announced its one-time key on its own output stream (pdsh): the hellos that
        waited for it are judged now."""
        for conn, msg in self.gate.announced(node, key_hex):
            if self.conns.get(conn.serial) is conn:
                self._hello(conn, msg)

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, sessions: Sessions, *, own_signals: bool = True) -> int:
        """Serve until every node is over; the job's exit code. ``own_signals`` needs the main thread."""
        owned = (*SHUTDOWN_SIGNALS, signal.SIGQUIT, *sorted(self.forwarded)) if own_signals else ()
        try:
            with self.loop.owning(owned):
                self.add_timer(self.console.next_deadline, lambda: self.console.flush(time.monotonic()))
                record = self.record
                if record is not None:
                    self.add_timer(record.due, lambda: record.tick(time.monotonic(), self.telemetry.scores))
                sessions.register(self)
                while not self._finished(sessions):
                    self.loop.turn([self.job.next_deadline(), self.pending.deadline(), self.doctor.deadline()])
                    for signum in self.loop.take_signals():
                        self._on_signal_received(signum)
                    self._tick()
        finally:
            self.status.close()
            sessions.terminate()
            self.close()
            self.console.close()
            writer().drain()  # every node's last lines (queued for the console) before the report
        verdict = self.job.verdict()
        for line in self._last_words(verdict):
            say(line)
        log_dir = self.plan.request.options.log_dir
        recorded = None if self.record is None else self.record.close(verdict, time.monotonic())
        self._sum_up(verdict, log_dir, recorded)
        if log_dir is not None:
            write_end_files(log_dir, verdict, self.doctor.current, recorded=self.record is not None)
        return verdict.exit_code

    def _sum_up(self, verdict: Verdict, log_dir: str | None, recorded: Mapping[str, Any] | None) -> None:
        """Every rank's figures: the success line or the table, and ``summary.json`` (with the record's goodput)."""
        self.figures.sum_up(verdict, log_dir=log_dir, stragglers=self.telemetry.scores.to_json(), recorded=recorded)

    def _last_words(self, verdict: Verdict) -> list[str]:
        """The job's report (xrun.runner.job.last_words), and the stacks taken before a failure's stop."""
        lines = report_lines(verdict, strays=self.gate.strays + self.job.strays)
        return lines + (self.doctor.current.stop_stack_lines() if verdict.exit_code != 0 else [])

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        for sock in self.listeners:
            self.remove_reader(sock)
            sock.close()
        self.listeners.clear()
        for conn in list(self.conns.values()):
            self.drop(conn)
        self.gate.close()
        if self._wake_r >= 0:
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1  # first: post_signal then finds no fd to write to
            self.remove_reader(wake_r)
            os.close(wake_r)
            os.close(wake_w)

    def _on_signal_received(self, signum: int) -> None:
        if signum == signal.SIGQUIT:
            self.doctor.want("SIGQUIT")
            return
        if signum not in self.forwarded:
            self.feed(SignalReceived(signum))
            return
        nodes = sorted(self.node_conns)
        say(f"forwarding {signal_name(signum)} to the ranks of {len(nodes)} node(s)")
        self.send_all(nodes, message(Kind.SIGNAL, signal=int(signum)))

    def _tick(self) -> None:
        now = time.monotonic()
        for conn in self.pending.expired(now):
            self.drop(conn)  # said nothing useful in time: a stray
        self.feed(Tick())
        self.doctor.check(now)

    def _finished(self, sessions: Sessions) -> bool:
        if self.job.all_over_at is None:
            return False
        return sessions.finished(self.job.lost_hosts()) or self.job.linger_over(time.monotonic())

    # -- connections: what each one reads becomes the machine's event -----------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):  # a burst is taken in few loop turns, yet reads are not starved
            taken = self.gate.accept(listener)
            if taken is None:
                return
            conn = self.links.open(taken[0], (taken[1], 0), now=time.monotonic())
            self.add_reader(conn.sock, functools.partial(self.read_from, conn))

    def read_from(self, conn: Conn) -> None:
        """``conn`` is readable: its hello, its node's messages, or the reason it is over, each handled in turn.

        Whatever a peer sends costs its own connection only: every failure here, expected or not, closes this
        connection and nothing else (issue 22); an unproven peer is dropped without a word back (a peer whose TLS
        handshake fails gets OpenSSL's alert, which tells it nothing a TLS client does not learn by connecting)."""
        try:
            for item in conn.read():
                if isinstance(item, Closed):
                    self._closed(conn, item.reason)
                elif conn.node is not None:
                    self._agent_message(conn.node, item)
                else:
                    self._hello(conn, item)
        except ChannelError as err:
            self._closed(conn, f"protocol error: {err.reason}")
        except Exception as err:  # noqa: BLE001 - one connection's trouble must never reach the loop
            self._closed(conn, f"protocol error: {err.__class__.__name__}")

    def _hello(self, conn: Conn, msg: Message) -> None:
        if self.gate.waits_for_key(conn, msg):
            return  # its node's key is still on its way (pdsh): judged when it comes, or dropped at the deadline
        event = self._hello_event(conn, msg) if conn.handshake.check_hello(msg) else None
        if event is None:
            self.drop(conn, failed=True)  # not a word back: a stray learns nothing
            return
        self.feed(event)

    def _hello_event(self, conn: Conn, msg: Message) -> HelloReceived | None:
        """The proven hello as the machine's event; None: a stray (here: a malformed hello)."""
        return hello_event(conn.serial, conn.peer, msg, len(self.plan.agent_hosts))

    def _agent_message(self, node: int, msg: Message) -> None:
        """An admitted agent's message: read first by the feature that registered its kind (a malformed field is a
        protocol error: ``ChannelError``), then the machine's event; a node's console lines are the console's
        alone (not the machine's business: its pongs keep it alive)."""
        kind, now = msg["type"], time.monotonic()  # a str: the frame's decoding checked it
        read = self.readers.get(kind)
        if read is not None:
            try:
                read(node, msg, now)
            except ValueError as err:
                raise ChannelError(f"{kind}: {err}") from None
        if kind == Kind.LINES.value:
            return
        if self.record is not None:
            self.record.heard(node, msg, now)
        self.feed(agent_event(node, msg))

    def _lines(self, node: int, msg: Message, now: float) -> None:
        fd, host, records = lines_of(msg)
        self.console.add(("node", node), fd, Lines(host, records), now)

    def _closed(self, conn: Conn, reason: str) -> None:
        # a peer that broke the protocol, or hung up once challenged (it could not check node 0's proof, or had
        # nothing to prove), failed to get in
        self.drop(conn, failed=reason.startswith("protocol error") or conn.challenged)
        if conn.node is not None:
            self.feed(ConnectionLost(conn.node, reason))

    def drop(self, conn: Conn, *, failed: bool = False) -> None:
        self.remove_reader(conn.sock)
        self.links.forget(conn)
        self.gate.dropped(conn, failed=failed)
        conn.close()

    # -- the machine: events in, actions carried out -----------------------------------------------------------

    def feed(self, event: Event) -> None:
        """Hand one event to the machine and carry out its actions. Not re-entered: an event raised while actions
        are carried out (a send that fails loses its node) waits in the queue for the loop already feeding."""
        self.events.append(event)
        if self.feeding:
            return
        self.feeding = True
        try:
            while self.events:
                event, now = self.events.popleft(), time.monotonic()
                actions = self.job.handle(event, now)
                if self.record is not None:
                    self.record.fed(event, actions, now)
                for action in actions:
                    self._carry_out(action)
        finally:
            self.feeding = False

    def _carry_out(self, action: Action) -> None:
        self.doers[type(action)](action)

    def _how_to_carry_out(self) -> dict[type, Callable[[Any], None]]:
        """How each of the machine's actions is carried out."""
        return {
            Admit: self._admit,
            TurnAway: lambda a: self._drop_if_open(self.conns.get(a.conn)),
            Drop: lambda a: self._drop_if_open(self.node_conns.get(a.node)),
            SendSpec: self._send_spec,
            SendAccept: lambda a: self.send(a.node, message(Kind.ACCEPT)),
            SendVerdict: lambda a: self.send_all(a.nodes, verdict_message(a.verdict)),
            SendStart: lambda a: self.send_all(a.nodes, message(Kind.START, master_addr=a.master_addr,
                                                                 master_port=a.master_port, restart_count=a.attempt)),
            SendRestart: self._send_restart,
            SendStop: self._send_stop,
            SendPing: self._send_ping,
            ShowLine: lambda a: self.status.line(a.text),
            ShowJoined: self._show_joined,
            ShowWaiting: self._show_waiting,
            ShowStarted: self._show_started,
            RunPrecheck: lambda a: self.precheck.start(a.nodes, a.hosts, toward=a.toward),
            GroupsMoved: lambda a: None,  # for the record alone (xrun.runner.job.record.head), fed every action
            GroupRestartedAcross: lambda a: self.figures.group_restarted(a.restart.group),  # and the record
            SendGroupOrder: self._send_group_order,
        }

    def send_all(self, nodes: Iterable[int], msg: Message) -> None:
        for node in nodes:
            self.send(node, msg)

    def send(self, node: int, msg: Message) -> None:
        """To the admitted agent ``node``, if still connected; a send that fails closes its connection."""
        conn = self.node_conns.get(node)
        if conn is None:
            return
        try:
            conn.send(msg)
        except OSError as err:
            self._closed(conn, f"send failed: {err.strerror or err}")

    def _send_ping(self, action: SendPing) -> None:
        for node in action.nodes:
            self.telemetry.pinged(node)  # the pong's clock against this round trip (issue 31)
            self.send(node, message(Kind.PING))

    def _admit(self, action: Admit) -> None:
        self.links.admit(action.conn, action.node)
        self.gate.admitted(self.conns[action.conn], action.node)

    def _drop_if_open(self, conn: Conn | None) -> None:
        if conn is not None:
            self.drop(conn)

    def _send_spec(self, action: SendSpec) -> None:
        """An agent's spec; a hot spare's (--spares) is the node's it stands by for or takes the place of (node 0's
        for its standby preflight), with its own host."""
        plan = self.plan
        spec = plan.nodes[0 if action.standby else action.node if action.node_rank is None else action.node_rank]
        host = plan.agent_hosts[action.node]
        if action.node_rank is not None:  # a lost or bad node's (--replica_groups: its groups meet at the spare)
            spec = moved_to(spec, host, dict(action.group_restarts))
        elif spec.host != host:  # a spare's standby: node 0's
            spec = replace(spec, host=host)
        restarts = self.job.config.restart.max_restarts  # the agent waits for a restart after its done
        self.send(action.node, message(Kind.SPEC, spec=spec.to_json(), pick_master_port=action.pick_master_port,
                                       master_port=action.master_port, max_restarts=restarts, standby=action.standby))

    def _send_group_order(self, action: SendGroupOrder) -> None:
        """--replica_groups: stop, or start again, the nodes' ranks of a group across nodes."""
        if action.restart is None:
            self.send_all(action.nodes, message(Kind.STOP_GROUP, group=action.group))
        else:
            moved = {} if action.master_addr is None else {"master_addr": action.master_addr}
            self.send_all(action.nodes, message(Kind.START_GROUP, group=action.group, restart=action.restart, **moved))

    def _send_stop(self, action: SendStop) -> None:
        """After a failure (not a signal) the agents take their ranks' stacks before they stop them; after a hang
        they have them (the hang's dump) and stop the ranks as hung, so each node's report says so."""
        failure = self.job.failure
        hung = failure is not None and failure.exit_code == HANG_EXIT
        self.send_all(action.nodes, message(Kind.STOP, signal=action.signal, deadline=action.deadline,
                                            reason=action.reason, stacks=failure is not None and not hung, hung=hung))

    def _send_restart(self, action: SendRestart) -> None:
        """--max_restarts: the next attempt (what the doctor and the figures held was the attempt before's)."""
        self._begin_attempt()
        for node in action.nodes:
            node0 = node == action.node0
            self.send(node, message(Kind.RESTART, attempt=action.attempt, pick_master_port=node0 and
                                    action.pick_master_port, master_port=action.master_port if node0 else 0))

    def _show_joined(self, action: ShowJoined) -> None:
        self.status.joined(action.host, action.ready, action.total)

    def _show_waiting(self, action: ShowWaiting) -> None:
        self.status.waiting(action.ready, list(action.missing), action.elapsed)

    def _show_started(self, action: ShowStarted) -> None:
        self.status.started(action.nodes, action.ranks, action.elapsed, action.master_addr, action.master_port)

    # -- what the features ask of the job ---------------------------------------------------------------------

    def _running(self) -> list[int]:
        return [n.agent for n in self.job.nodes if n.state is NodeState.RUNNING and n.connected]

    def _host(self, agent: int) -> str:
        """An agent's host as the job names it: its node's (pod mode may rename it), else a hot spare's."""
        node = self.job.nodes.by_agent.get(agent)
        return node.host if node is not None else self.plan.agent_hosts[agent]
