"""``NodeIO``: the reads that finding the nodes may need (a platform's files, ``-H``'s hostfile, this machine's
slots), passed in as functions so that placement (``xrun.runner.pod.placement.place``) stays pure. The planner
(``xrun.runner.planner``) builds the real ones once per run and uses the same ones where no pod flag or platform
applies, so each source is read one way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # a plain run (no platform variable) loads no batch or platform code
    from xrun.runner.hosts.batch_alloc import ReadFile
    from xrun.runner.hosts.selection import Pool

NODE_FILE_LIMIT = 16 << 20  # a line per slot: 16 MiB is some 500 000 slots of 32-character names


@dataclass(frozen=True)
class NodeIO:
    """The reads ``place`` may need, passed in so that it stays pure."""

    read_file: ReadFile  # platform files: node lists, /etc/volcano/*.host
    local_pool: Callable[[], Pool]  # this machine: {"localhost": its slots}
    hostfile_pool: Callable[[str], Pool]  # -H PATH
