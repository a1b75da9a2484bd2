"""The local run as a one-node job (issue 38 §1): the head's control server and the node's driver, the same two as
a multi-node job's, joined inside xrun's one process by a socketpair (no TLS, no listening socket, no second
interpreter). Pod mode's node 0 has the same shape over loopback TCP (xrun.joined.pod).

    the SignalLatch (from here on a shutdown signal is recorded, never its default action; the head is told)
    -> socket.socketpair(): the head's end a plain connection (``ControlServer.open_plain``), the node's a plain
       link (``xrun.launch.session.driver.run_local_node``)
    -> ``LocalServer.run`` on a background thread (``own_signals=False``): the job state machine
       (xrun.runner.job.machine): restarts, the stop, the verdict, ``summary.json`` (attempts, stragglers) and
       ``failure.json``
    -> the node's ``Driver`` on the main thread: hello, spec, preflight (the preload helper), ready, start, the
       ranks (the rank group owns the signals while they run), done -> the server's verdict: xrun's exit code

What a one-node job shows differs from a job of several only where there is nothing to say: no barrier status
(the one node is this process), and the node's own report is the job's (its ranks' table, the success line); the
head adds only what the restarts say.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from xrun.channel import Kind, Message
from xrun.common.output.status import say
from xrun.common.procs.signals import SHUTDOWN_SIGNALS, SignalLatch
from xrun.launch.session.driver import run_local_node
from xrun.runner.job.config import JobConfig
from xrun.runner.job.control_server import ControlServer, NoSessions
from xrun.runner.job.events import ShowJoined, ShowStarted, ShowWaiting, Verdict
from xrun.runner.job.figures import write_job_summary
from xrun.runner.job.gate import Gate
from xrun.runner.job.machine import LINGER, Job
from xrun.runner.plan import Plan, PortChoice


class LocalServer(ControlServer):
    """The head of a one-node job: no barrier to show; the node's report is the job's (see the module doc)."""

    alone = True  # its ranks share this process's clock; a straggler is named in the node's words
    said_why = False  # the node's preflight failed: it said why, and that is the job's last line

    def _agent_message(self, node: int, msg: Message) -> None:
        self.said_why = self.said_why or msg.get("type") == Kind.ERROR.value
        super()._agent_message(node, msg)

    def _make_job(self, plan: Plan, join_timeout: float) -> Job:
        """The plan drew rank 0's free port (a local run): it is the node's first try, and each restart's is a
        fresh one its agent picks (a port the last attempt's ranks held may linger in TIME_WAIT)."""
        config = JobConfig.from_plan(plan, join_timeout=join_timeout)
        fresh = plan.request.master_port_choice is PortChoice.FREE and config.elastic is None
        return Job(replace(config, pick_master_port=fresh or config.pick_master_port), now=time.monotonic())

    def _show_joined(self, action: ShowJoined) -> None:
        pass

    def _show_waiting(self, action: ShowWaiting) -> None:
        pass

    def _show_started(self, action: ShowStarted) -> None:
        pass

    def _sum_up(self, verdict: Verdict, log_dir: str | None, recorded: Mapping[str, Any] | None) -> None:
        if log_dir is not None and self.figures.ranks:  # the line or the table: the node's own report said it
            # "every node stopped X s later" times a stop across nodes; the one node's report has its own times
            write_job_summary(log_dir, self.figures.ranks, verdict._replace(stopped_after=None),
                              self.telemetry.scores.to_json(), recorded)

    def _last_words(self, verdict: Verdict) -> list[str]:
        # --max_restarts: why they ended, each attempt's root cause; not after a preflight's finding, which ends
        # the run in its one line (xrun.launch.session.driver.Driver.alone)
        return [] if self.said_why else list(verdict.restart_lines)


def run_one_node_job(plan: Plan) -> int:
    """The local run, to the job's exit code."""
    with SignalLatch().installed(SHUTDOWN_SIGNALS) as latch:
        head_end, node_end = socket.socketpair()
        server = LocalServer(plan, Gate.in_process(), join_timeout=plan.request.remote.join_timeout)
        server.open_plain(head_end, plan.rendezvous.known_master_addr)
        codes: list[int] = []
        thread = threading.Thread(target=_serve, args=(server, codes), name="xrun-head", daemon=True)
        thread.start()
        latch.listen(server.post_signal)  # the head stops the job, as a multi-node job's does
        try:
            node_code = run_local_node(node_end, plan.rendezvous.known_master_addr)
        finally:
            thread.join(LINGER + 2.0)  # the head's last words are said before xrun exits
        return codes[0] if codes else node_code


def _serve(server: LocalServer, codes: list[int]) -> None:
    try:
        codes.append(server.run(NoSessions(), own_signals=False))
    except Exception as err:  # noqa: BLE001 - the main thread reports it; a thread cannot raise to it
        say(f"the job's control server failed: {err.__class__.__name__}: {err}")
