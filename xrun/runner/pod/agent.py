"""This node's part of a pod-mode job once its hello is sent: the barrier, each attempt, the verdict (issues 11, 23).

One loop on the main thread. The channel's reader thread answers node 0's pings and queues everything else
(``xrun.launch.connect.ChannelHooks.listen``); a shutdown signal to this xrun is recorded by the process's
``SignalLatch`` (xrun.launch.procs.signals), which wakes the loop with a local message. The loop:

    accept, or restart -> ready (node 0: rank 0's port, checked or picked)      waiting -> the status line
    start -> this node's ranks (run_node, the attempt's TORCHELASTIC_RESTART_COUNT) -> done
    stop before a start -> done with 128+signal                                 verdict -> exit with its code

With ``--max_restarts`` it goes round once per attempt: after ``done`` it waits for node 0's ``restart`` or the
verdict. A node that comes back after its xrun was lost runs the same loop: node 0 parks it until the next
attempt and then sends it that attempt's ``restart`` (xrun.runner.job.rejoin).

A shutdown signal to this xrun, whenever it comes (``on_signal``):

* node 0: its server was handed the signal at once (``PodControlServer.post_signal``) and stops the job on every
  node, never restarted: this loop goes on to the verdict;
* another node, with ``--max_restarts``: it leaves the job (its ranks stopped first, if they ran), exit
  128+signal; node 0 counts it a lost node that the next attempt waits for (an evicted pod comes back);
* another node, without: before its ranks start, its ``done`` with 128+signal fails the job everywhere (the
  rank group does the same once they run); after its ``done`` it leaves, exit 128+signal.
"""

from __future__ import annotations

import queue
import signal
import socket
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from xrun.channel import Kind, Message, message
from xrun.errors import XrunError
from xrun.launch.connect import ChannelHooks, node0_port, with_rendezvous
from xrun.launch.output.consoleroute import Route, routed
from xrun.launch.preflight import check_spec, refusal
from xrun.launch.procs.signals import SignalLatch
from xrun.launch.spec import NodeSpec
from xrun.runner.job.events import Failure, Verdict
from xrun.runner.job.machine import LINGER
from xrun.runner.job.relay import merges_nodes
from xrun.runner.job.report import report_lines
from xrun.runner.job.status import PlainStatus, say
from xrun.runner.job.stop import STOP_GRACE
from xrun.runner.plan import Plan
from xrun.runner.pod.plan import PodSetup

NODE_FAILURE_EXIT = 1
INTERRUPTED = "xrun-local:signal"  # this process's wake-up for the loop; the latch holds the facts


class PodEnd(Exception):
    """This node's part ends early with ``code``; ``line`` says why (printed as one xrun line)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code
        self.line = line


class TurnedAway(Exception):
    """Node 0 closed the channel without a word after this node's hello (with --max_restarts: try again)."""


@dataclass(frozen=True)
class Node0:
    addr: str  # where this node connects
    port: int
    host: str  # node 0's name in the plan, for messages


def lost_line(node0: Node0, reason: str) -> str:
    return (f"lost node 0 ({node0.host}), which hosts the job's control channel: {reason}; this node's ranks are "
            f"stopped (exit code {NODE_FAILURE_EXIT})")


class PodAgent:
    """The loop of the module doc, over one admitted connection (``hooks``)."""

    def __init__(self, plan: Plan, setup: PodSetup, hooks: ChannelHooks, *, status: PlainStatus, node0: Node0,
                 latch: SignalLatch, acted: int, ready: Callable[[], Message]) -> None:
        self.plan, self.setup, self.hooks, self.status, self.node0 = plan, setup, hooks, status, node0
        self.latch = latch
        self.acted = acted  # the latch's count this loop has acted on
        self.ready = ready  # the first ready (node 0: its port)
        self.restarts = plan.request.restart.restarts
        self.done = False  # this attempt's done went out
        self.code = 0  # the last attempt's own exit code
        self.t0 = time.monotonic()

    def run(self) -> int:
        """To the verdict's exit code (``PodEnd``: earlier; ``TurnedAway``: try the hello again)."""
        self.hooks.listen()
        while True:
            msg = self._next()
            if self.latch.count > self.acted:
                self.acted = self.latch.count
                self.on_signal(self.latch.last or signal.SIGTERM)
            kind = msg.get("type")
            if kind == Kind.VERDICT.value:
                return verdict_code(self.setup, msg)
            if kind in (Kind.ACCEPT.value, Kind.RESTART.value):
                self.done, self.t0 = False, time.monotonic()
                if kind == Kind.RESTART.value and self.setup.node_rank != 0:  # node 0's server says it there
                    say(f"node 0 restarts the job on every node: attempt {msg.get('attempt')}")
                self.hooks.send(self.ready() if kind == Kind.ACCEPT.value else self._restart_ready(msg))
            elif kind == Kind.WAITING.value:
                self.status.waiting(int(msg.get("ready") or 0), [str(h) for h in msg.get("missing") or ()],
                                    float(msg.get("elapsed") or 0.0))
            elif kind == Kind.START.value and not self.done:  # done: a signal declined this attempt meanwhile
                self._attempt(msg)
            elif kind == Kind.STOP.value and not self.done:  # refused, or another node failed or timed out
                self._done(128 + int(msg.get("signal") or signal.SIGTERM))

    def on_signal(self, signum: int) -> None:
        """A shutdown signal to this xrun, acted on here (see the module doc)."""
        if self.setup.node_rank == 0:
            return  # its server has it: the stop and the verdict follow
        name = signal.Signals(signum).name
        if self.restarts:
            raise PodEnd(128 + signum, f"got {name}: this node leaves the job; node 0 restarts it and waits for this "
                                       f"node to come back (the same command, within --join_timeout)")
        if self.done:
            raise PodEnd(128 + signum, f"got {name} after this node's part was over; exit code {128 + signum}")
        self._done(128 + signum)  # evicted while waiting: this node fails the job, the verdict says how

    def _next(self) -> Message:
        """The next message from node 0, or this process's signal wake-up."""
        bound = None
        if self.done and self.code != 0 and not self.restarts:  # a failure is over within the stop deadline
            bound = self.plan.request.options.shutdown_timeout + STOP_GRACE + LINGER + 5.0
        try:
            msg = self.hooks.next_message(bound)
        except queue.Empty:
            raise PodEnd(self.code, f"no verdict from node 0 ({self.node0.host}) within {bound:g} s; exiting with "
                                    f"this node's own code {self.code}") from None
        if msg is None:
            if not self.hooks.heard:
                raise TurnedAway()
            raise PodEnd(NODE_FAILURE_EXIT, lost_line(self.node0, self.hooks.lost_reason or "connection lost"))
        return msg

    def _done(self, code: int) -> None:
        self.done, self.code = True, code
        self.hooks.send(message(Kind.DONE, exit_code=code))

    def _restart_ready(self, restart: Message) -> Message:
        """--max_restarts: the preflight again, then ready (node 0 with the port it checked or picked, as for the
        first start); an ``error`` the job ends with if either fails."""
        spec = own_name(self.plan, self.plan.nodes[self.setup.node_rank])
        try:
            check_spec(spec)  # the script may be gone since: node 0 names this host
            port = node0_port(spec.host, restart, near="0.0.0.0")  # noqa: S104 - node 0 only: others get no port
        except XrunError as err:
            return refusal(err)
        return message(Kind.READY, master_port=port)

    def _attempt(self, start: Message) -> None:
        """This node's ranks for one attempt, to its ``done``; with --max_restarts, a signal meanwhile is this
        node's leave (its ranks were stopped by it)."""
        from xrun.launch.agent import run_node  # noqa: PLC0415 - the rank group loads once the barrier is passed

        plan, setup = self.plan, self.setup
        port, attempt = start_port(plan, start), start.get("restart_count")
        attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0
        self.status.started(setup.num_nodes, plan.world_size, time.monotonic() - self.t0, plan.rendezvous.master_addr,
                            port)
        spec = own_name(plan, plan.nodes[setup.node_rank])
        if spec.elastic is None and (port != plan.rendezvous.master_port or attempt):  # node 0's pick, the attempt
            spec = with_rendezvous(spec, plan.rendezvous.master_addr, port, attempt)
        before = self.latch.count
        with routed(console_route(plan, setup, self.hooks)):
            self.code = run_node(spec, hooks=self.hooks)
        self.done = True
        self.hooks.detach()  # until the next start, what node 0 says goes to the inbox
        if self.latch.count > before:  # the rank group got it and stopped the ranks; its done said 128+signal
            self.acted = self.latch.count
            if self.restarts:
                self.on_signal(self.latch.last or signal.SIGTERM)


def own_name(plan: Plan, spec: NodeSpec) -> NodeSpec:
    """This node's spec under the host name it reports in its hello, where the plan could only number the nodes:
    its lines' prefixes, log folder and reports then name the pod a user finds in ``kubectl`` (issue 25 §6)."""
    return replace(spec, host=socket.gethostname()) if plan.request.pod.numbered else spec


def start_port(plan: Plan, start: Message) -> int:
    """Rank 0's port as the start message says (node 0's pick), else the plan's."""
    port = start.get("master_port")
    return port if isinstance(port, int) and not isinstance(port, bool) and port else plan.rendezvous.master_port


def console_route(plan: Plan, setup: PodSetup, hooks: Any) -> Route | None:
    """With ``--dedupe`` every node's console goes to node 0 too, which shows the job's lines merged across nodes;
    node 0 shows its own only there (xrun.launch.output.consoleroute)."""
    if not merges_nodes(plan):
        return None
    return Route(hooks.forward_output, keep_local=setup.node_rank != 0)


def verdict_code(setup: PodSetup, msg: Message) -> int:
    """Exit with the verdict's code; every node but node 0 (whose server prints the report) names the cause."""
    verdict = verdict_from(msg)
    if setup.node_rank != 0:
        for line in report_lines(verdict)[:1]:
            say(line)
    return verdict.exit_code


def verdict_from(msg: Message) -> Verdict:
    code = msg.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else NODE_FAILURE_EXIT
    failure = None
    if msg.get("reason") is not None:
        rank = msg.get("rank")
        failure = Failure(str(msg.get("host")), str(msg.get("reason")), code,
                          rank=rank if isinstance(rank, int) else None)
    signum, after = msg.get("interrupted_by"), msg.get("stopped_after")
    return Verdict(code, failure, signum if isinstance(signum, int) else None,
                   float(after) if isinstance(after, (int, float)) else None)
