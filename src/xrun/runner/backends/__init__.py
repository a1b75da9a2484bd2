"""The backend registry: name -> backend class, found lazily so that the heavy ones cost nothing unless chosen.

Each backend class declares its ``traits`` (what the planner and the CLI must know about it) in its own
module; ``backend_traits(name)`` reads them from the class without instantiating it. Backend modules keep
their module-level imports light (paramiko, psutil, the control server and ``secrets`` load inside
``execute``), so reading a backend's traits costs one small import. This module knows nothing of plans, so
the planner can ask it; the ``Backend`` protocol and ``get_backend`` are in ``backends.base``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xrun.errors import UsageError


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


@dataclass(frozen=True)
class Traits:
    """What the planner and the CLI need to know about a backend before choosing or planning with it."""

    # The agents connect back over the control channel (``backends.channel``): node 0's address and, for
    # --master_port 0, a free port are agreed at the start barrier, so the plan leaves the master address open.
    uses_channel: bool = False
    # An engine (mpirun, hydra, srun) starts the agents: --launcher_args are its extra arguments.
    engine: bool = False
    # This machine is the whole world: the agent runs in xrun's own process, ranks rendezvous on loopback,
    # nothing is exported and --master_port 0 is picked here.
    local: bool = False
    # Every node runs its own xrun (--no_ssh) and plans alone: what they must agree on cannot be drawn at random.
    nodes_start_themselves: bool = False
    # Open files the head holds per node beyond the channel's socket (ssh: the TCP connection to sshd and the
    # wake-up pipe pair paramiko makes when the channel joins the selector): the open-files check (xrun.fdlimit).
    extra_fds_per_node: int = 0
    # The head starts one agent per host itself, so it can start one on each hot spare too (--spares, issue 23).
    spares: bool = False


# name -> "module:attribute" of the backend class (a zero-argument factory).
_REGISTRY: dict[str, str] = {
    "local": "xrun.runner.backends.local:LocalBackend",
    "impi": "xrun.runner.backends.impi:IntelMpiBackend",
    "mpich": "xrun.runner.backends.mpich:MpichBackend",
    "mvapich": "xrun.runner.backends.mvapich:MvapichBackend",
    "openmpi": "xrun.runner.backends.openmpi:OpenMpiBackend",
    "no_ssh": "xrun.runner.backends.pod_mode:NoSshBackend",
    "pdsh": "xrun.runner.backends.pdsh:PdshBackend",
    "slurm": "xrun.runner.backends.slurm:SlurmBackend",
    "ssh": "xrun.runner.backends.ssh:SshBackend",
}


def known_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> Any:
    """The class registered as ``name`` (its module imported); unknown names list the known ones."""
    target = _REGISTRY.get(name)
    if target is None:
        raise UsageError("--launcher", f"unknown backend {name!r}; known: {', '.join(known_backends())}")
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def backend_traits(name: str) -> Traits:
    """The traits ``name``'s class declares (no instance is made)."""
    traits: Traits = backend_class(name).traits
    return traits


def engine_backends() -> list[str]:
    """The backends that take --launcher_args (imports every backend module: for error messages only)."""
    return [name for name in known_backends() if backend_traits(name).engine]
