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
over the result goes to the machine as ``PrecheckDone``, whose rule (``xrun.runner.job.faulty``) acts on
``precheck_decision``'s decision.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from xrun.channel import Kind, Message, message
from xrun.launch.output.status import say
from xrun.runner.job.events import PrecheckDone, RunPrecheck
from xrun.runner.network.coordinate import Check, Request, Stepper
from xrun.runner.network.node_results import PrecheckResult, node_rows
from xrun.runner.network.node_verdicts import Probe
from xrun.runner.network.probe_requests import command_for, probe_budget, probe_from

if TYPE_CHECKING:
    from xrun.runner.job.dispatch import Dispatch
    from xrun.runner.job.machine import Job


class Server(Protocol):
    """What the check reads and calls of the control server (``xrun.runner.job.server.ControlServer``)."""

    @property
    def job(self) -> Job: ...

    @property
    def dispatch(self) -> Dispatch: ...

    def add_timer(self, due: Callable[[], float | None], fire: Callable[[], None]) -> None: ...


OPEN_TIMEOUT = 15.0  # a node's probe server and its route lookup: instant, unless the agent is stuck
# Each check numbers its probes from its own block, so a late answer to an earlier check's probe (a standing spare's,
# checked again at a restart) is never taken for one of this check's.
ID_BLOCK = 1 << 32
_checks = itertools.count()


class ChannelPrecheck:
    """One precheck over ``action.nodes``; positions 0..k-1 in the check stand for those node ranks."""

    def __init__(self, server: Server, action: RunPrecheck, *, now: float) -> None:
        self.server = server
        self.ranks = action.nodes
        self.hosts = list(action.hosts) or [server.job.nodes[rank].host for rank in self.ranks]
        self.position = {rank: i for i, rank in enumerate(self.ranks)}
        self.t0 = now
        self.hellos: dict[int, dict[str, Any]] = {}
        self.stepper: Stepper | None = None
        self.batch: Sequence[Request] = ()
        self.answers: dict[int, Probe] = {}
        self.first_id = next(_checks) * ID_BLOCK  # ids of the batch: first_id + its index
        self.deadline: float | None = now + OPEN_TIMEOUT
        self.over = False  # the result went to the machine: what still arrives is late
        server.add_timer(lambda: self.deadline, lambda: self.tick(time.monotonic()))
        for rank in self.ranks:
            server.dispatch.send(rank, message(Kind.PROBE_OPEN, toward=action.toward))

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
        if self.server.job.stopping:
            self.deadline = None
        return self.server.job.stopping

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
            self.server.dispatch.send(self.ranks[request.src], message(Kind.PROBE, id=self.first_id + i, **command))
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
        self.server.dispatch.feed(PrecheckDone(result))

