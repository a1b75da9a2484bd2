"""Pod mode's runtime: what each node's xrun does when every node starts xrun itself (issue 11).

    token (XRUN_TOKEN / --token_file, then gone from the ranks' environment) -> PodSetup
    node 0: the control server on a background thread (xrun.runner.pod.server)
    every node, node 0 included over loopback: connect (retrying quietly until --join_timeout) -> hello with
    the channel key and the plan digest -> accept -> ready -> (barrier, its status on this console) -> start
    -> run_node(this node's own spec, ChannelHooks; its console also to node 0's) -> done -> the verdict -> exit
Node 0's ready carries rank 0's port (kept when free, else a free one; an explicit taken one is an error) and
the start message gives it to every node, so a busy default port never kills a job (issue 17).

Every rule is the job state machine's, on node 0 (``xrun.runner.job.machine``): the barrier, the join timeout, the
first failure stopping every node, keepalives, a refused digest (exit 2). This module only carries it out on
one node: it never runs anything the channel sends (there is no spec in pod mode), and it ends with the
verdict's exit code. Node 0 prints the job's failure report (its server does); the other nodes one line
naming the root cause. Losing node 0 (its xrun killed, the network cut) stops this node's ranks and exits 1
naming it; a SIGTERM (pod eviction) before the ranks start is reported as this node's exit 128+15, which
fails the job everywhere, as the rank group's own SIGTERM handling does once they run.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.channel.link import Credentials, Link, open_link
from xrun.errors import PortBusyError
from xrun.launch.output.consoleroute import Route, routed
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS, owned_signals
from xrun.launch.spec import NodeSpec
from xrun.net import master_port
from xrun.runner.job.events import Failure, Verdict
from xrun.runner.job.machine import LINGER, STOP_GRACE
from xrun.runner.job.relay import merges_nodes
from xrun.runner.job.report import report_lines
from xrun.runner.job.status import PlainStatus, make_status, say
from xrun.runner.plan import Plan
from xrun.runner.pod.plan import PodSetup, pod_setup
from xrun.runner.pod.secret import TOKEN_ENV, auth_notice, load_token, pod_key

RETRY_EVERY = 0.5  # between attempts to reach node 0
RETRY_LINE_EVERY = 10.0  # the "still waiting for node 0" line
WRONG_KEY = ("node 0 could not prove this job's secret: is XRUN_TOKEN/--token_file the same on every node? "
             "(without one: the run id, --run_id, --master_addr, --master_port)")
REFUSED = "node 0 closed the channel without answering: this node's hello was refused (or the job had just ended)"
NODE_FAILURE_EXIT = 1


class PodEnd(Exception):
    """This node's part ends early with ``code``; ``line`` says why (printed as one xrun line)."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code
        self.line = line


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class _Node0:
    addr: str  # where this node connects
    port: int
    host: str  # node 0's name in the plan, for messages


def run_pod(plan: Plan) -> int:
    """This node's share of a pod-mode job, to the job's exit code."""
    token = load_token(os.environ, plan.request.pod.token_file)
    os.environ.pop(TOKEN_ENV, None)  # the secret stays with xrun: no rank inherits it
    setup = pod_setup(plan, token=token)
    notice = auth_notice(token)
    if notice:
        print(notice, file=sys.stderr)
    from xrun.runner.pod.server import ServerThread  # noqa: PLC0415 - node 0 only

    server = None
    try:
        node0 = _Node0(setup.control_addr, setup.control_port, plan.nodes[0].host)
        if setup.node_rank == 0:
            server = ServerThread(plan, setup, join_timeout=plan.request.remote.join_timeout)
            server.start()
            node0 = _Node0(server.bind.connect, setup.control_port, node0.host)
        return run_agent(plan, setup, node0)
    except PodEnd as end:
        say(end.line)
        return end.code
    except ChannelError as err:
        say(err.reason)
        return NODE_FAILURE_EXIT
    finally:
        if server is not None:
            server.join(LINGER + 2.0)  # its report is printed before this xrun exits


def run_agent(plan: Plan, setup: PodSetup, node0: _Node0) -> int:
    credentials = Credentials(pod_key(setup.token, run_id=plan.request.run_id), pinned=None)
    status = make_status(setup.num_nodes)
    t0 = time.monotonic()
    try:
        with _interruptible():
            link = join_node0(node0, setup, credentials, t0 + plan.request.remote.join_timeout,
                              plan.request.remote.join_timeout)
    except _Interrupted as stop:
        status.close()
        raise PodEnd(128 + stop.signum, f"got {signal.Signals(stop.signum).name} before node 0 answered") from None
    try:
        start = barrier(link, status, node0, ready=lambda: ready_message(plan, setup))
        if start is None:
            return _finish(setup, wait_verdict(link, node0))
        port = start_port(plan, start)
        status.started(setup.num_nodes, plan.world_size, time.monotonic() - t0, plan.rendezvous.master_addr, port)
        return run_ranks(plan, setup, link, node0, port)
    finally:
        status.close()
        link.close()


def join_node0(node0: _Node0, setup: PodSetup, credentials: Credentials, deadline: float,
               join_timeout: float) -> Link:
    """Reach node 0, TLS, node 0 proves the job's secret first, then this node proves it and says hello (with
    its plan digest). A node 0 that closes before the handshake is through (at its bound of unproven
    connections, or still starting) is tried again until ``deadline``; one that cannot prove the secret ends
    this node at once, having learnt nothing (xrun.channel.link)."""
    while True:
        sock = connect_until(node0, deadline, join_timeout)
        try:
            return open_link(sock, credentials, setup.node_rank, functools.partial(pod_hello, sock=sock, setup=setup),
                             timeout=max(2.0, min(channel.HELLO_TIMEOUT, deadline - time.monotonic())))
        except ChannelError as err:
            sock.close()
            if err.reason.startswith("the server did not prove"):
                raise PodEnd(NODE_FAILURE_EXIT, WRONG_KEY) from None
            if time.monotonic() >= deadline:
                raise PodEnd(NODE_FAILURE_EXIT, f"node 0 ({node0.host}) did not complete the channel's handshake "
                                                f"within --join_timeout {join_timeout:g} s: {err.reason}") from None
            time.sleep(RETRY_EVERY)


def pod_hello(proof: Mapping[str, Any], *, sock: socket.socket, setup: PodSetup) -> Message:
    from xrun.launch.connect import hello  # noqa: PLC0415 - the agent's own hello, plus the digest

    return {**hello(proof, sock), "digest": setup.digest.to_json()}


def connect_until(node0: _Node0, deadline: float, join_timeout: float) -> socket.socket:
    """Node 0 may start last: retry a refused, unreachable or unresolvable master until ``deadline``."""
    next_line = None
    while True:
        left = deadline - time.monotonic()
        try:
            sock = socket.create_connection((node0.addr, node0.port), timeout=max(0.2, min(5.0, left)))
        except OSError as err:
            why = err.strerror or str(err)
            if left <= 0:
                raise PodEnd(NODE_FAILURE_EXIT, f"node 0 ({node0.host}) did not open the control channel at "
                                                f"{node0.addr}:{node0.port} within --join_timeout {join_timeout:g} "
                                                f"s ({why}): is it running?") from None
            now = time.monotonic()
            if next_line is None:
                say(f"node 0's control channel at {node0.addr}:{node0.port} is not up yet ({why}); retrying until "
                    f"--join_timeout ({left:.0f} s left)")
                next_line = now + RETRY_LINE_EVERY
            elif now >= next_line:
                say(f"still waiting for node 0 ({node0.host}) at {node0.addr}:{node0.port}: {left:.0f} s left")
                next_line = now + RETRY_LINE_EVERY
            time.sleep(min(RETRY_EVERY, max(0.0, left)))
            continue
        sock.settimeout(None)
        channel.tune_socket(sock)
        return sock


def ready_message(plan: Plan, setup: PodSetup) -> Message:
    """``ready``, and on node 0 of a static job the port rank 0 will use (issue 17): the default kept where free,
    else a free one that the start message hands to every node; a ``--master_port`` taken here is an
    ``error`` that ends the job with exit 2 before any rank starts."""
    if setup.node_rank != 0 or plan.nodes[0].elastic is not None:
        return message(Kind.READY)
    try:
        port = master_port(plan.nodes[0].host, setup.master_port, pick=plan.node0_picks_port)
    except PortBusyError as err:
        return message(Kind.ERROR, message=str(err), exit_code=err.exit_code)
    return message(Kind.READY, master_port=port)


def start_port(plan: Plan, start: Message) -> int:
    """Rank 0's port as the start message says (node 0's pick), else the plan's."""
    port = start.get("master_port")
    return port if isinstance(port, int) and not isinstance(port, bool) and port else plan.rendezvous.master_port


def barrier(link: Link, status: PlainStatus, node0: _Node0,
            *, ready: Callable[[], Message]) -> Message | None:
    """Hello answered -> ``ready()`` -> the start barrier. The start message: start the ranks; None: the job ended
    first."""
    answered = False
    try:
        with _interruptible():
            while True:
                try:
                    msg = link.recv(timeout=channel.DEAD_AFTER)
                except ChannelError as err:
                    raise PodEnd(NODE_FAILURE_EXIT, _lost(node0, err.reason) if answered else REFUSED) from None
                answered = True
                kind = msg.get("type")
                if kind == Kind.ACCEPT.value:
                    link.send(ready())
                elif kind == Kind.WAITING.value:
                    status.waiting(int(msg.get("ready") or 0), [str(h) for h in msg.get("missing") or ()],
                                   float(msg.get("elapsed") or 0.0))
                elif kind == Kind.PING.value:
                    link.send(message(Kind.PONG))
                elif kind == Kind.START.value:
                    return msg
                elif kind == Kind.STOP.value:  # refused, or another node failed or timed out
                    link.send(message(Kind.DONE, exit_code=128 + int(msg.get("signal") or signal.SIGTERM)))
                    return None
    except _Interrupted as stop:  # evicted while waiting: this node fails the job, the verdict says how
        status.close()
        if not answered:
            raise PodEnd(128 + stop.signum, f"got {signal.Signals(stop.signum).name} before node 0 answered") from None
        link.send(message(Kind.DONE, exit_code=128 + stop.signum))
        return None


def run_ranks(plan: Plan, setup: PodSetup, link: Link, node0: _Node0, port: int) -> int:
    from xrun.launch.agent import run_node  # noqa: PLC0415 - the rank group loads once the barrier is passed
    from xrun.launch.connect import ChannelHooks, with_rendezvous  # noqa: PLC0415

    spec = own_name(plan, plan.nodes[setup.node_rank])
    if spec.elastic is None and port != plan.rendezvous.master_port:  # node 0 took another: every rank's env says so
        spec = with_rendezvous(spec, plan.rendezvous.master_addr, port)
    hooks = ChannelHooks(link)
    try:
        with routed(console_route(plan, setup, hooks)):
            code = run_node(spec, hooks=hooks)
        # Done went out: the verdict follows once every node is over. A failure is over within the stop
        # deadline; a success waits for the slowest node (the keepalive notices a lost node 0 meanwhile).
        bound = None if code == 0 else plan.request.options.shutdown_timeout + STOP_GRACE + LINGER + 5.0
        return _finish(setup, _next_verdict(hooks, bound, node0, code))
    finally:
        hooks.close()


def own_name(plan: Plan, spec: NodeSpec) -> NodeSpec:
    """This node's spec under the host name it reports in its hello, where the plan could only number the nodes:
    its lines' prefixes, log folder and reports then name the pod a user finds in ``kubectl`` (issue 25 §6)."""
    return replace(spec, host=socket.gethostname()) if plan.request.pod.numbered else spec


def console_route(plan: Plan, setup: PodSetup, hooks: Any) -> Route | None:
    """With ``--dedupe`` every node's console goes to node 0 too, which shows the job's lines merged across nodes;
    node 0 shows its own only there (xrun.launch.output.consoleroute)."""
    if not merges_nodes(plan):
        return None
    return Route(hooks.forward_output, keep_local=setup.node_rank != 0)


def _next_verdict(hooks: Any, bound: float | None, node0: _Node0, code: int) -> Message:
    deadline = None if bound is None else time.monotonic() + bound
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            msg: Message | None = hooks.next_message(left)
        except queue.Empty:
            raise PodEnd(code, f"no verdict from node 0 ({node0.host}) within {bound:g} s; exiting with this "
                               f"node's own code {code}") from None
        if msg is None:
            raise PodEnd(NODE_FAILURE_EXIT, _lost(node0, hooks.lost_reason or "connection lost"))
        if msg.get("type") == Kind.VERDICT.value:
            return msg


def wait_verdict(link: Link, node0: _Node0) -> Message:
    """Before any rank started: answer pings until the verdict comes."""
    while True:
        try:
            msg = link.recv(timeout=channel.DEAD_AFTER)
        except ChannelError as err:
            raise PodEnd(NODE_FAILURE_EXIT, _lost(node0, err.reason)) from None
        if msg.get("type") == Kind.VERDICT.value:
            return msg
        if msg.get("type") == Kind.PING.value:
            link.send(message(Kind.PONG))


def _finish(setup: PodSetup, msg: Message) -> int:
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


def _lost(node0: _Node0, reason: str) -> str:
    return (f"lost node 0 ({node0.host}), which hosts the job's control channel: {reason}; this node's ranks are "
            f"stopped (exit code {NODE_FAILURE_EXIT})")


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise ``_Interrupted`` out of a blocking connect or receive (main thread only)."""

    def raise_it(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    with owned_signals(SHUTDOWN_SIGNALS, raise_it):
        yield
