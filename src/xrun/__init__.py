"""xrun: a lean multi-node launcher for PyTorch training.

The package has three layers: ``xrun.runner`` (head node: decides what runs where), ``xrun.launch`` (every
node: turns one node spec into supervised rank processes) and, below both, ``xrun.common`` (what both need).
Neither of the two imports the other, but for the modules that run the head and a node in one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xrun.discovery import Discovered

__version__ = "0.1.0"

__all__ = ["__version__", "discover"]


def discover(**kwargs: Any) -> Discovered:
    """RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for a script started by mpirun/srun directly
    (see ``xrun.discovery``); imported lazily so that ``import xrun`` stays free."""
    from xrun.discovery import discover as _discover

    return _discover(**kwargs)
