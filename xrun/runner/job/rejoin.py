"""Pod mode's late and returning nodes (``xrun.runner.job.machine``): a hello the head-mode rules do not cover.

In pod mode (``JobConfig.verdict_to_nodes``) every node starts its own xrun, so a node's hello can come when the
job is no longer waiting for it:

* **late**: it never joined and the job is already stopping (another node failed, the join timed out): it is
  admitted only to be told how the job ends (a stop, or the verdict once fixed), so it exits with the job's code;
* **back** (issue 23, with ``--max_restarts``): a node other than node 0 whose agent is gone (its pod evicted and
  re-created with the same index, its xrun killed and started again) proves the secret again. Its old connection
  must be gone first (``Nodes``: a node has one connection; the pod server reopens the place only then), so at
  any moment one live agent at most holds a node's place. While the attempt that lost it is still ending, or
  after its own part of an attempt is over, it is admitted and *parked* (DONE and connected: pinged, never
  counted live, told the next ``restart`` or the verdict like the others); once the next attempt's barrier is
  open it joins it as any node does. A node back after the job's end is told the verdict. One back with another
  plan digest is turned away, named (its place stays open for the right one until ``--join_timeout``), where a
  node that joins the first attempt so is refused and ends the job with exit 2.

Which lost nodes the next attempt may wait for (``unawaited``): with re-join, every node but node 0 (it hosts the
channel), unless it was already awaited at the barrier of the attempt just over and did not come within
``--join_timeout``: that one ends the job, named. Pure: the machine feeds the state, these give its actions.
"""

from __future__ import annotations

import signal
from typing import Protocol

from xrun.runner.job.attempts import Attempts
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Action, Admit, Failure, HelloReceived, SendStop, SendVerdict, ShowLine, TurnAway
from xrun.runner.job.nodes import Node, Nodes, NodeState
from xrun.runner.job.verdict import RootCause


class JobView(Protocol):
    """What these rules read of the machine (``xrun.runner.job.machine.Job``)."""

    config: JobConfig
    nodes: Nodes
    attempts: Attempts
    now: float
    cause: RootCause

    @property
    def stopping(self) -> bool: ...

    @property
    def failure(self) -> Failure | None: ...


def rejoins(config: JobConfig) -> bool:
    """Pod mode with --max_restarts: a node other than node 0 may come back to the job."""
    return config.verdict_to_nodes and config.restart.restarts


def unawaited(nodes: Nodes, config: JobConfig) -> int:
    """How many nodes' agents are gone that the next attempt cannot wait for (see the module doc)."""
    return len(unawaited_nodes(nodes, config))


def unawaited_nodes(nodes: Nodes, config: JobConfig) -> list[Node]:
    """The nodes whose agent is gone and that the next attempt cannot wait for (see the module doc)."""
    rejoin = rejoins(config)
    return [n for n in nodes if not n.connected and (not rejoin or n.rank == 0 or n.state is NodeState.WAITING)]


def pod_hello(job: JobView, node: Node, event: HelloReceived, refused: str | None) -> list[Action] | None:
    """The actions for a late or returning node's hello (``refused``: the hello policy's reason, if it refused
    it); None: not one of those, the usual rules apply."""
    if not job.config.verdict_to_nodes:
        return None
    if comes_back(job, node):
        if refused is not None:  # its place stays open for a node that runs this job, until --join_timeout
            return [ShowLine(f"{refused}: turned away"), TurnAway(event.conn)]
        if node.over or job.stopping:
            return _park(job, node, event)
        return None  # the next attempt's barrier is open: it joins as any node does
    if job.stopping and node.state is NodeState.WAITING:
        return _late(job, node, event)
    return None


def comes_back(job: JobView, node: Node) -> bool:
    """A node other than node 0 whose agent was lost in an earlier attempt, or in this one, says hello again."""
    return rejoins(job.config) and node.rank != 0 and not node.connected and (
        node.over or (node.state is NodeState.WAITING and job.attempts.number > 0))


def _park(job: JobView, node: Node, event: HelloReceived) -> list[Action]:
    """Admitted, DONE and connected until the next attempt's restart (or the verdict, once fixed)."""
    job.nodes.join(node, event.addr, job.now, name=event.host if job.config.numbered else None)
    node.state = NodeState.DONE  # parked: connected, pinged, never counted live
    fixed = job.cause.fixed
    if fixed is not None:
        return [Admit(node.rank, event.conn), SendVerdict((node.rank,), fixed)]
    back = ShowLine(f"node {node.rank} ({node.host}) is back: it joins the next attempt")
    return [Admit(node.rank, event.conn), back]


def _late(job: JobView, node: Node, event: HelloReceived) -> list[Action]:
    """A node that joins a job already ending is told how it ends (it must exit with that code)."""
    node.state, node.connected, node.last_seen = NodeState.JOINED, True, job.now
    if job.cause.fixed is not None:
        return [Admit(node.rank, event.conn), SendVerdict((node.rank,), job.cause.fixed)]
    reason = job.failure.reason if job.failure is not None else "the job is stopping"
    return [Admit(node.rank, event.conn),
            SendStop((node.rank,), int(signal.SIGTERM), job.config.shutdown_timeout, reason)]
