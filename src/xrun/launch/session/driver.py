"""The one driver of the agent's state machine (``xrun.launch.session.machine``): head mode, hot spares, restarts
and pod mode alike.

It owns what the machine must not: the connection (``xrun.launch.session.connection``), the clock, the preflight,
the ranks, the console. Everything that happens becomes one of the machine's events, posted to one ``Inbox`` (a
queue and the pipe that wakes its reader): the connection's reader thread posts the runner's messages and its
loss, pod mode's signal latch this xrun's shutdown signals. Whoever supervises takes them from there:

* while no ranks run (the hello, the preflight, the barrier, a spare's standby, between attempts): ``run``'s
  own loop on the main thread, which also gives the machine the time it asked for (``Tick``);
* while they run: the rank group's event loop (xrun.launch.ranks.supervise), which watches the inbox's pipe
  like any other reader (``attach``; under ``--elastic`` the bridge's thread to torch's agent does).

So one thread at a time feeds the machine (a lock makes sure), and a supervising loop that freezes stops
answering pings as it stops beating for its watchdog: the runner gives the node up as its ranks are stopped.

The machine's actions are carried out through one lookup table (``_how_to_carry_out``: action type -> how), one
line a kind (issue 38 §3). What is a feature's is its node half's, registered there: the hang doctor's and
telemetry's link to the head (xrun.launch.doctor.head_link: stacks and collective records on demand and before a
stop, ``want_stacks``, ``quiet``, ``spoke``, the straggler samples, the ranks' ``usage``), ``--precheck``'s probes
(xrun.launch.network.precheck_answers), ``--preload``'s helper (xrun.launch.session.preloading), the live status
(xrun.common.output.status). The driver is the rank group's link to the runner (``AgentHooks`` of
xrun.launch.agent): ``started``, ``rank_exited`` and the console's line records go out as they come, past the
machine; the ranks' end is the machine's event.

Walk of a head-mode agent: ``xrun.launch.__main__`` -> ``session.main.main`` (command line, key) ->
``connection.connect`` -> ``Driver.run``: spec -> ``_preflight`` -> ready -> start -> ``_run_attempt`` ->
``xrun.launch.agent.run_node`` -> ``RankGroup.run`` -> each rank's ``Popen`` (xrun.launch.ranks.spawn).
"""

from __future__ import annotations

import os
import queue
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from xrun.channel import DEAD_AFTER, ChannelError, Kind, Message, message
from xrun.channel.link import Credentials, Link
from xrun.common.output.consoleroute import Route, routed
from xrun.common.output.status import PlainStatus, make_status, say
from xrun.common.preflight import check_spec
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, SignalLatch, owned_signals
from xrun.common.result.errorfile import error_lines
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.outcome import NODE_FAILURE_EXIT, NodeResult, RankOutcome
from xrun.common.result.summary import RankFigures
from xrun.errors import XrunError
from xrun.launch.agent import run_node
from xrun.launch.doctor.head_link import HeadLink
from xrun.launch.network.precheck_answers import ProbeAnswers
from xrun.launch.procs.watchdog import watched_for_freezes
from xrun.launch.session.connection import SPEC_TIMEOUT, Connection, Server, connect, hello
from xrun.launch.session.events import (
    Action,
    AnswerProbe,
    AttemptEnded,
    CloseProbes,
    Delivered,
    Event,
    Exit,
    ForwardSignal,
    JoinAgain,
    OrderGroup,
    Preflight,
    PreflightFailed,
    PreflightPassed,
    RunAttempt,
    Send,
    ShowLine,
    ShowStarted,
    ShowWaiting,
    Shutdown,
    StartGroup,
    StopRanks,
    TakeStacks,
    Tick,
)
from xrun.launch.session.machine import AgentMachine
from xrun.launch.session.preloading import Preloading
from xrun.launch.store.agent_store import check_group_ports
from xrun.net import master_port
from xrun.printable import one_line

if TYPE_CHECKING:
    from xrun.launch.doctor.node_doctor import NodeDoctor
    from xrun.launch.replicas.lighthouse import KeeperWatch
    from xrun.launch.session.pod import PodNode

HELLO_AGAIN_EVERY = 2.0  # pod mode: after node 0 turned this node away (each try is a line on node 0's console)
ANY_ADDRESS = "0.0.0.0"  # noqa: S104 - pod mode's node 0: rank 0's store listens on every address


class Inbox:
    """Every event for the machine, in order: a queue, and a pipe that is readable while it holds any. ``post`` is
    safe from any thread and from a signal handler (``SimpleQueue.put`` is reentrant; a pipe write is atomic)."""

    def __init__(self) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)

    def post(self, event: Event) -> None:
        self._events.put(event)
        self.nudge()

    def nudge(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # full: it is readable already
            pass

    def wait(self, timeout: float | None, also: tuple[int, ...] = ()) -> None:
        """Until an event is posted, one of ``also`` is readable, or ``timeout`` passed."""
        select.select([self.wake_fd, *also], [], [], timeout)

    def next(self) -> Event | None:
        """The next event, if any (the pipe drained first: a post after this read wakes the reader again)."""
        try:
            os.read(self.wake_fd, 4096)
        except OSError:
            pass
        try:
            return self._events.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        os.close(self.wake_fd)
        os.close(self._wake_w)


class Driver:
    """Runs one ``AgentMachine`` over the connection ``join`` opens (see the module doc)."""

    def __init__(self, machine: AgentMachine, join: Callable[[], Link], *, inbox: Inbox | None = None,
                 first_timeout: float = DEAD_AFTER, say_line: Callable[[str], None] = say,
                 near: str | None = None, status: PlainStatus | None = None, alone: bool = False) -> None:
        self.machine = machine
        self.alone = alone  # this node is the whole job (the local run): it reports its own ranks' end
        self._join = join
        self._inbox = inbox or Inbox()
        self._first_timeout = first_timeout  # for the runner's first word (head mode: the spec)
        self._say = say_line
        self._near = near  # where rank 0's store listens (None: this end of the connection's address)
        self._status = status
        self._lock = threading.Lock()  # one feeder at a time (the elastic bridge's thread is another)
        self._connection: Connection | None = None
        self._probes: ProbeAnswers | None = None
        self._attempt: RunAttempt | None = None  # the machine asked for it: run by the main loop
        self._join_again = False
        self._group: Any = None  # a RankGroup, or the elastic StopBridge, while the ranks run
        # the features' node halves, and how each of the machine's actions is carried out (issue 38 §3)
        self._head = HeadLink(self._send)  # the hang doctor's and telemetry's link to the head
        self._preload = Preloading()  # --preload: the helper, started at the first preflight, for every attempt
        self._doers = self._how_to_carry_out()
        self._lighthouse = ExitStack()  # --replica_groups: node 0's Lighthouse, from its first preflight to the end
        self._keeper: KeeperWatch | None = None  # its keeper, watched while the ranks run

    # -- the main loop ----------------------------------------------------------------------------------------

    def run(self) -> int:
        """The agent's life from the hello to its exit code."""
        try:
            if self.machine.pod is not None:  # pod mode knows its ranks at once: the import overlaps the join
                self._preload.start(self.machine.pod.spec)
            self._open()
            while self.machine.exit_code is None:
                if self._attempt is not None:
                    attempt, self._attempt = self._attempt, None
                    self._run_attempt(attempt)
                elif self._join_again:
                    self._join_again = False
                    self._close()
                    time.sleep(HELLO_AGAIN_EVERY)  # its old connection may be open at node 0 until its keepalive ends
                    self._open()
                else:
                    self._next_events()
            return self.machine.exit_code
        finally:
            self._close()
            self._inbox.close()
            self._preload.close()
            self._lighthouse.close()

    def _open(self) -> None:
        link = self._join()
        self._connection = Connection(link, self._inbox.post, first_timeout=self._first_timeout)
        self._probes = ProbeAnswers(self._connection.send)

    def _close(self) -> None:
        self._close_probes()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _next_events(self) -> None:
        """Wait for events (or the machine's time) and feed them, up to an attempt the machine asks for: what comes
        after waits for the rank group's loop."""
        due, (imported_by, helper) = self.machine.wake_at, self._preload.wake()
        if imported_by is not None:
            due = imported_by if due is None else min(due, imported_by)
        self._inbox.wait(None if due is None else max(0.0, due - time.monotonic()), helper)
        preloaded = self._preload.hear(self._host)
        if preloaded is not None:
            self.feed(preloaded)
        while self._attempt is None and not self._join_again and self.machine.exit_code is None:
            event = self._inbox.next()
            if event is None:
                break
            self.feed(event)
        if due is not None and time.monotonic() >= due:
            self.feed(Tick())

    def feed(self, event: Event) -> None:
        """One event into the machine, its actions carried out (and what they answer, fed in turn)."""
        with self._lock:
            pending: list[Event] = [event]
            while pending:
                event = pending.pop(0)
                if self.alone and isinstance(event, PreflightFailed):
                    self._say(event.reason)  # the whole job's one finding, in its own words (its head adds none)
                for action in self.machine.handle(event, time.monotonic()):
                    answer = self._carry_out(action)
                    if answer is not None:
                        pending.append(answer)

    # -- the machine's actions --------------------------------------------------------------------------------

    def _carry_out(self, action: Action) -> Event | None:
        return self._doers[type(action)](action)

    def _how_to_carry_out(self) -> dict[type, Callable[[Any], Event | None]]:
        """How each of the machine's actions is carried out (what it answers is fed in turn)."""
        return {
            Send: self._send_action,
            Preflight: self._preflight,
            RunAttempt: self._run_next,
            StopRanks: self._stop_ranks,
            ForwardSignal: self._forward_signal,
            OrderGroup: self._order_group,
            TakeStacks: lambda a: self._head.take_stacks(a.id),
            AnswerProbe: self._answer_probe,
            CloseProbes: lambda a: self._close_probes(),
            ShowLine: lambda a: say(a.text),
            ShowWaiting: self._show_waiting,
            ShowStarted: self._show_started,
            JoinAgain: self._join_later,
            Exit: self._exit,
        }

    def _send_action(self, action: Send) -> Event | None:
        connection = self._connection
        if connection is None:
            return Delivered(False) if action.final else None
        if action.final:
            return Delivered(connection.send_final(action.message))
        connection.send(action.message)
        return None

    def _run_next(self, action: RunAttempt) -> None:
        self._attempt = action  # run by the main loop

    def _forward_signal(self, action: ForwardSignal) -> None:
        if self._group is not None:
            self._group.forward_signal(action.signum)  # a RankGroup, or the elastic StopBridge

    def _order_group(self, action: OrderGroup) -> None:
        """--replica_groups: the head's stop or start of a group across nodes, to the rank group (never the elastic
        bridge: groups are refused with --elastic)."""
        order, group = action.order, self._group
        if group is None:
            return
        if isinstance(order, StartGroup):
            group.start_group(order.group, order.restart, order.master_addr)
        else:
            group.stop_group(order.group)

    def _answer_probe(self, action: AnswerProbe) -> None:
        if self._probes is not None:
            self._probes.handle(dict(action.message))

    def _close_probes(self) -> None:
        if self._probes is not None:
            self._probes.close()

    def _show_waiting(self, action: ShowWaiting) -> None:
        if self._status is not None:
            self._status.waiting(action.ready, list(action.missing), action.elapsed)

    def _show_started(self, action: ShowStarted) -> None:
        if self._status is not None:
            self._status.started(action.nodes, action.ranks, action.elapsed, action.master_addr, action.master_port)

    def _join_later(self, action: JoinAgain) -> None:
        self._join_again = True

    def _exit(self, action: Exit) -> None:
        if action.line is not None:
            self._say(action.line)

    def _preflight(self, action: Preflight) -> Event | None:
        """What must hold before this node says ready (xrun.common.preflight: it enters the spec's working
        directory first), rank 0's port on node 0, and the preload helper's imports (None: the answer comes once
        they are in). A finding is the user's to fix: its exit code (2) travels."""
        spec = action.spec
        try:
            check_spec(spec)  # the script, interpreter and log files here, before the barrier counts it ready
            check_group_ports(spec)  # --replica_groups: each of its groups' store ports (node 0's port rule: one)
            if spec.replicas is not None and self._keeper is None and not action.standby:
                # --replica_groups, node 0: up before any rank, for every attempt. Lazy: the Lighthouse's keeper and
                # its parent-death signal (ctypes), ~3 ms of imports (python -X importtime), load in such a job
                # only, not at every agent's start (issue 38)
                from xrun.launch.replicas.lighthouse import KeeperWatch, lighthouse

                keeper = self._lighthouse.enter_context(lighthouse(spec))
                self._keeper = KeeperWatch(keeper, self._lighthouse_gone) if keeper is not None else None
            rule, port = action.port, None
            if rule is not None:
                near = self._near or (self._connection.near if self._connection is not None else ANY_ADDRESS)
                port = master_port(spec.host, rule.port, pick=rule.pick, near=near)
        except XrunError as err:  # the runner ends the job with its code, naming this host (a spare: it is lost)
            return PreflightFailed(str(err), err.exit_code)
        return self._preload.answer(spec, PreflightPassed(port))

    def _host(self) -> str:
        return self.machine.spec.host if self.machine.spec else socket.gethostname()

    def _stop_ranks(self, action: StopRanks) -> None:
        if self._group is None:
            return
        if action.hung and self._head.stop_hung(action.reason):
            return  # the head found the job hung: this node's report says so
        if action.stacks:
            self._head.stop_stacks(action.signum)  # another node failed first: what were these doing?
        self._group.request_stop(action.signum, action.reason)

    # -- an attempt: the rank group's link to the runner (xrun.launch.agent.AgentHooks, DoctorLink) ------------

    def _run_attempt(self, attempt: RunAttempt) -> None:
        """The ranks of one attempt, supervised by the rank group; ``on_result`` feeds their end. The runner gives
        a node up after ``DEAD_AFTER`` s of silence: its ranks go after as long a freeze of the loop that supervises
        them (xrun.launch.procs.watchdog)."""
        try:
            with routed(self._route()), watched_for_freezes(DEAD_AFTER):
                run_node(attempt.spec, hooks=self, preload=self._preload.helper)
        finally:
            self._group = None
            self._head.attach(None)
            if self._keeper is not None:
                self._keeper.detach()

    def _route(self) -> Route | None:
        """Where this node's console goes while its ranks run: to the head, which alone renders and shows every
        node's lines; in pod mode with ``--dedupe`` across nodes to node 0 too, which shows every node's lines
        merged, and node 0 shows its own only there (xrun.common.output.consoleroute)."""
        pod, connection = self.machine.pod, self._connection
        if connection is None or self.alone or (pod is not None and not pod.forward_console):
            return None  # alone: this process's console is the job's, no line needs a hop through the head
        return Route(connection.forward_lines, keep_local=pod is not None and pod.node_rank != 0)

    def attach(self, group: Any, doctor: NodeDoctor | None = None) -> None:
        """The rank group's loop takes over the inbox (woken once for what already waits)."""
        self._group = group
        self._head.attach(doctor)
        group.add_reader(self._inbox.wake_fd, self._on_wake)
        if self._keeper is not None:
            self._keeper.attach(group)
        self._inbox.nudge()
        self._send(message(Kind.STARTED))

    def _on_wake(self) -> None:
        while (event := self._inbox.next()) is not None:
            self.feed(event)

    def on_rank_exit(self, outcome: RankOutcome) -> None:
        self._send(message(
            Kind.RANK_EXITED,
            rank=outcome.rank,
            local_rank=outcome.local_rank,
            code=outcome.returncode,
            signal=outcome.signal,
            stopped=outcome.stopped_by_xrun,
            runtime_s=round(outcome.runtime_s, 3),
            # the recorded exception last: the head shows the end of the tail
            tail=list(outcome.stderr_tail) + (error_lines(outcome.rank, outcome.error) if outcome.error else []),
            figures=RankFigures.of(outcome).to_json(),  # the head's summary of the whole job
        ))

    def _lighthouse_gone(self, reason: str) -> None:
        """The head ends the job as a failure, naming why (its stop reaches these ranks as another node's would)."""
        self._send(message(Kind.ERROR, message=reason, exit_code=NODE_FAILURE_EXIT))

    def on_group_restart(self, restart: GroupRestart) -> None:
        self._send(message(Kind.GROUP_RESTARTED, **restart.to_json()))

    def on_group_failed(self, restart: GroupRestart) -> None:
        self._send(message(Kind.GROUP_FAILED, **restart.to_json()))

    def on_group_stopped(self, group: int) -> None:
        self._send(message(Kind.GROUP_STOPPED, group=group))

    def on_result(self, result: NodeResult) -> None:
        self._head.report(result)  # the stacks taken before the stop, before done
        root = result.root_cause.rank if result.root_cause is not None else None
        self.feed(AttemptEnded(result.exit_code, root, result.interrupted_by))

    def _send(self, msg: Message) -> None:
        if self._connection is not None:
            self._connection.send(msg)


# -- the two ways in --------------------------------------------------------------------------------------------


def run_head_mode(server: Server, credentials: Credentials, node_rank: int, *, engine: bool) -> int:
    """A multi-node run's agent (``python -m xrun.launch --connect``): this node's part, to its exit code. A
    connection that cannot be made raises ``ChannelError``."""
    machine = AgentMachine(engine=engine)
    host = socket.gethostname()
    return Driver(machine, lambda: connect(server, credentials, node_rank), first_timeout=SPEC_TIMEOUT,
                  say_line=lambda line: print(f"xrun.launch[{host}]: {one_line(line)}", file=sys.stderr)).run()


def run_local_node(sock: socket.socket, addr: str) -> int:
    """The local run's node (a one-node job: xrun.joined.one_node), over ``sock``, its end of a socketpair
    whose other end is the head's in this same process: the hello (node 0, at ``addr``: where rank 0's store
    listens), then the agent's life as in head mode, to its own exit code (the job's is the head's verdict)."""
    link = Link.plain(sock)
    link.send(hello({"node_rank": 0}, addr=addr))
    return Driver(AgentMachine(), lambda: link, first_timeout=SPEC_TIMEOUT, near=addr, alone=True).run()


def run_pod_node(node: PodNode, latch: SignalLatch) -> int:
    """Pod mode: this node's part (node 0's included, over loopback), to the job's exit code. ``latch`` owns the
    shutdown signals while no rank group does."""
    server = Server(node.node0.addr, node.node0.port, node.join_timeout, node0=node.node0.host)
    credentials = Credentials(node.key, pinned=None)
    machine = AgentMachine(pod=node, join_deadline=time.monotonic() + node.join_timeout)
    inbox = Inbox()
    latch.listen(lambda signum: inbox.post(Shutdown(signum)))  # the listener only translates: a queue put

    def join() -> Link:
        with _interruptible():
            return connect(server, credentials, node.node_rank, hello_extra={"digest": node.digest})

    status = make_status(node.num_nodes)
    try:
        return Driver(machine, join, inbox=inbox, near=ANY_ADDRESS, status=status).run()
    except _Interrupted as stop:
        say(f"got {signal.Signals(stop.signum).name} before node 0 answered")
        return 128 + stop.signum
    except ChannelError as err:
        say(err.reason)
        return NODE_FAILURE_EXIT
    finally:
        status.close()


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise ``_Interrupted`` out of the join's blocking connect or handshake (main thread
    only; one that came before is handed over by the latch at once). Nothing is shared yet: raising is safe."""

    def raise_it(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    with owned_signals(SHUTDOWN_SIGNALS, raise_it):
        yield
