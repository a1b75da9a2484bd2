"""What a backend is (the ``Backend`` protocol every class in the registry follows) and ``get_backend``, which
makes one by name. Kept apart from the registry in ``backends/__init__``: the planner reads traits there, and
this module's types refer to the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from xrun.runner.backends import Invocation, Traits, backend_class

if TYPE_CHECKING:
    from xrun.runner.plan import Plan


class Backend(Protocol):
    name: ClassVar[str]
    traits: ClassVar[Traits]

    def render(self, plan: Plan) -> Invocation:
        """Pure: the commands that will run (--dry-run prints them; placeholders stand for the endpoint)."""

    def execute(self, plan: Plan) -> int:
        """Start the agents for ``plan`` and run the job; return xrun's exit code."""


def get_backend(name: str) -> Backend:
    backend: Backend = backend_class(name)()
    return backend
