"""What a node starts, rank by rank: each local rank's environment, core binding and argv.

spec -> ``rank_environment`` (the user's environment, the runner's exports, the rank contract) -> ``bind_ranks``
(``--bind_cores_to_rank``: a numactl prefix, or an affinity mask; without it ``omp_threads`` gives a node of several
ranks ``OMP_NUM_THREADS`` = its CPUs // its ranks, issue 13) -> ``rank_processes`` (``RankProcess``: what
the static supervisor, xrun.launch.ranks.supervise, starts). The elastic adapter (xrun.launch.elastic.run) writes its
rank scripts from the same environment and binding. Each rank may get its own ``TORCHELASTIC_ERROR_FILE``
(xrun.common.result.errorfile). Reads /sys for the binding; starts nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from xrun.common.network.socket_ifname import rank_network_env
from xrun.common.ranks.cpusets import plan_bindings
from xrun.common.ranks.devices import (
    NVIDIA_VISIBLE,
    Devices,
    detect_devices,
    hides_devices,
    visible_devices,
)
from xrun.common.result import errorfile
from xrun.common.result.errorfile import ErrorFiles
from xrun.common.spec import NodeSpec, RankSpec
from xrun.launch.telemetry.endpoints import Endpoints


@dataclass(frozen=True)
class RankProcess:
    """One rank to start: its complete argv and environment (the caller merged them)."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cpus: frozenset[int] | None = None  # the exact CPU affinity the child starts with
    memory_node: int | None = None  # a forked rank's memory bound here (numactl's --membind, without numactl)
    cwd: str | None = None
    error_file: str | None = None  # its TORCHELASTIC_ERROR_FILE, read if it fails


@dataclass(frozen=True)
class BoundRank:
    """A rank after binding: the argv may gain a numactl prefix, or the cpus travel as an affinity mask (with the
    memory node, for a rank forked from the preload helper, which binds both itself)."""

    argv: tuple[str, ...]
    cpus: frozenset[int] | None
    extra_env: Mapping[str, str]
    memory_node: int | None = None


def rank_environment(
    base: Mapping[str, str], spec: NodeSpec, rank: RankSpec, node_devices: Devices | None = None
) -> dict[str, str]:
    """The user's environment, then the runner's exports, then the rank contract (which always wins), with the
    slot list said the node's way (xrun.common.ranks.devices): GPUs the user hid stay hidden, UUID/MIG names replace
    positions, and a node of another vendor gets its own visibility variable instead of CUDA_VISIBLE_DEVICES."""
    env = dict(base)
    env.update(spec.env)
    variable = node_devices.variable if node_devices is not None else NVIDIA_VISIBLE
    inherited = _inherited_visibility(env, variable)
    env.update(rank.env)
    planned = rank.env.get(NVIDIA_VISIBLE)
    if planned is None:
        return env
    visible = visible_devices(inherited, planned)
    if variable != NVIDIA_VISIBLE and not hides_devices(visible):
        del env[NVIDIA_VISIBLE]  # HIP and others honour it too: set twice, the list would filter itself
    env[variable if not hides_devices(visible) else NVIDIA_VISIBLE] = visible
    return env


def with_network(spec: NodeSpec, envs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Every rank's env with this node's ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` (--network_interface,
    issue 24); decided once per node, from the first rank's env (the same master, the same user settings)."""
    if not envs:
        return envs
    first = envs[0]
    nodes = int(first.get("GROUP_WORLD_SIZE") or 1)
    if spec.elastic is not None:
        nodes = max(nodes, spec.elastic.max_nodes or 0)
    extra = rank_network_env(spec.host, spec.options.network_interface, first, nodes)
    return [{**env, **extra} for env in envs]


def _inherited_visibility(env: Mapping[str, str], variable: str) -> str | None:
    """The node's own visibility list for ``variable``; a CUDA_VISIBLE_DEVICES that hides the GPUs counts too."""
    cuda = env.get(NVIDIA_VISIBLE)
    if cuda is not None and hides_devices(cuda):
        return cuda
    return env.get(variable)


def shared_environment(spec: NodeSpec, base: Mapping[str, str]) -> dict[str, str]:
    """What every local rank's environment has in common (``rank_environment``'s, without the binding): the
    environment of the preload helper (xrun.launch.preload), which imports for all of them."""
    node_devices = detect_devices()
    envs = with_network(spec, [rank_environment(base, spec, rank, node_devices) for rank in spec.ranks])
    if not envs:
        return dict(base)
    return {k: v for k, v in envs[0].items() if all(env.get(k) == v for env in envs[1:])}


def omp_threads(env: Mapping[str, str], local_ranks: int, cpus: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for unbound ranks: unset, every rank would start a thread per core (minGPT ran 4x
    slower than under torchrun, issue 13); share the CPUs instead. The user's value, or a single rank, is left alone.
    """
    if "OMP_NUM_THREADS" in env or local_ranks <= 1:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cpus // local_ranks))}


def bind_ranks(spec: NodeSpec, env: Mapping[str, str]) -> tuple[BoundRank, ...]:
    """Apply --bind_cores_to_rank: numactl when installed, else an inherited affinity mask (memory not bound). A rank
    forked from the preload helper (--preload) is a python without a command of its own to prefix: it sets its
    affinity and its memory policy itself, as numactl would (xrun.launch.preload.kernel)."""
    bindings = plan_bindings(spec, env)
    if bindings is None:
        threads = omp_threads(env, len(spec.ranks), len(os.sched_getaffinity(0)))
        if threads:
            print(
                f"xrun: {spec.host}: OMP_NUM_THREADS={threads['OMP_NUM_THREADS']} for each of {len(spec.ranks)} "
                "ranks (the CPUs this agent may use / local ranks; set OMP_NUM_THREADS to choose)",
                file=sys.stderr,
            )
        return tuple(BoundRank(argv=r.argv, cpus=None, extra_env=threads) for r in spec.ranks)
    from xrun.common.ranks import binding  # lazy: see xrun.common.ranks.cpusets.plan_bindings

    pool = binding.binding_pool(frozenset(os.sched_getaffinity(0)), spec.options.bind_core_list)
    note = binding.binding_note(bindings, pool)
    if note:
        print(f"xrun: {spec.host}: {note}", file=sys.stderr)
    if spec.options.preload:
        return tuple(BoundRank(argv=r.argv, cpus=frozenset(b.cpus), extra_env=binding.binding_env(b, env),
                               memory_node=b.numa_node) for r, b in zip(spec.ranks, bindings))
    numactl = binding.find_numactl()
    if numactl is None:
        print(
            f"xrun: {spec.host}: numactl not found; binding CPUs by affinity only, memory is not bound "
            "(apt-get install numactl)",
            file=sys.stderr,
        )
    return tuple(
        BoundRank(
            argv=binding.numactl_argv(b, r.argv, numactl) if numactl else r.argv,
            cpus=None if numactl else frozenset(b.cpus),
            extra_env=binding.binding_env(b, env),
        )
        for r, b in zip(spec.ranks, bindings)
    )


def rank_processes(
    spec: NodeSpec, base_env: Mapping[str, str], error_files: ErrorFiles | None = None,
    endpoints: Endpoints | None = None,
) -> tuple[RankProcess, ...]:
    """Every local rank as a ``RankProcess``: its environment merged, its binding applied and, given
    ``error_files``, its own ``TORCHELASTIC_ERROR_FILE`` (a shared one would keep only the last writer's); given
    ``endpoints``, what serves its collective records (xrun.launch.telemetry.endpoints)."""
    node_devices = detect_devices()
    envs = with_network(spec, [rank_environment(base_env, spec, rank, node_devices) for rank in spec.ranks])
    bound = bind_ranks(spec, envs[0] if envs else base_env)
    procs = []
    for rank, env, b in zip(spec.ranks, envs, bound):
        error_file = error_files.path(rank.rank) if error_files is not None else None
        extra = {errorfile.VARIABLE: error_file} if error_file else {}
        if endpoints is not None:
            extra.update(endpoints.rank_env(rank.rank, env))
        procs.append(
            RankProcess(
                rank=rank.rank,
                local_rank=rank.local_rank,
                argv=b.argv,
                env={**env, **b.extra_env, **extra},
                cpus=b.cpus,
                memory_node=b.memory_node,
                cwd=spec.cwd,
                error_file=error_file,
            )
        )
    return tuple(procs)
