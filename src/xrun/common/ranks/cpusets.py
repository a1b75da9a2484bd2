"""Each rank's CPU set under ``--bind_cores_to_rank``, planned from the node spec and this machine's /sys alike by
the rank group (``xrun.launch.ranks.processes``), the node's preflight and the head's dry run of a local job
(``xrun.runner.backends.local``), so that what the dry run shows is what the ranks get. Reads /sys; starts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from xrun.common.ranks.devices import NVIDIA_VISIBLE, device_names, gpu_numa_nodes, rank_slot
from xrun.common.spec import NodeSpec

if TYPE_CHECKING:
    from xrun.common.ranks.binding import RankBinding


def plan_bindings(spec: NodeSpec, env: Mapping[str, str]) -> tuple[RankBinding, ...] | None:
    """This node's per-rank CPU sets for --bind_cores_to_rank (None without it); reads /sys, starts nothing."""
    if not spec.options.bind_cores:
        return None
    # Lazy: about 5 ms of the agent's imports (python -X importtime), the most of any it would add; --bind_cores only.
    from xrun.common.ranks import binding

    binding.check_binding_env(env)
    allowed = frozenset(os.sched_getaffinity(0))
    if spec.options.numa_binding is not None:  # torchrun's --numa-binding (issue 41)
        mode = spec.options.numa_binding
        caches = binding.read_cache_groups() if mode == "core-complex" else None
        return binding.plan_numa_binding(binding.read_topology(), mode, allowed, spec.options.bind_core_list,
                                         gpu_nodes(spec, env), caches)
    return binding.plan_binding(
        binding.read_topology(), len(spec.ranks), allowed, spec.options.bind_core_list, gpu_nodes(spec, env)
    )


def gpu_nodes(spec: NodeSpec, env: Mapping[str, str], root: str = "/") -> tuple[int | None, ...] | None:
    """Local rank -> the NUMA node of its GPU (None: no NVIDIA GPU here, none with a known node, or GPUs named by
    UUID, whose PCI order xrun does not know)."""
    near = gpu_numa_nodes(root)
    if not near or device_names(env.get(NVIDIA_VISIBLE) or "0") is not None:
        return None
    slots = (rank_slot(r.env.get(NVIDIA_VISIBLE), r.local_rank) for r in spec.ranks)
    return tuple(near.get(slot) if slot is not None else None for slot in slots)
