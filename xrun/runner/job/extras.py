"""What the control server (``xrun.runner.job.server``) carries besides the job: the hang doctor's head side
(``xrun.runner.job.doctor``), every rank's figures (``xrun.launch.result.summary``) and ``--precheck``'s network check
(``xrun.runner.network.precheck_channel``), all fed from the agents' messages before the machine sees them.

Every rank's figures come with its ``rank_exited``: at the end, one success line, the table after a failure, and
``summary.json``. The hang doctor's messages (``stacks``, ``want_stacks``, ``quiet``, ``spoke``) become its steps:
sends, lines and, for ``--hang_action stop``, the machine's ``Hung`` event. SIGQUIT to xrun asks the doctor for a
job-wide dump; a ``stop`` after a failure asks the agents for their ranks' stacks first. A restart begins a fresh
``Extras``: what it held was the attempt before's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Protocol

from xrun.channel import ChannelError, Kind, Message
from xrun.launch.output.status import say
from xrun.launch.result.outcome import HANG_EXIT
from xrun.launch.result.report import write_json
from xrun.launch.result.stackview import merge, render
from xrun.launch.result.summary import RankFigures, success_line, summary_json, table_lines
from xrun.runner.job.doctor import HeadDoctor, Send, Show, Step
from xrun.runner.job.events import Hung, RunPrecheck, Verdict
from xrun.runner.job.nodes import NodeState

if TYPE_CHECKING:
    from xrun.runner.job.dispatch import Dispatch
    from xrun.runner.job.machine import Job
    from xrun.runner.plan import Plan


class Server(Protocol):
    """What the extras read and call of their control server (``xrun.runner.job.server.ControlServer``)."""

    @property
    def job(self) -> Job: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def dispatch(self) -> Dispatch: ...

    def add_timer(self, due: Callable[[], float | None], fire: Callable[[], None]) -> None: ...


class Extras:
    """One attempt's hang doctor, rank figures and precheck, beside the job."""

    def __init__(self, server: Server) -> None:
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
        from xrun.runner.network.precheck_channel import ChannelPrecheck  # noqa: PLC0415 - --precheck only

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
                self.server.dispatch.send_all(step.nodes, step.message)
            elif isinstance(step, Show):
                for line in step.lines:
                    say(line)
            else:
                self.server.dispatch.feed(Hung(step.reason, restart=step.restart))

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
