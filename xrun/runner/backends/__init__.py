"""Backends start one node agent per node. Found by name through a registry; loaded lazily so that the
heavy ones (paramiko) cost nothing unless chosen."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from xrun.errors import UsageError

if TYPE_CHECKING:
    from xrun.runner.plan import Plan


@dataclass(frozen=True)
class NodeCommand:
    """The command that starts one node's agent, as an argv list (shell rendering happens in one place)."""

    host: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Invocation:
    """What a backend will execute for a plan; --dry-run prints exactly this."""

    backend: str
    commands: tuple[NodeCommand, ...]
    note: str = ""
    # rank -> CPU list ("0-3,8-11") where the binding is known at plan time (this machine's own ranks).
    cpus: Mapping[int, str] = field(default_factory=dict)


class Backend(Protocol):
    name: str

    def render(self, plan: Plan) -> Invocation:
        """Pure: the commands that will run."""

    def execute(self, plan: Plan, invocation: Invocation) -> int:
        """Run the invocation; return xrun's exit code."""


# Backends whose engine (mpirun, hydra, srun) starts the agents; kept here so that checking a name is cheap.
ENGINE_BACKENDS = frozenset({"openmpi", "mpich", "impi", "mvapich", "slurm"})

# name -> "module:attribute" of a zero-argument factory.
_REGISTRY: dict[str, str] = {
    "local": "xrun.runner.backends.local:LocalBackend",
    "impi": "xrun.runner.backends.impi:IntelMpiBackend",
    "mpich": "xrun.runner.backends.mpich:MpichBackend",
    "mvapich": "xrun.runner.backends.mvapich:MvapichBackend",
    "openmpi": "xrun.runner.backends.openmpi:OpenMpiBackend",
    "no_ssh": "xrun.runner.backends.no_ssh:NoSshBackend",
    "pdsh": "xrun.runner.backends.pdsh:PdshBackend",
    "slurm": "xrun.runner.backends.slurm:SlurmBackend",
    "ssh": "xrun.runner.backends.ssh:SshBackend",
}


def known_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    target = _REGISTRY.get(name)
    if target is None:
        raise UsageError("--launcher", f"unknown backend {name!r}; known: {', '.join(known_backends())}")
    module_name, attribute = target.split(":")
    factory = getattr(importlib.import_module(module_name), attribute)
    return factory()  # type: ignore[no-any-return]
