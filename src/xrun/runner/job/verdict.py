"""The job's failure and verdict rules (``xrun.runner.job.machine``): what counts as a failure, which one is the
root cause, and the job's exit code, decided in one place (``exit_code``) once every node is over.

The first failure (a rank's own exit, an agent error, a lost node, a session that ended before its agent
connected, nodes ``--precheck`` found bad, or ``Hung``: every node silent for --hang_timeout with --hang_action
stop, exit code ``HANG_EXIT``) is the root cause. A signal to xrun that stopped the job is kept beside it: before
any failure it is the cause (128 + the signal, and no later failure counts); after one (a Ctrl-C while xrun stops
the job for a lost node) it only hurried the stop, so the failure stays the root cause and its code the job's, as
a node's own verdict has it (``xrun.common.result.outcome.node_exit_code``), and the end line says both in their
order (issue 37 §4). Pure: no clock, no I/O.

``--on_rank_exit keep`` (in-process recovery, issue 39 §3): a rank that fails while another rank of the job still
runs is *lost*, not a failure: the others recover in place and nothing stops. Only the last rank's failure (the
job's last rank to end) is one. The survivors decide: exit 0 when they all finish 0; a node's own exit code is not
read (its ranks' exits said it all); a lost node, an agent error or a hang still end the job as always.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xrun.common.procs.posix import signal_name
from xrun.common.result.hints import IN_TEARDOWN, aborted_in_teardown
from xrun.common.result.outcome import HANG_EXIT, NODE_FAILURE_EXIT
from xrun.runner.job.events import AgentError, Attempt, Done, Failure, Hung, RankExited, SessionEnded, Verdict
from xrun.runner.job.nodes import Node, NodeState

if TYPE_CHECKING:
    from xrun.runner.network.precheck_decision import NodesBad

REFUSED_EXIT = 2  # a node the hello policy refused: the job was started inconsistently (a usage error)


class RootCause:
    """The first failure and the signal that stopped the job; the verdict, fixed once every node is over."""

    def __init__(self, *, elastic: bool, keep_survivors: bool = False, world_size: int = 0) -> None:
        self.elastic = elastic
        self.keep_survivors = keep_survivors  # --on_rank_exit keep
        self.world_size = world_size
        self.ended: set[int] = set()  # the attempt's ranks whose exit was heard
        self.lost: list[int] = []  # --on_rank_exit keep: the attempt's ranks lost while others ran on
        self.failure: Failure | None = None
        self.failure_at: float | None = None
        self.interrupted_by: int | None = None
        self.fixed: Verdict | None = None  # set once: it stays whatever arrives during the last linger
        self.attempts: tuple[Attempt, ...] = ()  # --max_restarts: the history the verdict carries
        self.restart_lines: tuple[str, ...] = ()

    def next_attempt(self) -> None:
        """--max_restarts: the attempt over was retried; the next one's first failure is its own root cause."""
        self.failure = self.failure_at = None
        self.ended, self.lost = set(), []

    def keeps(self, event: RankExited, failure: Failure | None) -> bool:
        """--on_rank_exit keep: ``failure`` (``event``'s) lost a rank while others of the job still run: recorded,
        and no failure. The last rank's failure (or one with no rank number) is a failure like any other."""
        if event.rank is None:
            return False
        self.ended.add(event.rank)
        if not self.keep_survivors or failure is None or len(self.ended) >= self.world_size:
            return False
        self.lost.append(event.rank)
        return True

    def failed(self, failure: Failure, now: float) -> None:
        if self.failure is None and self.interrupted_by is None:  # the first one is the root cause
            self.failure, self.failure_at = failure, now

    def interrupted(self, signum: int) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signum

    def decide(self, nodes: Sequence[Node], all_over_at: float | None) -> Verdict:
        """The job's exit code and its root cause: the one place either is decided."""
        stopped_after = None
        if self.failure_at is not None and all_over_at is not None:
            stopped_after = all_over_at - self.failure_at
        code = exit_code(nodes, self.failure, self.interrupted_by, elastic=self.elastic,
                         keep_survivors=self.keep_survivors)
        return Verdict(code, self.failure, self.interrupted_by, stopped_after, self.attempts, self.restart_lines,
                       tuple(sorted(self.lost)))

    def fix(self, nodes: Sequence[Node], all_over_at: float) -> Verdict:
        self.fixed = self.decide(nodes, all_over_at)
        return self.fixed


def exit_code(nodes: Sequence[Node], failure: Failure | None, interrupted_by: int | None, *, elastic: bool,
              keep_survivors: bool = False) -> int:
    """The root cause's code (a failure is only recorded before any stop signal), else 128 + the signal that
    stopped the job, else what the nodes finished with (--on_rank_exit keep: 0, the lost ranks do not count)."""
    if failure is not None:
        return failure.exit_code or NODE_FAILURE_EXIT
    if interrupted_by is not None:
        return 128 + interrupted_by
    done = [n.exit_code or 0 for n in nodes if n.state is NodeState.DONE]
    if elastic and done:
        return max(done)  # a lost node was torch's to handle
    if any(n.state is NodeState.LOST for n in nodes):
        return NODE_FAILURE_EXIT
    if keep_survivors:
        return 0
    return max((n.exit_code or 0 for n in nodes), default=0)


# -- what counts as a failure, and how it reads -------------------------------------------------------------


def rank_failure(event: RankExited, host: str) -> Failure | None:
    """A rank that ended on its own, other than with 0 (one xrun stopped is a consequence, never a cause)."""
    if event.stopped or (event.code == 0 and event.signal is None):
        return None
    if event.signal is not None:
        code, how = 128 + event.signal, f"was killed by {signal_name(event.signal)}"
    else:
        code, how = NODE_FAILURE_EXIT if event.code is None else event.code, f"exited with code {event.code}"
    teardown = f" {IN_TEARDOWN}" if aborted_in_teardown(code, event.tail) else ""
    reason = f"rank {event.rank} (local {event.local_rank}) on {host} {how}{teardown}"
    return Failure(host, reason, code, rank=event.rank, tail=event.tail)


def done_failure(event: Done, host: str) -> Failure | None:
    if event.exit_code == 0:
        return None
    return Failure(host, f"agent on {host} exited with code {event.exit_code}", event.exit_code)


def agent_failure(event: AgentError, host: str) -> Failure:
    # name the host once: an error that names it already (a busy --master_port "in use on node1") stands alone
    named = re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", event.message)
    reason = event.message if named else f"agent on {host}: {event.message}"
    return Failure(host, reason, event.exit_code, final=event.exit_code == REFUSED_EXIT)  # a busy --master_port


def session_failure(event: SessionEnded, host: str) -> Failure:
    """A session that ended before its node's agent connected."""
    what = f"exited with code {event.code}" if event.code is not None else "ended"
    hint = f" ({event.detail})" if event.detail else " (see its output above)"
    return Failure(host, f"the session to {host} {what} before its agent connected{hint}",
                   event.code or NODE_FAILURE_EXIT)


def lost_failure(host: str, reason: str) -> Failure:
    return Failure(host, f"lost node {host}: {reason}", NODE_FAILURE_EXIT)


def hang_failure(event: Hung) -> Failure:
    return Failure("every node", event.reason, HANG_EXIT, final=not event.restart)


def refused_failure(host: str, reason: str) -> Failure:
    return Failure(host, reason, REFUSED_EXIT, final=True)


def precheck_failure(bad: NodesBad) -> Failure:
    """--precheck found nodes bad and no spare replaces them: final, a restart on the same nodes would meet them."""
    return Failure(", ".join(bad.hosts), bad.reason, NODE_FAILURE_EXIT, final=True)
