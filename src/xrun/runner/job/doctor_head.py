"""The hang doctor's head half as the control server runs it (issue 14, issue 38 §3): the agents' ``stacks``,
``collectives``, ``want_stacks``, ``quiet`` and ``spoke`` read by kind (``reads``, registered with the control
server), a job-wide dump on SIGQUIT (``want``), the hang watch as time passes (``check``), and the steps the pure
``HeadDoctor`` (xrun.runner.job.doctor) returns carried out: a message to nodes, lines for the user, ``Hung`` fed
to the job's machine. The node half is ``xrun.launch.doctor``.

One ``HeadDoctor`` per attempt (``begin_attempt``: the attempt before's dumps are not this one's); the last one's
findings go into the job's report and ``failure.json`` (``current``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from xrun.channel import Kind, Message, Reader
from xrun.common.output.status import say
from xrun.common.spec import AgentOptions
from xrun.runner.job.doctor import Hang, HeadDoctor, Send, Show, Step
from xrun.runner.job.events import Event, Hung


class DoctorHead:
    """The current attempt's ``HeadDoctor`` and what carries out its steps."""

    def __init__(self, options: AgentOptions, world_size: int | None, *, host: Callable[[int], str],
                 running: Callable[[], list[int]], send_all: Callable[[Iterable[int], Message], None],
                 feed: Callable[[Event], None]) -> None:
        self.options = options
        self.world_size = world_size
        self.host = host  # an agent's host as the job names it
        self.running = running  # the agents whose ranks run now, connected
        self.send_all = send_all
        self.feed = feed
        self.current = self._new()

    def reads(self) -> dict[Kind, Reader]:
        return {Kind.STACKS: self._stacks, Kind.COLLECTIVES: self._collectives, Kind.WANT_STACKS: self._want_stacks,
                Kind.QUIET: self._quiet, Kind.SPOKE: self._spoke}

    def begin_attempt(self) -> None:
        self.current = self._new()

    def want(self, reason: str) -> None:
        """A job-wide stack dump of the running nodes (SIGQUIT, or an agent's ``want_stacks``)."""
        self._carry_out(self.current.want(reason, self.running(), time.monotonic()))

    def check(self, now: float) -> None:
        """Time passed: a dump complete or overdue is shown, a silence of every running node is a hang."""
        self._carry_out(self.current.check(now, self.running()))

    def deadline(self) -> float | None:
        return self.current.deadline()

    def _new(self) -> HeadDoctor:
        options = self.options
        return HeadDoctor(self.host, hang_timeout=options.hang_timeout, hang_action=options.hang_action,
                          log_dir=options.log_dir, world_size=self.world_size)

    def _stacks(self, node: int, msg: Message, now: float) -> None:
        self._carry_out(self.current.stacks(node, msg, now))

    def _collectives(self, node: int, msg: Message, now: float) -> None:
        self.current.collectives(node, msg)

    def _want_stacks(self, node: int, msg: Message, now: float) -> None:
        self.want(f"{msg.get('reason') or 'a request'} at {self.host(node)}")

    def _quiet(self, node: int, msg: Message, now: float) -> None:
        self._carry_out(self.current.quiet(node, self.running(), now))

    def _spoke(self, node: int, msg: Message, now: float) -> None:
        self.current.spoke(node)

    def _carry_out(self, steps: Iterable[Step]) -> None:
        for step in steps:
            if isinstance(step, Send):
                self.send_all(step.nodes, step.message)
            elif isinstance(step, Show):
                for line in step.lines:
                    say(line)
            elif isinstance(step, Hang):
                self.feed(Hung(step.reason, restart=step.restart, root_cause=step.root_cause))
