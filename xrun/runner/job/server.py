"""The runner's control server: the socket loop around the job state machine (``xrun.runner.job.machine``).

One per run, single-threaded (``selectors``), on the address the nodes use. It listens, accepts, checks each
hello's token (constant time; a stray connection, or one silent past ``HELLO_TIMEOUT``, is closed without a
byte sent back), reads frames, and turns what arrives into the machine's events: agents' messages, dropped
connections, backend sessions that end (``session_ended``), signals and time passing. The actions that come
back become sends, closed connections and status lines; at the end the machine's verdict is the report
(``xrun.runner.job.report``) and the exit code. Barrier, failure, keepalive and exit-code decisions are all the
machine's; the wire format lives in ``xrun.channel``, the status display in ``xrun.runner.job.status``.

It holds 10,000 agents on its one thread (issue 15, ``python -m bench control_plane``): nothing done per message
or per loop turn scans every connection or node (connections not yet admitted wait in open order, so the oldest
is the next to time out; the machine keeps counts), and a burst of connecting agents is accepted in batches.

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
verdict sent to every node) and ``_hello_event`` (the key and digest go to the machine's policy instead of
the one-time token being checked here).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.launch.procs.posix import signal_name
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS, owned_signals
from xrun.launch.result.outcome import HANG_EXIT
from xrun.launch.result.report import write_json
from xrun.launch.result.stackview import merge, render
from xrun.launch.result.summary import RankFigures, success_line, summary_json, table_lines
from xrun.runner.job.config import JobConfig
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
    RankExited,
    Ready,
    SendAccept,
    SendPing,
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


@dataclass(eq=False)
class _Conn:
    serial: int
    sock: socket.socket
    peer: str
    opened: float
    reader: channel.FrameReader = field(default_factory=lambda: channel.FrameReader(channel.MAX_HELLO))
    node: int | None = None  # set once the machine admits its hello


_ACCEPTS_PER_WAKEUP = 64  # a burst of connecting agents is taken in few loop turns, yet reads are not starved


class _Unadmitted(dict[int, _Conn]):
    """Connections whose hello is not yet admitted, in the order they opened: the oldest times out first, so
    neither the loop's timeout nor its tick scans every connection (issue 15)."""

    def deadline(self) -> float | None:
        oldest = next(iter(self.values()), None)
        return None if oldest is None else oldest.opened + channel.HELLO_TIMEOUT

    def expired(self, now: float) -> Iterator[_Conn]:
        """The connections past ``HELLO_TIMEOUT``, oldest first (the caller drops each as it comes)."""
        while self and now - (oldest := next(iter(self.values()))).opened > channel.HELLO_TIMEOUT:
            yield oldest


class ControlServer:
    def __init__(self, plan: Plan, token: str, *, join_timeout: float, status: PlainStatus | None = None) -> None:
        self.plan = plan
        self.token = token
        self.job = self._make_job(plan, join_timeout)
        self.sel = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []
        self.conns: dict[int, _Conn] = {}
        self.pending = _Unadmitted()
        self.node_conns: dict[int, _Conn] = {}
        self.serials = itertools.count()
        self.status = status if status is not None else make_status(len(plan.nodes))
        self.signals: list[int] = []
        self.forwarded = frozenset(plan.request.options.forward_signals)  # passed on, not a stop
        self.strays = 0
        self.events: deque[Event] = deque()
        self.feeding = False
        self.doers = self._action_table()
        self.extras = _Extras(self)  # the hang doctor and every rank's figures
        self.timers: list[tuple[Callable[[], float | None], Callable[[], None]]] = []  # add_timer

    # What the tests (and a curious caller) read of the outcome.
    @property
    def failure(self) -> Failure | None:
        return self.job.failure

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
                sock = _listener(addr, port, backlog=len(self.plan.nodes))
            except ChannelError:
                self.close()
                raise
            port = sock.getsockname()[1]
            self.listeners.append(sock)
            self.sel.register(sock, selectors.EVENT_READ, lambda s=sock: self._accept(s))
        return port

    def add_reader(self, fileobj: Any, callback: Callable[[], None]) -> None:
        self.sel.register(fileobj, selectors.EVENT_READ, callback)

    def add_timer(self, due: Callable[[], float | None], fire: Callable[[], None]) -> None:
        """``fire()`` after every wake-up; ``due()`` (a monotonic time, or None) bounds the wait for the next."""
        self.timers.append((due, fire))

    def remove_reader(self, fileobj: Any) -> None:
        try:
            self.sel.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def session_ended(self, host: str | None, code: int | None, detail: str = "") -> None:
        """A backend session ended (``host`` None: the one session of every node, e.g. pdsh)."""
        self._feed(SessionEnded(host, code, detail))

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self, sessions: Sessions, *, own_signals: bool = True) -> int:
        """Serve until every node is over; the job's exit code. ``own_signals`` needs the main thread."""
        try:
            with self._signals(own_signals):
                sessions.register(self)
                while not self._finished(sessions):
                    for key, _ in self.sel.select(self._timeout()):
                        key.data()
                    for _, fire in self.timers:
                        fire()
                    while self.signals:
                        self._on_signal_received(self.signals.pop(0))
                    self._tick()
        finally:
            self.status.close()
            sessions.terminate()
            self.close()
        verdict = self.job.verdict()
        for line in report_lines(verdict, strays=self.strays + self.job.strays):
            say(line)
        self.extras.sum_up(verdict.exit_code)
        return verdict.exit_code

    def close(self) -> None:
        for sock in self.listeners:
            self.remove_reader(sock)
            sock.close()
        self.listeners.clear()
        for conn in list(self.conns.values()):
            self._drop(conn)

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
                                                                  master_port=a.master_port)),
            SendStop: lambda a: self._send_all(a.nodes, message(Kind.STOP, signal=a.signal, deadline=a.deadline,
                                                                 reason=a.reason, stacks=self.extras.failure_stacks())),
            SendPing: lambda a: self._send_all(a.nodes, message(Kind.PING)),
            ShowLine: lambda a: status.line(a.text),
            ShowJoined: lambda a: status.joined(a.host, a.ready, a.total),
            ShowWaiting: lambda a: status.waiting(a.ready, list(a.missing), a.elapsed),
            ShowStarted: lambda a: status.started(a.nodes, a.ranks, a.elapsed, a.master_addr, a.master_port),
        }

    @contextlib.contextmanager
    def _signals(self, own: bool) -> Iterator[None]:
        if not own:
            yield
            return
        with owned_signals((*SHUTDOWN_SIGNALS, signal.SIGQUIT, *sorted(self.forwarded)), self._on_signal) as owned:

            def drain() -> None:
                owned.drain()  # the wake-up only ends select(); _on_signal has recorded the signal

            self.add_reader(owned.wake_fd, drain)
            try:
                yield
            finally:
                self.remove_reader(owned.wake_fd)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)  # acted on by the loop

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

    def _timeout(self) -> float:
        deadlines = [self.job.next_deadline(), self.pending.deadline(), self.extras.doctor.deadline()]
        deadlines += [due() for due, _ in self.timers]
        return max(0.0, min(d for d in deadlines if d is not None) - time.monotonic())

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

    # -- connections ----------------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, peer = listener.accept()
            except OSError:  # none left (EAGAIN), or one that went away before we took it
                return
            self._opened(sock, peer)

    def _opened(self, sock: socket.socket, peer: Any) -> None:
        sock.setblocking(True)
        sock.settimeout(5.0)  # bounds a send to a peer that stopped reading; reads happen only when readable
        channel.tune_socket(sock)
        conn = _Conn(serial=next(self.serials), sock=sock, peer=str(peer[0]), opened=time.monotonic())
        self.conns[conn.serial] = conn
        self.pending[conn.serial] = conn
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
                    self._agent_message(conn.node, msg)
        except ChannelError as err:
            self._closed(conn, f"protocol error: {err.reason}")

    def _agent_message(self, node: int, msg: Message) -> None:
        self.extras.message(node, msg)
        self._feed(agent_event(node, msg))

    def _hello(self, conn: _Conn, msg: Message) -> None:
        event = self._hello_event(conn, msg)
        if event is None:
            self.strays += 1
            self._drop(conn)  # not a word back: a stray learns nothing
            return
        self._feed(event)

    def _hello_event(self, conn: _Conn, msg: Message) -> HelloReceived | None:
        """The hello as the machine's event; None: a stray (here: the one-time token does not match)."""
        if not channel.token_matches(self.token, msg.get("token")):
            return None
        return hello_event(conn.serial, conn.peer, msg, len(self.plan.nodes))

    def _closed(self, conn: _Conn, reason: str) -> None:
        self._drop(conn)
        if conn.node is not None:
            self._feed(ConnectionLost(conn.node, reason))

    def _drop(self, conn: _Conn) -> None:
        self.remove_reader(conn.sock)
        self.conns.pop(conn.serial, None)
        self.pending.pop(conn.serial, None)
        try:
            conn.sock.close()
        except OSError:
            pass
        if conn.node is not None and self.node_conns.get(conn.node) is conn:
            del self.node_conns[conn.node]

    # -- actions --------------------------------------------------------------------------------------------

    def _admit(self, action: Admit) -> None:
        conn = self.conns[action.conn]
        del self.pending[conn.serial]
        conn.node = action.node
        conn.reader.limit = channel.MAX_FRAME
        self.node_conns[action.node] = conn

    def _drop_if_open(self, conn: _Conn | None) -> None:
        if conn is not None:
            self._drop(conn)

    def _send_spec(self, action: SendSpec) -> None:
        spec = self.plan.nodes[action.node].to_json()
        self._send(action.node, message(Kind.SPEC, spec=spec, pick_master_port=action.pick_master_port,
                                        master_port=action.master_port))

    def _send_all(self, nodes: Iterable[int], msg: Message) -> None:
        for node in nodes:
            self._send(node, msg)

    def _send(self, node: int, msg: Message) -> None:
        conn = self.node_conns.get(node)
        if conn is None:
            return
        try:
            channel.send(conn.sock, msg)
        except OSError as err:
            self._closed(conn, f"send failed: {err.strerror or err}")


class _Extras:
    """What the loop carries besides the job: the hang doctor (xrun.runner.job.doctor) and every rank's figures
    (xrun.launch.result.summary), both fed from the agents' messages before the machine sees them."""

    def __init__(self, server: ControlServer) -> None:
        options = server.plan.request.options
        self.server = server
        self.doctor = HeadDoctor(tuple(n.host for n in server.plan.nodes), hang_timeout=options.hang_timeout,
                                 hang_action=options.hang_action, log_dir=options.log_dir)
        self.figures: list[RankFigures] = []  # every rank's, from the agents' rank_exited messages

    def failure_stacks(self) -> bool:
        """A stop because something failed (not a signal, not a hang): the agents take their ranks' stacks first."""
        failure = self.server.job.failure
        return failure is not None and failure.exit_code != HANG_EXIT

    def running(self) -> list[int]:
        return [n.rank for n in self.server.job.nodes if n.state is NodeState.RUNNING and n.connected]

    def message(self, node: int, msg: Message) -> None:
        kind, now = msg.get("type"), time.monotonic()
        try:
            if kind == Kind.RANK_EXITED.value and msg.get("figures") is not None:
                self.figures.append(RankFigures.from_json(msg["figures"]))
            elif kind == Kind.STACKS.value:
                self.carry_out(self.doctor.stacks(node, msg, now))
            elif kind == Kind.WANT_STACKS.value:
                self.want(f"{msg.get('reason') or 'a request'} at {self.server.plan.nodes[node].host}")
            elif kind == Kind.QUIET.value:
                self.carry_out(self.doctor.quiet(node, self.running(), now))
            elif kind == Kind.SPOKE.value:
                self.doctor.spoke(node)
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
                self.server._feed(Hung(step.reason))

    def sum_up(self, exit_code: int) -> None:
        """After the verdict: every node's stacks from before the stop, merged; then every rank's figures as the
        agents sent them: one line on success, the table on failure, the JSON."""
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
            write_json(os.path.join(log_dir, "summary.json"), summary_json(self.figures, exit_code=exit_code))


def _listener(addr: str, port: int, *, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
    except OSError as err:
        sock.close()
        raise ChannelError(f"cannot listen on {addr}:{port}: {err.strerror}") from None
    sock.listen(max(256, backlog))  # every node may connect at once; the kernel caps it at net.core.somaxconn
    sock.setblocking(False)
    return sock


def hello_event(conn: int, peer: str, msg: Message, nodes: int) -> HelloReceived | None:
    """A well-formed hello for one of ``nodes`` as the machine's event (key unchecked); None otherwise."""
    rank = msg.get("node_rank")
    if msg.get("type") != Kind.HELLO.value or not isinstance(rank, int) or not 0 <= rank < nodes:
        return None
    versions = msg.get("versions")
    version = versions.get("xrun") if isinstance(versions, dict) else None
    addr = str(msg.get("addr") or peer)
    return HelloReceived(rank, conn, addr=addr, peer=peer, xrun_version=version)


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
