"""Pod mode's runtime: what each node's xrun does when every node starts xrun itself (issue 11).

    the SignalLatch (from here on a shutdown signal is recorded, never its default action) -> token
    (XRUN_TOKEN / --token_file, then gone from the ranks' environment) -> PodSetup
    node 0: the control server on a background thread (xrun.runner.pod.server), handed every signal node 0 gets
    every node, node 0 included over loopback: connect (retrying quietly until --join_timeout) -> hello with
    the channel key and the plan digest -> the loop of xrun.runner.pod.agent: accept -> ready -> (barrier, its
    status on this console) -> start -> run_node(this node's own spec, ChannelHooks; its console also to node 0's)
    -> done -> (with --max_restarts: restart -> ready -> start ... ) -> the verdict -> exit
Node 0's ready carries rank 0's port (kept when free, else a free one; an explicit taken one is an error) and
the start message gives it to every node, so a busy default port never kills a job (issue 17).

Every rule is the job state machine's, on node 0 (``xrun.runner.job.machine``): the barrier, the join timeout, the
first failure stopping every node, keepalives, a refused digest (exit 2), restarts and nodes that come back
(``xrun.runner.job.rejoin``). This module only carries it out on one node: it never runs anything the channel
sends (there is no spec in pod mode), and it ends with the verdict's exit code. Node 0 prints the job's failure
report (its server does); the other nodes one line naming the root cause. Losing node 0 (its xrun killed, the
network cut) stops this node's ranks and exits 1 naming it. Signals: xrun.runner.pod.agent. With
--max_restarts a node that node 0 turned away without a word (its old connection not yet gone) says hello again
until --join_timeout.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from xrun import channel
from xrun.channel import ChannelError, Kind, Message, message
from xrun.channel.link import Credentials, Link, open_link
from xrun.errors import XrunError
from xrun.launch.preflight import check_spec, refusal
from xrun.launch.procs.signals import SHUTDOWN_SIGNALS, SignalLatch, owned_signals
from xrun.net import master_port
from xrun.runner.job.machine import LINGER
from xrun.runner.job.status import make_status, say
from xrun.runner.plan import Plan
from xrun.runner.pod.agent import (
    INTERRUPTED,
    NODE_FAILURE_EXIT,
    Node0,
    PodAgent,
    PodEnd,
    TurnedAway,
    own_name,
)
from xrun.runner.pod.plan import PodSetup, pod_setup
from xrun.runner.pod.secret import TOKEN_ENV, auth_notice, load_token, pod_key

RETRY_EVERY = 0.5  # between attempts to reach node 0
RETRY_LINE_EVERY = 10.0  # the "still waiting for node 0" line
HELLO_AGAIN_EVERY = 2.0  # --max_restarts: after node 0 turned this node away (each try is a line on node 0's console)
WRONG_KEY = ("node 0 could not prove this job's secret: is XRUN_TOKEN/--token_file the same on every node? "
             "(without one: the run id, --run_id, --master_addr, --master_port)")
REFUSED = "node 0 closed the channel without answering: this node's hello was refused (or the job had just ended)"
class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def run_pod(plan: Plan) -> int:
    """This node's share of a pod-mode job, to the job's exit code."""
    with SignalLatch().installed(SHUTDOWN_SIGNALS) as latch:  # from here on no signal takes its default action
        token = load_token(os.environ, plan.request.pod.token_file)
        os.environ.pop(TOKEN_ENV, None)  # the secret stays with xrun: no rank inherits it
        setup = pod_setup(plan, token=token)
        notice = auth_notice(token)
        if notice:
            print(notice, file=sys.stderr)
        from xrun.runner.pod.server import ServerThread  # noqa: PLC0415 - node 0 only

        server = None
        try:
            node0 = Node0(setup.control_addr, setup.control_port, plan.nodes[0].host)
            if setup.node_rank == 0:
                server = ServerThread(plan, setup, join_timeout=plan.request.remote.join_timeout)
                server.start()
                latch.listen(server.server.post_signal)  # node 0 is the job's head: its signal stops the job
                node0 = Node0(server.bind.connect, setup.control_port, node0.host)
            return run_agent(plan, setup, node0, latch)
        except PodEnd as end:
            say(end.line)
            return end.code
        except ChannelError as err:
            say(err.reason)
            return NODE_FAILURE_EXIT
        finally:
            if server is not None:
                server.join(LINGER + 2.0)  # its report is printed before this xrun exits


class _Nudge:
    """The latch's listener: a signal wakes the loop of the connection in use (``hooks``), if any."""

    def __init__(self) -> None:
        self.hooks: Any = None

    def __call__(self, signum: int) -> None:
        hooks = self.hooks
        if hooks is not None:
            hooks.post_local({"type": INTERRUPTED, "signal": signum})


def run_agent(plan: Plan, setup: PodSetup, node0: Node0, latch: SignalLatch) -> int:
    """Join node 0 and run this node's loop (xrun.runner.pod.agent); with --max_restarts a hello that node 0
    turned away without a word (this node's old connection still open there) is said again until --join_timeout."""
    from xrun.launch.connect import ChannelHooks  # noqa: PLC0415

    credentials = Credentials(pod_key(setup.token, run_id=plan.request.run_id), pinned=None)
    status = make_status(setup.num_nodes)
    join_timeout = plan.request.remote.join_timeout
    deadline = time.monotonic() + join_timeout
    nudge = _Nudge()
    latch.listen(nudge)
    turned_away = False
    try:
        while True:
            acted = latch.count  # a signal from here to the loop is the loop's (the join raises on one)
            link = _join(node0, setup, credentials, deadline, join_timeout)
            hooks = ChannelHooks(link)
            nudge.hooks = hooks
            try:
                agent = PodAgent(plan, setup, hooks, status=status, node0=node0, latch=latch, acted=acted,
                                 ready=lambda: ready_message(plan, setup))
                return agent.run()
            except TurnedAway:
                if not plan.request.restart.restarts or time.monotonic() >= deadline:
                    raise PodEnd(NODE_FAILURE_EXIT, REFUSED) from None
                if not turned_away:
                    say("node 0 turned this node away without a word (its old connection may still be open there); "
                        "saying hello again until --join_timeout")
                turned_away = True
                time.sleep(HELLO_AGAIN_EVERY)  # its old connection may be open at node 0 until the keepalive ends it
            finally:
                nudge.hooks = None
                hooks.close()
    finally:
        status.close()


def _join(node0: Node0, setup: PodSetup, credentials: Credentials, deadline: float, join_timeout: float) -> Link:
    try:
        with _interruptible():
            return join_node0(node0, setup, credentials, deadline, join_timeout)
    except _Interrupted as stop:
        raise PodEnd(128 + stop.signum, f"got {signal.Signals(stop.signum).name} before node 0 answered") from None


def join_node0(node0: Node0, setup: PodSetup, credentials: Credentials, deadline: float,
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


def connect_until(node0: Node0, deadline: float, join_timeout: float) -> socket.socket:
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
    """``ready`` once this node's preflight passed, and on node 0 of a static job the port rank 0 will use (issue
    17): the default kept where free, else a free one that the start message hands to every node. A preflight
    finding or a ``--master_port`` taken here is an ``error`` that ends the job with exit 2 on every node, naming
    this one, before any rank starts (issue 33 §2)."""
    try:
        check_spec(own_name(plan, plan.nodes[setup.node_rank]))
        if setup.node_rank != 0 or plan.nodes[0].elastic is not None:
            return message(Kind.READY)
        port = master_port(plan.nodes[0].host, setup.master_port, pick=plan.node0_picks_port)
    except XrunError as err:
        return refusal(err)
    return message(Kind.READY, master_port=port)


@contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise ``_Interrupted`` out of the join's blocking connect or handshake (main thread
    only; one that came before is handed over by the latch at once). Nothing is shared yet: raising is safe."""

    def raise_it(signum: int, _frame: object) -> None:
        raise _Interrupted(signum)

    with owned_signals(SHUTDOWN_SIGNALS, raise_it):
        yield
