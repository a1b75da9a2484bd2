"""The hellos (``xrun.runner.job.machine``): what an agent that proved its key is answered, as the job's rules.

A hello is answered by the job's ``HelloPolicy``: head mode sends each node its spec (``SendSpecs``); a policy may
instead refuse a node (pod mode compares plan digests: ``xrun.runner.pod.hello``), which ends the job with exit
code 2, or find it a ``Stray`` (a wrong key), turned away without a word before it is admitted. A second agent for
a node already joined is turned away; pod mode's late and returning nodes are ``xrun.runner.job.rejoin``'s.
Pure, like the machine whose state it changes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Protocol

from xrun import __version__
from xrun.runner.job.attempts import Attempts
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Action, Admit, Failure, HelloReceived, SendSpec, SendStop, TurnAway
from xrun.runner.job.nodes import Nodes, NodeState
from xrun.runner.job.rejoin import pod_hello
from xrun.runner.job.spares import Spares
from xrun.runner.job.verdict import RootCause, refused_failure


@dataclass(frozen=True)
class Refusal:
    """A hello policy's no: the job ends with ``REFUSED_EXIT``; ``reason`` names the node and why."""

    reason: str


@dataclass(frozen=True)
class Stray:
    """A hello policy's "not one of ours" (a wrong key): closed without a word, counted, never admitted."""


class HelloPolicy(Protocol):
    def answer(self, hello: HelloReceived) -> Action | Refusal | Stray:
        """What an admitted node is sent first, why it is refused, or that it is a stray."""


@dataclass(frozen=True)
class SendSpecs:
    """Head mode: every node gets its spec; node 0 checks rank 0's port (``master_port``) or picks one."""

    pick_master_port: bool
    master_port: int = 0  # node 0's port to check, or its first try when picking

    def answer(self, hello: HelloReceived) -> Action | Refusal | Stray:
        node0 = hello.node == 0
        return SendSpec(hello.node, pick_master_port=self.pick_master_port and node0,
                        master_port=self.master_port if node0 else 0)


class Job(Protocol):
    """What of the job (``xrun.runner.job.machine.Job``) a hello reads and changes."""

    policy: HelloPolicy
    config: JobConfig
    attempts: Attempts
    nodes: Nodes
    spares: Spares
    cause: RootCause
    now: float
    strays: int
    _out: list[Action]

    @property
    def stopping(self) -> bool: ...

    @property
    def failure(self) -> Failure | None: ...

    def _say(self, text: str) -> None: ...

    def _fail(self, failure: Failure) -> None: ...


def on_hello(job: Job, event: HelloReceived) -> None:
    answer = job.policy.answer(event)
    if isinstance(answer, Stray):
        job.strays += 1
        job._out.append(TurnAway(event.conn))
        return
    node = job.nodes.by_agent.get(event.node)
    if node is None:  # a hot spare's agent (--spares), or a replaced node's: the spares answer
        job._out += job.spares.hello(event, job.now, ending=job.cause.fixed is not None)
        return
    pod = pod_hello(job, node, event, answer.reason if isinstance(answer, Refusal) else None)
    if pod is not None:  # pod mode: a node late for a job that is ending, or back (xrun.runner.job.rejoin)
        job._out += pod
        return
    # --max_restarts: a node joining an attempt that is stopping (before the verdict) joins the job: it is told to
    # stop right after its spec, says done, and waits for the next attempt with the others
    joins_next = job.stopping and job.config.restart.restarts and job.cause.fixed is None \
        and not job.config.verdict_to_nodes  # head mode: pod mode's are xrun.runner.job.rejoin's
    if node.state is not NodeState.WAITING or (job.stopping and not joins_next):
        if node.state is NodeState.WAITING:  # its first agent, late: not a second one
            job._say(f"turned away node {node.rank} ({node.host})'s agent from {event.peer}: it came after the job "
                     "began stopping")
        else:
            job._say(f"ignored a second agent for node {node.rank} ({node.host}) from {event.peer}")
        job._out.append(TurnAway(event.conn))
        return
    job.nodes.join(node, event.addr, job.now, name=event.host if job.config.numbered else None)
    job._out.append(Admit(node.agent, event.conn))
    if event.xrun_version != __version__:
        job._say(f"{node.host} runs xrun {event.xrun_version}, this is {__version__}")
    if isinstance(answer, Refusal):
        job._fail(refused_failure(node.host, answer.reason))
    else:
        job._out.append(answer)
    if joins_next:
        reason = job.failure.reason if job.failure is not None else "the attempt is stopping"
        job._out.append(SendStop((node.agent,), int(signal.SIGTERM), job.config.shutdown_timeout, reason))
