"""Node 0's side of a pod-mode job: the control server (pod flavour) on a background thread.

Every node's xrun (node 0's included, over loopback) connects to it as agents connect to a head. What differs
from head mode (``xrun.runner.job.control_server.ControlServer``):

* node 0 proves the job's shared secret to each node before the node proves it back (``Gate(prove_server=True)``:
  no node knows node 0's certificate in advance), and a proven hello is then judged by the machine's policy
  (``xrun.runner.pod.hello.PodHello``: the plan digest);
* the barrier's status goes to every connected node (``waiting``), whose console shows it; node 0's console
  shows it through node 0's own agent, so the server itself shows only its one-off lines (``_show_*``);
* the verdict goes to every node (``JobConfig.verdict_to_nodes``), and the server stays until every node has
  read it and closed its connection (or ``LINGER`` passed);
* it runs off the main thread: node 0's own xrun owns the signals there (``own_signals=False``) and hands each
  shutdown signal it gets to this server (``post_signal``): node 0 is the job's head, so a signal to its xrun
  stops the job on every node, as one to the head does (never restarted);
* with ``--max_restarts`` a node other than node 0 whose connection is closed may come back
  (``xrun.runner.job.machine``'s pod-mode rules): its place on the channel reopens (``NodeKeys.release``) once,
  and only once, its old connection is gone;
* with ``--dedupe`` (the default) every node forwards its console's line records (``lines`` messages,
  xrun.common.output.consoleroute), which the server shows on node 0's console as the head shows them, merged
  across nodes (its ``console``, xrun.runner.job.relay), so a line every rank prints is shown there once (issue 17).

Where it listens (``control_bind``): on the master address when it is one of this machine's, else on every
address of its family (a Service name that resolves to a cluster IP, say); one line says which.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from xrun.channel import ChannelError, Kind, Message, message
from xrun.common.output.status import PlainStatus, say
from xrun.runner.job.config import JobConfig
from xrun.runner.job.connections import Conn
from xrun.runner.job.control_server import ControlServer, NoSessions
from xrun.runner.job.events import HelloReceived, ShowJoined, ShowStarted, ShowWaiting
from xrun.runner.job.gate import Gate
from xrun.runner.job.keys import NodeKeys
from xrun.runner.job.machine import Job
from xrun.runner.job.wire import hello_event
from xrun.runner.plan import Plan
from xrun.runner.pod.digest import PlanDigest, PlanDigestError
from xrun.runner.pod.hello import PodHello
from xrun.runner.pod.placement import PodSetup
from xrun.runner.pod.secret import pod_key


class PodControlServer(ControlServer):
    def __init__(self, plan: Plan, setup: PodSetup, *, join_timeout: float) -> None:
        self.setup = setup
        keys = NodeKeys(len(plan.nodes), shared=pod_key(setup.token, run_id=plan.request.run_id))
        gate = Gate(keys, nodes=len(plan.nodes), prove_server=True)  # node 0 proves the secret first
        super().__init__(plan, gate, join_timeout=join_timeout, status=PlainStatus(setup.num_nodes))
        self.rejoin = self.job.config.rejoins

    def drop(self, conn: Conn, *, failed: bool = False) -> None:
        super().drop(conn, failed=failed)
        node = conn.node
        if self.rejoin and node is not None and node != 0 and node not in self.node_conns:
            self.gate.keys.release(node)  # its one connection is gone: a re-created pod may take its place

    def _make_job(self, plan: Plan, join_timeout: float) -> Job:
        config = replace(JobConfig.from_plan(plan, join_timeout=join_timeout), verdict_to_nodes=True)
        hosts = tuple(node.host for node in plan.nodes)
        policy = PodHello(self.setup.digest, plan.request.run_id, hosts)
        return Job(config, now=time.monotonic(), policy=policy)

    def _hello_event(self, conn: Conn, msg: Message) -> HelloReceived | None:
        event = hello_event(conn.serial, conn.peer, msg, len(self.plan.nodes))
        if event is None:
            return None
        return event._replace(digest=_digest(msg.get("digest")))

    def _show_waiting(self, action: ShowWaiting) -> None:
        """The barrier's status goes to every node connected, whose agent shows it (node 0's included)."""
        waiting = message(Kind.WAITING, ready=action.ready, total=len(self.plan.nodes), missing=list(action.missing),
                          elapsed=round(action.elapsed, 1))
        self.send_all(list(self.node_conns), waiting)

    def _show_joined(self, action: ShowJoined) -> None:
        pass  # node 0's agent shows the barrier's status on node 0's console

    def _show_started(self, action: ShowStarted) -> None:
        pass


def _digest(data: Any) -> PlanDigest | None:
    try:
        return PlanDigest.from_json(data)
    except PlanDigestError:
        return None


@dataclass(frozen=True)
class Bind:
    addr: str  # what the server listens on
    connect: str  # where node 0's own agent connects
    note: str  # the one line that says which


def control_bind(master: str, port: int) -> Bind:
    """The master address if it is this machine's, else every address of its family."""
    try:
        infos = socket.getaddrinfo(master, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return Bind("0.0.0.0", "127.0.0.1", f"node 0 hosts the control channel on every IPv4 address, port {port} "  # noqa: S104
                    f"({master} does not resolve here: {err.strerror})")
    for family, _, _, _, sockaddr in infos:
        if _is_local(family, str(sockaddr[0])):
            return Bind(str(sockaddr[0]), str(sockaddr[0]),
                        f"node 0 hosts the control channel on {sockaddr[0]}:{port} ({master})")
    v6 = infos[0][0] == socket.AF_INET6
    wildcard, loopback = ("::", "::1") if v6 else ("0.0.0.0", "127.0.0.1")  # noqa: S104 - the point
    return Bind(wildcard, loopback, f"node 0 hosts the control channel on every IPv{6 if v6 else 4} address, port "
                f"{port} ({master} is {infos[0][4][0]}, not an address of this machine)")


def _is_local(family: int, addr: str) -> bool:
    """Only an address of this machine can be bound."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((addr, 0))
        except OSError:
            return False
    return True


class ServerThread:
    """The pod server listening on its port, served on a daemon thread; ``join`` gives the job's exit code."""

    def __init__(self, plan: Plan, setup: PodSetup, *, join_timeout: float) -> None:
        self.bind = control_bind(setup.control_addr, setup.control_port)
        self.server = PodControlServer(plan, setup, join_timeout=join_timeout)
        try:
            self.server.listen([self.bind.addr], port=setup.control_port)
        except ChannelError as err:
            raise ChannelError(f"node 0 cannot host the control channel: {err.reason} (--control_port PORT picks "
                               "another port)") from None
        say(self.bind.note)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._serve, name="xrun-pod-server", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.code = self.server.run(NoSessions(), own_signals=False)
        except Exception as err:  # noqa: BLE001 - the main thread reports it; a thread cannot raise to it
            say(f"node 0's control server failed: {err.__class__.__name__}: {err}")
            self.code = 1

    def join(self, timeout: float) -> int | None:
        self.thread.join(timeout)
        return self.code
