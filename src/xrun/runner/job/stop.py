"""How an attempt stops (``xrun.runner.job.machine``): the failure, signal or lost node that stops every node, once,
against one deadline.

The first failure is the root cause (``RootCause``) and stops every other node with SIGTERM; SIGINT, SIGTERM and
SIGHUP stop every node gracefully, a second SIGINT with SIGKILL at once. A node whose agent is lost (its connection
dropped, silent past the keepalive, its session ended) ends the attempt as a failure, except that ``--elastic``
leaves it to torch while at least ``--min_nodes`` remain (issue 6). Once stopping, a node that neither finishes nor
answers by the deadline (the agents' own ``--shutdown_timeout`` and ``STOP_GRACE``) counts as lost. What a launcher
then says of the sessions the stop ended (pdsh: ``ssh exited with exit code 143``) is only its echo (``echoed``).

Pure, like the machine: each step returns the actions it takes; the machine keeps their order.
"""

from __future__ import annotations

import signal

from xrun.common.procs.posix import signal_name
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Action, Drop, Failure, SendStop, ShowLine
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.verdict import RootCause, lost_failure

STOP_GRACE = 5.0  # beyond the agents' own shutdown deadline before a node counts as not stopping
# What a node stopped by the stop's signals exits with (SIGINT, SIGTERM, SIGKILL): a launcher's report of one is
# the echo of this stop. 255 never is: it is also ssh's own failure.
STOP_CODES = frozenset(128 + int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL))
SSH_FAILED = 255


class Stop:
    """The current attempt's stop: whether it has begun, its deadline, and what leads to it."""

    def __init__(self, config: JobConfig, nodes: Nodes, cause: RootCause) -> None:
        self.config = config
        self.nodes = nodes
        self.cause = cause
        self.stopping = False
        self.deadline: float | None = None
        self.sigints = 0  # over the whole job: a restart does not make the next Ctrl-C a first one
        self.signalled: set[int] = set()  # SIGTERM and SIGHUP already stopping the job: a repeat changes nothing

    def next_attempt(self) -> None:
        """--max_restarts: the attempt that stopped is over; the next one has not stopped."""
        self.stopping, self.deadline = False, None

    def fail(self, failure: Failure, now: float) -> list[Action]:
        self.cause.failed(failure, now)
        return self.stop(signal.SIGTERM, failure.reason, now)

    def signal(self, signum: int, now: float) -> list[Action]:
        """xrun got ``signum`` (SIGINT, SIGTERM, SIGHUP)."""
        if signum == signal.SIGINT:
            self.sigints += 1
            if self.sigints > 1:  # second Ctrl-C: do not wait for the graceful deadline
                return self.stop(signal.SIGKILL, "second SIGINT", now)
        if signum in self.signalled:  # GNU timeout sends its SIGTERM to xrun and to xrun's group: one stop, one line
            return []
        self.signalled.add(signum)
        self.cause.interrupted(signum)  # after a failure: kept beside it, which stays the root cause
        name = signal_name(signum)
        said = "already stopping every node" if self.stopping else "stopping every node"
        return [ShowLine(f"got {name}; {said}"), *self.stop(signal.SIGTERM, f"xrun got {name}", now)]

    def lose(self, node: Node, reason: str, now: float) -> list[Action]:
        """``node``'s agent is gone: a failure, unless the elastic job goes on without it."""
        out = self.mark_lost(node, reason)
        if self.elastic_survivable():
            left = self.nodes.left()
            out.append(ShowLine(f"lost node {node.host}: {reason}; {left} node(s) left, they re-rendezvous without it"))
        elif not self.stopping or self.cause.failure is None:
            out += self.fail(lost_failure(node.host, reason), now)
        return out

    def mark_lost(self, node: Node, reason: str) -> list[Action]:
        """``node`` is lost (unless already done), and its connection, if any, dropped."""
        if node.state is NodeState.DONE:
            return []
        node.state = NodeState.LOST
        out: list[Action] = [ShowLine(f"{node.host}: {reason}")] if self.stopping else []
        if node.connected:
            node.connected = False
            out.append(Drop(node.agent))
        return out

    def overdue(self, now: float) -> list[Action]:
        """Past the stop's deadline, every node not over is lost."""
        if self.deadline is None or now < self.deadline:
            return []
        out: list[Action] = []
        for node in self.nodes:
            if not node.over:
                out += self.mark_lost(node, "did not stop before the deadline")
        return out

    def echoed(self, host: str, code: int) -> bool:
        """A launcher says the session to ``host`` exited with ``code`` (pdsh: ``ssh exited with exit code 143``):
        is that only the echo of this stop? Yes once the stop began, for a code the stop's signals give, or the
        code that ``host``'s node's agent already reported (its done, or its error: a preflight's refusal); never for
        ssh's own 255."""
        if not self.stopping or code == SSH_FAILED:
            return False
        if code in STOP_CODES:
            return True
        reported = (NodeState.DONE, NodeState.LOST)  # a lost node's code is its error's; one that dropped has none
        return any(n.state in reported and n.exit_code == code for n in self.nodes.by_host.get(host, ()))

    def elastic_survivable(self) -> bool:
        """--elastic: enough nodes are still running or may still join for torch to carry on."""
        rule = self.config.elastic
        return rule is not None and not self.stopping and self.nodes.left() >= rule.min_nodes

    def stop(self, signum: int, reason: str, now: float) -> list[Action]:
        """Every reachable node is told to stop: once, or again with SIGKILL (a new deadline)."""
        first = not self.stopping
        self.stopping = True
        if not first and signum != signal.SIGKILL:
            return []
        deadline = self.config.shutdown_timeout
        self.deadline = now + deadline + STOP_GRACE
        targets = self.nodes.reachable()
        return [SendStop(targets, int(signum), deadline, reason)] if targets else []
