"""``--precheck`` on the control server's loop (issue 24): the network check over the job's connected agents.

Why the channel and not a second fan-out: the agents are already up, authenticated and waiting at the barrier
on every node, so the probes need no new ssh session, no second interpreter start and no new credentials, and
the check covers exactly the nodes (and later the spares) that the job will run on, with the job's own
liveness and teardown: a node lost or a signal during the check ends the job like at any other moment.

The same rounds and verdicts as ``xrun check --network``: ``coordinate.Check``, driven one batch at a time
(``Stepper``) as the answers arrive. Each node is sent ``probe_open`` (toward the master address) and answers
``probe_ready`` with its probe server's address and port; each request of a batch becomes a ``probe`` to its
source node (``probe_requests``, as the ssh check sends it), answered ``probed``
(``xrun.launch.network.precheck_answers``). Deadlines keep it bounded: a node that does not open its server in
``OPEN_TIMEOUT`` is unreachable, an unanswered probe fails after its budget (the ssh check's). When the check is
over its result goes back through ``done``: the control server feeds it to the job's machine, whose rule
(``Job._precheck_done``, ``xrun.runner.job.machine``) acts on ``precheck_decision``'s decision. It knows nothing
of the job's classes: what it needs of the server comes as callables, so the head's network folder sits below
``xrun.runner.job`` and is imported by it, never the other way.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from xrun.channel import Kind, Message, message
from xrun.common.output.status import say
from xrun.runner.network.coordinate import Check, Request, Stepper
from xrun.runner.network.node_results import PrecheckResult, node_rows
from xrun.runner.network.node_verdicts import Probe
from xrun.runner.network.probe_requests import command_for, probe_budget, probe_from

OPEN_TIMEOUT = 15.0  # a node's probe server and its route lookup: instant, unless the agent is stuck
# Each check numbers its probes from its own block, so a late answer to an earlier check's probe (a standing spare's,
# checked again at a restart) is never taken for one of this check's.
ID_BLOCK = 1 << 32
_checks = itertools.count()


class ChannelPrecheck:
    """One precheck over the agents ``nodes`` (on ``hosts``); positions 0..k-1 in the check stand for them.

    What it needs of the control server comes as plain callables: ``send`` a message to a node's agent,
    ``add_timer`` on the server's loop, ``stopping`` (the job began to stop: the check ends without a word) and
    ``done`` (the result, once, for the job to decide on)."""

    def __init__(self, nodes: Sequence[int], hosts: Sequence[str], *, toward: str, now: float,
                 send: Callable[[int, Message], None],
                 add_timer: Callable[[Callable[[], float | None], Callable[[], None]], None],
                 stopping: Callable[[], bool], done: Callable[[PrecheckResult], None]) -> None:
        self.ranks = tuple(nodes)
        self.hosts = list(hosts)
        self.send, self.stopping, self.done = send, stopping, done
        self.position = {rank: i for i, rank in enumerate(self.ranks)}
        self.t0 = now
        self.hellos: dict[int, dict[str, Any]] = {}
        self.stepper: Stepper | None = None
        self.batch: Sequence[Request] = ()
        self.answers: dict[int, Probe] = {}
        self.first_id = next(_checks) * ID_BLOCK  # ids of the batch: first_id + its index
        self.deadline: float | None = now + OPEN_TIMEOUT
        self.over = False  # the result went to the job: what still arrives is late
        add_timer(lambda: self.deadline, lambda: self.tick(time.monotonic()))
        for rank in self.ranks:
            send(rank, message(Kind.PROBE_OPEN, toward=toward))

    def message(self, node: int, msg: Message, now: float) -> None:
        where = self.position.get(node)
        if where is None or self.over or self._abandoned():
            return
        if msg.get("type") == Kind.PROBE_READY.value:
            if self.stepper is None:
                self.hellos[where] = msg
                if len(self.hellos) == len(self.ranks):
                    self._begin(now)
            return
        index = msg.get("id")
        if isinstance(index, int) and 0 <= index - self.first_id < len(self.batch):
            request = self.batch[index - self.first_id]
            if request.src == where:
                self.answers[index - self.first_id] = probe_from(request, msg)
                if len(self.answers) == len(self.batch):
                    self._next(now)

    def tick(self, now: float) -> None:
        if self.deadline is None or self.over or self._abandoned() or now < self.deadline:
            return
        if self.stepper is None:
            self._begin(now)
            return
        for i, request in enumerate(self.batch):
            if i not in self.answers:
                host = self.hosts[request.src]
                self.answers[i] = Probe(request.src, request.dst, ok=False,
                                        error=f"no answer from the agent on {host} within {probe_budget(request):g} s")
        self._next(now)

    def _abandoned(self) -> bool:
        """The job is stopping (a node lost, a signal): the check ends without a word; the machine has decided."""
        if self.stopping():
            self.deadline = None
            return True
        return False

    def _begin(self, now: float) -> None:
        down = {}
        for i in range(len(self.hosts)):
            hello = self.hellos.get(i)
            if hello is None:
                down[i] = f"its agent did not open a probe server within {OPEN_TIMEOUT:g} s"
            elif not hello.get("address") or not isinstance(hello.get("port"), int):
                down[i] = f"its probe server found no address on the route to the master: {hello.get('interface')}"
        self.stepper = Stepper(Check(range(len(self.ranks)), down))
        self._send_batch(self.stepper.first(), now)

    def _next(self, now: float) -> None:
        assert self.stepper is not None
        self._send_batch(self.stepper.answer([self.answers[i] for i in range(len(self.batch))]), now)

    def _send_batch(self, requests: Sequence[Request], now: float) -> None:
        if not requests:
            self._finish(now)
            return
        self.first_id += len(self.batch)
        self.batch, self.answers = requests, {}
        load: dict[int, float] = {}  # a node runs its probes in turn: its budgets add up
        for i, request in enumerate(requests):
            command = command_for(request, self.hellos[request.src], self.hellos[request.dst])
            self.send(self.ranks[request.src], message(Kind.PROBE, id=self.first_id + i, **command))
            load[request.src] = load.get(request.src, 0.0) + probe_budget(request)
        self.deadline = now + max(load.values())

    def _finish(self, now: float) -> None:
        assert self.stepper is not None and self.stepper.outcome is not None
        self.deadline, self.over = None, True
        rows = node_rows(self.hosts, self.hellos, self.stepper.outcome.verdicts)
        result = PrecheckResult(tuple(self.ranks), tuple(rows), now - self.t0)
        if result.bad:
            for line in result.table():
                say(f"precheck: {line}")
        self.done(result)

