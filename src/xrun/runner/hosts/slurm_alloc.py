"""Slurm allocation discovery: inside ``salloc``/``sbatch``, the allocation is the hostfile.

Pure functions over an environment mapping (``os.environ`` at the edge, literal dicts in tests). The variables
(sbatch(1), salloc(1), srun(1) "OUTPUT ENVIRONMENT VARIABLES"):

* ``SLURM_JOB_ID`` marks an allocation; ``SLURM_JOB_NODELIST`` (older: ``SLURM_NODELIST``) names its hosts in
  hostlist syntax, e.g. ``node[01-03,07],gpu-a[1-2]``, in Slurm's order;
* slots per host, first that is set:
  ``SLURM_GPUS_PER_NODE`` (``--gpus-per-node``: ``2``, ``a100:2``, ``a100:2,v100:1``) - the same on every node;
  ``SLURM_JOB_GPUS`` / ``SLURM_GPUS_ON_NODE`` (the GPUs on the node running the batch script; GPU jobs are
  homogeneous, so they count for every node);
  ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: per node, in node order; ``--ntasks-per-node`` or the default of one
  task per node), for CPU-only jobs.

Inside a job step (``srun xrun ...``) every task would start a whole job of its own: that is refused.

Every count is ASCII digits and bounded by xrun's own limits (``MAX_NODES``, ``MAX_SLOTS_PER_NODE``) before
anything is expanded: ``SLURM_TASKS_PER_NODE='99999999999(x99999999999)'`` is one line naming the variable,
not a ``MemoryError`` (issue 25).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from xrun.hostlist import HostlistSyntaxError, expand_hostlist
from xrun.runner.hosts.platform_values import MAX_NODES, MAX_SLOTS_PER_NODE, PlatformError
from xrun.runner.hosts.selection import Pool
from xrun.strict_numbers import MAX_RANKS

_NUMBER = "[0-9]{1,18}"  # ASCII digits only: re's \d and str.isdigit also take '٣' and '²'
_COUNTS_ITEM = re.compile(rf"\s*({_NUMBER})\s*(?:\(x({_NUMBER})\))?\s*")
_SHOWN = 60  # characters of a bad value quoted in an error


class SlurmAllocationError(PlatformError):
    """A Slurm variable that cannot be read as documented, or an allocation xrun cannot use (the value quoted
    and clipped as every platform variable's is)."""


@dataclass(frozen=True)
class Allocation:
    """A Slurm allocation seen from inside it: hosts in Slurm's order, slots per host, and where they came from."""

    job_id: str
    hosts: tuple[str, ...]
    slots: tuple[int, ...]  # per host, same order
    source: str  # the variable the slot counts came from

    def pool(self) -> Pool:
        """``{host: (0, .., n-1)}``: slot ids are device indices within each node's allocation."""
        return {host: tuple(range(count)) for host, count in zip(self.hosts, self.slots)}

    def describe(self) -> str:
        total = sum(self.slots)
        return (f"xrun: using Slurm allocation {self.job_id}: {len(self.hosts)} node(s), {total} slot(s) "
                f"from {self.source}")


def in_allocation(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID", "").strip())


def expand_counts(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]`` (Slurm's compressed per-node count lists)."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNTS_ITEM.fullmatch(item)
        if match is None:
            raise SlurmAllocationError(variable, text, f"{item[:_SHOWN]!r} is not N or N(xK)")
        count, repeat = _slots(variable, text, int(match.group(1))), int(match.group(2) or 1)
        if len(counts) + repeat > MAX_NODES:  # before expanding: the list is as long as it says
            raise SlurmAllocationError(variable, text, f"lists more than {MAX_NODES} nodes, the most xrun accepts")
        counts.extend([count] * repeat)
    return counts


def _slots(variable: str, text: str, count: int) -> int:
    """``count`` slots on one node, refused beyond what xrun accepts per host."""
    if count > MAX_SLOTS_PER_NODE:
        raise SlurmAllocationError(
            variable, text, f"{count} slots on one node; {MAX_SLOTS_PER_NODE} is the most xrun accepts per host"
        )
    return count


def gpus_per_node(text: str, variable: str = "SLURM_GPUS_PER_NODE") -> int:
    """``2``, ``a100:2``, ``a100:2,v100:1`` -> 2, 2, 3 (the sum over GPU types)."""
    total = 0
    for item in text.split(","):
        count = item.strip().rpartition(":")[2]
        if not re.fullmatch(_NUMBER, count):
            raise SlurmAllocationError(variable, text, f"{item[:_SHOWN]!r} is not [TYPE:]COUNT")
        total = _slots(variable, text, total + int(count))
    return total


def _gpu_list_count(text: str) -> int:
    """``0,1`` or ``0-3`` (SLURM_JOB_GPUS is a list of indices) -> how many."""
    count = 0
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        if not re.fullmatch(_NUMBER, low) or (dash and not re.fullmatch(_NUMBER, high)):
            raise SlurmAllocationError("SLURM_JOB_GPUS", text, f"{item[:_SHOWN]!r} is not a GPU index or range")
        if dash and int(high) < int(low):
            raise SlurmAllocationError("SLURM_JOB_GPUS", text, f"{item!r} is a range that goes down")
        count = _slots("SLURM_JOB_GPUS", text, count + (int(high) - int(low) + 1 if dash else 1))
    return count


def allocation_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    for variable in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        text = env.get(variable, "").strip()
        if text:
            try:
                hosts = expand_hostlist(text, limit=MAX_NODES)
            except HostlistSyntaxError as err:
                raise SlurmAllocationError(variable, text, str(err)) from None
            if len(set(hosts)) != len(hosts):
                raise SlurmAllocationError(variable, text, "names a host twice")
            return tuple(hosts)
    raise SlurmAllocationError("SLURM_JOB_NODELIST", "", "not set although SLURM_JOB_ID is; pass --hostfile")


def allocation_slots(env: Mapping[str, str], nodes: int) -> tuple[tuple[int, ...], str]:
    """Slots per node and the variable they came from (see the module doc for the order)."""
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node:
        return (gpus_per_node(per_node),) * nodes, "SLURM_GPUS_PER_NODE"
    job_gpus = env.get("SLURM_JOB_GPUS", "").strip()
    if job_gpus:
        return (_gpu_list_count(job_gpus),) * nodes, "SLURM_JOB_GPUS"
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if re.fullmatch(_NUMBER, on_node) and int(on_node) > 0:
        return (_slots("SLURM_GPUS_ON_NODE", on_node, int(on_node)),) * nodes, "SLURM_GPUS_ON_NODE"
    tasks = env.get("SLURM_TASKS_PER_NODE", "").strip()
    if tasks:
        counts = expand_counts(tasks)
        if len(counts) != nodes:
            raise SlurmAllocationError(
                "SLURM_TASKS_PER_NODE", tasks, f"lists {len(counts)} node(s) but the allocation has {nodes}"
            )
        return tuple(counts), "SLURM_TASKS_PER_NODE"
    return (1,) * nodes, "one slot per node (no GPU or task counts set)"


def check_not_in_step(env: Mapping[str, str]) -> None:
    """``srun xrun ...`` with several tasks would start one whole job per task."""
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or ""
    if env.get("SLURM_STEP_ID", "").strip() and re.fullmatch(_NUMBER, ntasks) and int(ntasks) > 1:
        raise SlurmAllocationError(
            "SLURM_STEP_NUM_TASKS", ntasks,
            "xrun is running as one of several srun tasks; run it once (in the batch script or the salloc "
            "shell): it starts one agent per node itself",
        )


def discover_allocation(env: Mapping[str, str]) -> Allocation:
    """The allocation this process runs in; call only when ``in_allocation(env)``."""
    check_not_in_step(env)
    hosts = allocation_hosts(env)
    slots, source = allocation_slots(env, len(hosts))
    zero = [host for host, count in zip(hosts, slots) if count <= 0]
    if zero:
        raise SlurmAllocationError(source, env.get(source, ""), f"host {zero[0]!r} has no slots")
    if sum(slots) > MAX_RANKS:  # before the pool lists every slot
        raise SlurmAllocationError(source, env.get(source, ""), f"{len(hosts)} nodes with {sum(slots)} slots; "
                                   f"{MAX_RANKS} is the most ranks xrun accepts")
    return Allocation(job_id=env["SLURM_JOB_ID"].strip(), hosts=hosts, slots=slots, source=source)
