"""What the machine's rule modules read and change of it (``xrun.runner.job.machine.Job``), as one Protocol: the
restart (``restart.py``) and the nodes found bad before a start (``faulty.py``) see the same job."""

from __future__ import annotations

from typing import Protocol

from xrun.runner.job.attempts import Attempts
from xrun.runner.job.barrier import Barrier
from xrun.runner.job.config import JobConfig
from xrun.runner.job.events import Action, Failure
from xrun.runner.job.nodes import Nodes
from xrun.runner.job.spares import Spares
from xrun.runner.job.stop import Stop
from xrun.runner.job.verdict import RootCause


class JobView(Protocol):
    """The machine's state these rules read, and the outputs they queue."""

    config: JobConfig
    nodes: Nodes
    spares: Spares
    attempts: Attempts
    cause: RootCause
    stop: Stop
    barrier: Barrier
    now: float
    _out: list[Action]

    def _say(self, text: str) -> None: ...

    def _fail(self, failure: Failure) -> None: ...
