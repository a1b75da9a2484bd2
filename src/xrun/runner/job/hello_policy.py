"""What an agent's proven hello is answered: the job state machine (``xrun.runner.job.machine``) is given one
``HelloPolicy`` and asks it about every hello of a node of the world.

Two policies exist. Head mode's ``SendSpecs`` sends each node its spec (node 0's checks or picks rank 0's port).
Pod mode's (``xrun.runner.pod.hello.PodHello``) sends no spec, since every node runs its own command line: it
compares plan digests, and answers with a ``Refusal`` (the job ends with exit code 2, naming the node) or a
``Stray`` (a wrong key: turned away without a word, never admitted). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from xrun.runner.job.events import Action, HelloReceived, SendSpec


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
