"""The runner's control server: the socket loop around the job state machine (``xrun.runner.job.machine``).

One per run, single-threaded (``selectors``), on the address the nodes use. It listens, accepts through its ``Gate``
(TLS, each hello's proof of its node's key, bounds on connections that have proven nothing: a stray, or one silent past
``HELLO_TIMEOUT``, is closed without a byte sent back; xrun.runner.job.gate), reads frames, and turns what arrives into
the machine's events: agents' messages, dropped connections, backend sessions that end (``session_ended``), signals and
time passing. The actions that come back become sends, closed connections and status lines; at the end the machine's
verdict is the report (``xrun.runner.job.report``) and the exit code. Barrier, failure, keepalive and exit-code
decisions are all the machine's; the wire format lives in ``xrun.channel``, the status display in
``xrun.runner.job.status``.

It holds 10,000 agents on its one thread (issue 15, ``python -m bench control_plane``): nothing done per message
or per loop turn scans every connection or node (connections not yet admitted wait in open order, so the oldest
is the next to time out; the machine keeps counts), and a burst of connecting agents is accepted in batches.
Each connection reads its own frames and hands them here (``xrun.runner.job.connections``); the selector, the
timers and the signals' recording are the loop's (``xrun.runner.job.loop``).

Beside the machine, ``_Extras`` reads what concerns neither the barrier nor the verdict: every rank's figures
from ``rank_exited`` (xrun.launch.result.summary: one success line, the table after a failure, ``summary.json``), and
the hang doctor's messages (``stacks``, ``want_stacks``, ``quiet``, ``spoke``) for xrun.runner.job.doctor, whose
steps become sends, lines and, for ``--hang_action stop``, the machine's ``Hung`` event. SIGQUIT to xrun asks
the doctor for a job-wide dump; a ``stop`` after a failure asks the agents for their ranks' stacks first.

The backend that started the agents (ssh sessions, a pdsh process) plugs in as a ``Sessions`` object: it
relays the agents' output through this loop and reports sessions that end. ``run`` takes over SIGINT, SIGTERM
and SIGHUP (a stop: the machine's event), SIGQUIT (a stack dump) and the ``--forward_signals``
(SIGUSR1/SIGUSR2: a ``signal`` message to every connected agent, which passes it on to its ranks; the job goes
on) on the main thread;
``own_signals=False`` lets the loop run on another thread.

Pod mode's flavour (``xrun.runner.pod.server``) overrides two seams: ``_make_job`` (its hello policy, the
verdict sent to every node) and ``_hello_event`` (the digest goes to the machine's policy).
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Callable, Protocol

from xrun.channel import ChannelError, Kind, Message, message
from xrun.launch.output.writer import writer
from xrun.launch.procs.posix import signal_name
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS
from xrun.launch.result.outcome import HANG_EXIT
from xrun.launch.result.report import write_json
from xrun.launch.result.stackview import merge, render
from xrun.launch.result.summary import RankFigures, success_line, summary_json, table_lines
from xrun.runner.job.config import JobConfig
from xrun.runner.job.connections import ACCEPTS_PER_WAKEUP, Conn, Connections, listener
from xrun.runner.job.doctor import HeadDoctor, Send, Show, Step
from xrun.runner.job.events import (
    Admit,
    AgentError,
    ConnectionLost,
    Done,
    Drop,
    Event,
    Failure,
    Heard,
    HelloReceived,
    Hung,
    NodesFaulty,
    RankExited,
    Ready,
    RunPrecheck,
    SendAccept,
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
from xrun.runner.job.gate import Gate
from xrun.runner.job.loop import SelectLoop
from xrun.runner.job.machine import Job
from xrun.runner.job.nodes import NodeState
from xrun.runner.job.report import report_lines
from xrun.runner.job.status import PlainStatus, make_status, say
from xrun.runner.job.verdict import NODE_FAILURE_EXIT
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
        self.events: deque[Event] = deque()
        self.feeding = False
        self.doers = self._action_table()
        self.extras = _Extras(self)  # the hang doctor and every rank's figures

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
        self._feed(SessionEnded(host, code, detail))

    def nodes_faulty(self, node_ranks: tuple[int, ...], reason: str) -> None:
        """These nodes are bad (``--precheck``, issue 24): replaced by hot spares before the start, else lost."""
        self._feed(NodesFaulty(node_ranks, reason))

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
            self._drop(conn)
        self.gate.close()

    def _action_table(self) -> dict[type, Callable[[Any], None]]:
        """How each of the machine's actions is carried out."""
        status = self.status
        return {
            Admit: self._admit,
            TurnAway: lambda a: self._drop_if_open(self.conns.get(a.conn)),
            Drop: lambda a: self._drop_if_open(self.node_conns.get(a.node)),
            SendSpec: self._send_spec,
            SendAccept: lambda a: self._send(a.node, message(Kind.ACCEPT)),
            SendVerdict: lambda a: self._send_all(a.nodes, verdict_message(a.verdict)),
            SendStart: lambda a: self._send_all(a.nodes, message(Kind.START, master_addr=a.master_addr,
                                                                  master_port=a.master_port, restart_count=a.attempt)),
            SendRestart: self._send_restart,
            SendStop: lambda a: self._send_all(a.nodes, message(Kind.STOP, signal=a.signal, deadline=a.deadline,
                                                                 reason=a.reason, stacks=self.extras.failure_stacks())),
            SendPing: lambda a: self._send_all(a.nodes, message(Kind.PING)),
            ShowLine: lambda a: status.line(a.text),
            ShowJoined: lambda a: status.joined(a.host, a.ready, a.total),
            ShowWaiting: lambda a: status.waiting(a.ready, list(a.missing), a.elapsed),
            ShowStarted: lambda a: status.started(a.nodes, a.ranks, a.elapsed, a.master_addr, a.master_port),
            RunPrecheck: lambda a: self.extras.run_precheck(a),
        }

    def _on_signal_received(self, signum: int) -> None:
        if signum == signal.SIGQUIT:
            self.extras.want("SIGQUIT")
            return
        if signum not in self.forwarded:
            self._feed(SignalReceived(signum))
            return
        nodes = sorted(self.node_conns)
        say(f"forwarding {signal_name(signum)} to the ranks of {len(nodes)} node(s)")
        self._send_all(nodes, message(Kind.SIGNAL, signal=int(signum)))

    def _tick(self) -> None:
        now = time.monotonic()
        for conn in self.pending.expired(now):
            self._drop(conn)  # said nothing useful in time: a stray
        self._feed(Tick())
        self.extras.tick(now)

    def _finished(self, sessions: Sessions) -> bool:
        if self.job.all_over_at is None:
            return False
        return sessions.finished(self.job.lost_hosts()) or self.job.linger_over(time.monotonic())

    def _feed(self, event: Event) -> None:
        """Hand one event to the machine and carry out its actions; events those raise (a failed send) queue."""
        self.events.append(event)
        if self.feeding:
            return
        self.feeding = True
        try:
            while self.events:
                for action in self.job.handle(self.events.popleft(), time.monotonic()):
                    self.doers[type(action)](action)
        finally:
            self.feeding = False

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
        self._feed(agent_event(node, msg))

    def on_hello(self, conn: Conn, msg: Message) -> None:
        if self.gate.waits_for_key(conn, msg):
            return  # its node's key is still on its way (pdsh): judged when it comes, or dropped at the deadline
        event = self._hello_event(conn, msg) if conn.handshake.check_hello(msg) else None
        if event is None:
            self._drop(conn, failed=True)  # not a word back: a stray learns nothing
            return
        self._feed(event)

    def _hello_event(self, conn: Conn, msg: Message) -> HelloReceived | None:
        """The proven hello as the machine's event; None: a stray (here: a malformed hello)."""
        return hello_event(conn.serial, conn.peer, msg, len(self.plan.agent_hosts))

    def on_closed(self, conn: Conn, reason: str) -> None:
        # a peer that broke the protocol, or hung up once challenged (it could not check node 0's proof, or had
        # nothing to prove), failed to get in
        self._drop(conn, failed=reason.startswith("protocol error") or conn.challenged)
        if conn.node is not None:
            self._feed(ConnectionLost(conn.node, reason))

    def _drop(self, conn: Conn, *, failed: bool = False) -> None:
        self.remove_reader(conn.sock)
        self.links.forget(conn)
        self.gate.dropped(conn, failed=failed)
        conn.close()

    def _admit(self, action: Admit) -> None:
        self.links.admit(action.conn, action.node)
        self.gate.admitted(self.conns[action.conn], action.node)

    # -- actions --------------------------------------------------------------------------------------------

    def _drop_if_open(self, conn: Conn | None) -> None:
        if conn is not None:
            self._drop(conn)

    def _send_spec(self, action: SendSpec) -> None:
        """An agent's spec; a hot spare's (--spares) is the node's it stands by for or takes the place of (node 0's
        for its standby preflight), with its own host."""
        spec = self.plan.nodes[0 if action.standby else action.node if action.node_rank is None else action.node_rank]
        host = self.plan.agent_hosts[action.node]
        spec = spec if spec.host == host else replace(spec, host=host)
        restarts = self.job.config.restart.max_restarts  # the agent waits for a restart after its done
        self._send(action.node, message(Kind.SPEC, spec=spec.to_json(), pick_master_port=action.pick_master_port,
                                        master_port=action.master_port, max_restarts=restarts, standby=action.standby))

    def _send_restart(self, action: SendRestart) -> None:
        """--max_restarts: the next attempt; what the doctor and the figures held was the attempt before's."""
        self.extras = _Extras(self)
        for node in action.nodes:
            node0 = node == action.node0
            self._send(node, message(Kind.RESTART, attempt=action.attempt, pick_master_port=node0 and
                                     action.pick_master_port, master_port=action.master_port if node0 else 0))

    def _send_all(self, nodes: Iterable[int], msg: Message) -> None:
        for node in nodes:
            self._send(node, msg)

    def _send(self, node: int, msg: Message) -> None:
        conn = self.node_conns.get(node)
        if conn is None:
            return
        try:
            conn.send(msg)
        except OSError as err:
            self.on_closed(conn, f"send failed: {err.strerror or err}")


class _Extras:
    """What the loop carries besides the job: the hang doctor (xrun.runner.job.doctor), every rank's figures
    (xrun.launch.result.summary) and ``--precheck``'s network check (xrun.runner.job.precheck_run), all fed from
    the agents' messages before the machine sees them."""

    def __init__(self, server: ControlServer) -> None:
        options = server.plan.request.options
        self.server = server
        self.doctor = HeadDoctor(self.host, hang_timeout=options.hang_timeout,
                                 hang_action=options.hang_action, log_dir=options.log_dir)
        self.figures: list[RankFigures] = []  # every rank's, from the agents' rank_exited messages
        self.precheck: Any = None  # --precheck: its ChannelPrecheck while it runs (loaded only then)

    def host(self, agent: int) -> str:
        """An agent's host as the job names it: its node's (pod mode may rename it), else a hot spare's."""
        node = self.server.job.nodes.by_agent.get(agent)
        return node.host if node is not None else self.server.plan.agent_hosts[agent]

    def run_precheck(self, action: RunPrecheck) -> None:
        from xrun.runner.job.precheck_run import ChannelPrecheck  # noqa: PLC0415 - --precheck only

        self.precheck = ChannelPrecheck(self.server, action, now=time.monotonic())

    def failure_stacks(self) -> bool:
        """A stop because something failed (not a signal, not a hang): the agents take their ranks' stacks first."""
        failure = self.server.job.failure
        return failure is not None and failure.exit_code != HANG_EXIT

    def running(self) -> list[int]:
        return [n.agent for n in self.server.job.nodes if n.state is NodeState.RUNNING and n.connected]

    def message(self, node: int, msg: Message) -> None:
        kind, now = msg.get("type"), time.monotonic()
        try:
            if kind == Kind.RANK_EXITED.value and msg.get("figures") is not None:
                self.figures.append(RankFigures.from_json(msg["figures"]))
            elif kind == Kind.STACKS.value:
                self.carry_out(self.doctor.stacks(node, msg, now))
            elif kind == Kind.WANT_STACKS.value:
                self.want(f"{msg.get('reason') or 'a request'} at {self.host(node)}")
            elif kind == Kind.QUIET.value:
                self.carry_out(self.doctor.quiet(node, self.running(), now))
            elif kind == Kind.SPOKE.value:
                self.doctor.spoke(node)
            elif kind in (Kind.PROBE_READY.value, Kind.PROBED.value) and self.precheck is not None:
                self.precheck.message(node, msg, now)
        except ValueError as err:
            raise ChannelError(f"{kind}: {err}") from None

    def want(self, reason: str) -> None:
        self.carry_out(self.doctor.want(reason, self.running(), time.monotonic()))

    def tick(self, now: float) -> None:
        self.carry_out(self.doctor.check(now, self.running()))

    def carry_out(self, steps: Iterable[Step]) -> None:
        for step in steps:
            if isinstance(step, Send):
                self.server._send_all(step.nodes, step.message)
            elif isinstance(step, Show):
                for line in step.lines:
                    say(line)
            else:
                self.server._feed(Hung(step.reason, restart=step.restart))

    def sum_up(self, verdict: Verdict) -> None:
        """After the verdict: every node's stacks from before the stop, merged; then every rank's figures (the last
        attempt's) as the agents sent them: one line on success, the table on failure, the JSON (with the
        restart history, when there were attempts)."""
        exit_code = verdict.exit_code
        stacks = self.doctor.stop_stacks
        if exit_code != 0 and stacks:
            say(f"stacks of {len(stacks)} rank(s) taken before the stop, outliers first:")
            for line in render(merge(stacks)):
                say(f"  {line}")
        if not self.figures:
            return
        if exit_code == 0:
            say(success_line(self.figures))
        else:
            sys.stderr.write("\n".join(table_lines(self.figures)) + "\n")
        log_dir = self.server.plan.request.options.log_dir
        if log_dir is not None:
            data = summary_json(self.figures, exit_code=exit_code)
            if verdict.attempts:
                data["attempts"] = [attempt.to_json() for attempt in verdict.attempts]
            write_json(os.path.join(log_dir, "summary.json"), data)


def hello_event(conn: int, peer: str, msg: Message, nodes: int) -> HelloReceived | None:
    """A well-formed hello for one of ``nodes`` as the machine's event (key unchecked); None otherwise."""
    rank = msg.get("node_rank")
    if msg.get("type") != Kind.HELLO.value or not isinstance(rank, int) or not 0 <= rank < nodes:
        return None
    versions = msg.get("versions")
    version = versions.get("xrun") if isinstance(versions, dict) else None
    addr = str(msg.get("addr") or peer)
    host = msg.get("host")
    return HelloReceived(rank, conn, addr=addr, peer=peer, xrun_version=version,
                         host=host if isinstance(host, str) and host else None)


def verdict_message(verdict: Verdict) -> Message:
    failure = verdict.failure
    return message(
        Kind.VERDICT, exit_code=verdict.exit_code, interrupted_by=verdict.interrupted_by,
        stopped_after=verdict.stopped_after, host=failure.host if failure else None,
        rank=failure.rank if failure else None, reason=failure.reason if failure else None,
    )


def agent_event(node: int, msg: Message) -> Event:
    """An admitted agent's message as the machine's event; a malformed field is a protocol error."""
    kind = msg.get("type")
    if kind == Kind.READY.value:
        return Ready(node, master_port=_int(msg, "master_port"))
    if kind == Kind.RANK_EXITED.value:
        return RankExited(
            node, rank=_int(msg, "rank"), local_rank=_int(msg, "local_rank"), code=_int(msg, "code"),
            signal=_int(msg, "signal"), stopped=bool(msg.get("stopped")),
            tail=_lines(msg, "tail"),
        )
    if kind == Kind.DONE.value:
        return Done(node, exit_code=_int(msg, "exit_code") or 0)
    if kind == Kind.ERROR.value:
        return AgentError(node, str(msg.get("message")), _int(msg, "exit_code") or NODE_FAILURE_EXIT)
    return Heard(node)  # started, pong, or a kind a newer agent added: it is alive


def _lines(msg: Message, key: str) -> tuple[str, ...]:
    value = msg.get(key) or []
    if not isinstance(value, list):
        raise ChannelError(f"{msg.get('type')}: {key} is {value!r}, not a list of lines")
    return tuple(str(line) for line in value)


def _int(msg: Message, key: str) -> int | None:
    value = msg.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ChannelError(f"{msg.get('type')}: {key} is {value!r}, not an integer")
