"""What a backend is (the ``Backend`` protocol every class in the registry follows), ``get_backend``, which
makes one by name, and ``InProcess``, the runs a backend hands its plan to when the head and a node share xrun's
process. Kept apart from the registry in ``backends/__init__``: the planner reads traits there, and this module's
types refer to the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from xrun.runner.backends import Invocation, Traits, backend_class

if TYPE_CHECKING:
    from xrun.runner.plan import Plan


@dataclass(frozen=True)
class InProcess:
    """The runs that join the head and a node in xrun's one process: the local run's one-node job and this node's
    share of a pod-mode job, each from the plan to xrun's exit code. They need both layers, so they live above both
    (xrun.joined) and the entry point hands them in: the head layer never imports the node layer."""

    one_node_job: Callable[[Plan], int]
    pod_share: Callable[[Plan], int]


class Backend(Protocol):
    name: ClassVar[str]
    traits: ClassVar[Traits]

    def render(self, plan: Plan) -> Invocation:
        """Pure: the commands that will run (--dry-run prints them; placeholders stand for the endpoint)."""

    def execute(self, plan: Plan, in_process: InProcess) -> int:
        """Start the agents for ``plan`` (or hand it to ``in_process``) and run the job; return xrun's exit code."""


def get_backend(name: str) -> Backend:
    backend: Backend = backend_class(name)()
    return backend
