"""Which platform started this xrun, and what it says about the nodes. Pure over an environment mapping and a
file reader (``os.environ`` and ``read_small_file`` at the edge, literal dicts and tmp files in tests).

Pod platforms start xrun on every node themselves; each node then runs its own share (pod mode). First match
wins, in this order:

============  =======================================================  ==========================================
platform      variables read                                           meaning
============  =======================================================  ==========================================
kubeflow      ``PET_NNODES`` (``N`` or elastic ``MIN:MAX``: the max),  Kubeflow training operator PyTorchJob,
              ``PET_NODE_RANK``, ``PET_MASTER_ADDR``/``_PORT``         Kubeflow Trainer v2, PAI-DLC with PET_*
volcano       ``VC_TASK_INDEX``, ``VC_<TASK>_HOSTS`` or                Volcano job (env/svc plugins; with the
              ``/etc/volcano/<task>.host``; with the pytorch plugin    pytorch plugin the host lists of tasks
              also ``WORLD_SIZE``, ``RANK``, ``MASTER_*`` as pods      master + worker are the world)
pytorchjob    ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``_PORT``     PAI-DLC, older PyTorchJob: read as pods
lws           ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``,                LeaderWorkerSet group
              ``LWS_LEADER_ADDRESS``
skypilot      ``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS``            SkyPilot cluster
indexed-job   ``JOB_COMPLETION_INDEX``                                 Kubernetes Indexed Job / JobSet: the index
                                                                       only; hosts come from -H or --hosts
============  =======================================================  ==========================================

``PET_NPROC_PER_NODE`` / ``NPROC_PER_NODE`` (``SKYPILOT_NUM_GPUS_PER_NODE``) give the slots per node when
numeric; ``auto`` (and torchrun's ``gpu``/``cpu``/``xpu``) means: count this node's devices.

The generic-variable trap: ``WORLD_SIZE``/``RANK`` count pods on Volcano, PAI-DLC and older PyTorchJobs but
processes on newer PyTorchJobs, Azure ML and under torchrun. xrun reads them as pods only when no platform-
specific variable exists, says so in its announcement, and lets ``--num_nodes``/``--node_rank`` override.
Two cases where they are not read at all:

* inside a launched rank (``LOCAL_RANK`` or ``TORCHELASTIC_RUN_ID`` is set: torchrun or xrun itself set
  them), where they describe processes;
* inside a batch job (``SLURM_JOB_ID``, ``PBS_JOBID``, ``LSB_JOBID``): there the allocation is the host pool
  (``batch_alloc``; Slurm: ``slurm_alloc``) and such variables are the user's own exports for torchrun.

Everything found here describes NODES. Ranks always get xrun's own contract (``RANK`` = global rank,
``WORLD_SIZE`` = all ranks): the rank env of the plan is applied over the inherited environment.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from xrun.runner.hosts.batch_alloc import BatchAllocation, ReadFile, in_batch_job, lsf_allocation, pbs_allocation
from xrun.runner.hosts.platform_values import (
    MAX_NODES,
    MAX_SLOTS_PER_NODE,
    PlatformError,
    parse_address,
    parse_count,
    parse_host_list,
    parse_port,
)
from xrun.runner.hosts.selection import Pool
from xrun.runner.hosts.smallfile import SmallFileError

# Without one of these (or a VC_<TASK>_HOSTS) no platform is detected (tests/test_platforms.py checks it).
PLATFORM_MARKERS = ("PET_NNODES", "WORLD_SIZE", "VC_TASK_INDEX", "LWS_GROUP_SIZE", "SKYPILOT_NODE_IPS",
                    "JOB_COMPLETION_INDEX", "PBS_JOBID", "LSB_JOBID")


def platform_markers_present(env: Mapping[str, str]) -> bool:
    """Could ``detect`` find anything in ``env``? (cheap: names only)"""
    return any(name in env for name in PLATFORM_MARKERS) or any(
        name.startswith("VC_") and name.endswith("_HOSTS") for name in env
    )

VOLCANO_HOSTS_DIR = "/etc/volcano"
_LOCAL_COUNT_WORDS = ("auto", "gpu", "cpu", "xpu")  # torchrun's --nproc_per_node words: count on the node


class Platform(enum.Enum):
    KUBEFLOW = "kubeflow"
    VOLCANO = "volcano"
    PYTORCHJOB = "pytorchjob"
    LWS = "lws"
    SKYPILOT = "skypilot"
    INDEXED_JOB = "indexed-job"
    PBS = "pbs"
    LSF = "lsf"

    @property
    def title(self) -> str:
        return _TITLES[self]

    @property
    def pod(self) -> bool:
        """Pod platforms start xrun on every node; batch systems run it once, on the first node."""
        return self not in (Platform.PBS, Platform.LSF)


_TITLES = {
    Platform.KUBEFLOW: "Kubeflow",
    Platform.VOLCANO: "Volcano job",
    Platform.PYTORCHJOB: "PyTorchJob-style variables",
    Platform.LWS: "LeaderWorkerSet",
    Platform.SKYPILOT: "SkyPilot",
    Platform.INDEXED_JOB: "Kubernetes Indexed Job",
    Platform.PBS: "PBS",
    Platform.LSF: "LSF",
}


@dataclass(frozen=True)
class Detection:
    """What a platform says about this node and the job's nodes; None fields: the platform does not say."""

    platform: Platform
    source: str  # the variables (or files) it was recognised by
    announcement: str  # the one line xrun prints on stderr
    node_rank: int | None = None
    num_nodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    slots_per_node: int | None = None
    hosts: tuple[str, ...] = ()  # node names in node order, where the platform lists them
    slots: tuple[int, ...] = ()  # per host: batch allocations only

    @property
    def pool(self) -> Pool | None:
        """A batch allocation's host pool; None for pod platforms (their slots are counted per node)."""
        if not self.slots:
            return None
        return {host: tuple(range(count)) for host, count in zip(self.hosts, self.slots)}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.platform.value,
            "source": self.source,
            "node_rank": self.node_rank,
            "num_nodes": self.num_nodes,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "slots_per_node": self.slots_per_node,
            "hosts": list(self.hosts),
            "slots": list(self.slots),
            "announcement": self.announcement,
        }


@dataclass(frozen=True)
class _Reading:
    """The node facts a pod platform gave, before they become a Detection."""

    node_rank: int | None
    num_nodes: int | None
    master_addr: str | None
    master_port: int | None
    slots_per_node: int | None = None
    notes: tuple[str, ...] = field(default=())


def detect(env: Mapping[str, str], read: ReadFile, *, pods: bool = True, batch: bool = True) -> Detection | None:
    """The platform this xrun runs on, or None. ``pods``/``batch`` False: do not look for that kind."""
    if in_batch_job(env):
        return _batch(env, read) if batch else None
    if not pods:
        return None
    for detector in _POD_DETECTORS:
        found = detector(env, read)
        if found is not None:
            return found
    return None


def _batch(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    allocation = pbs_allocation(env, read) or lsf_allocation(env, read)  # Slurm: xrun.runner.hosts.slurm_alloc
    return None if allocation is None else _from_allocation(allocation)


def _from_allocation(allocation: BatchAllocation) -> Detection:
    platform = Platform.PBS if allocation.system == "PBS" else Platform.LSF
    return Detection(platform=platform, source=allocation.source, announcement=allocation.describe(),
                     num_nodes=len(allocation.hosts), hosts=allocation.hosts, slots=allocation.slots)


# ---------------------------------------------------------------------------------------------------------------
# Reading single values.


def _value(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, None when unset or blank (a blank value says nothing)."""
    text = env.get(name)
    return text if text is not None and text.strip() else None


def _first_set(env: Mapping[str, str], *names: str) -> str | None:
    return next((name for name in names if _value(env, name) is not None), None)


def _inside_a_rank(env: Mapping[str, str]) -> bool:
    """torchrun and xrun give their ranks these; a pod platform gives them to no pod."""
    return _value(env, "LOCAL_RANK") is not None or _value(env, "TORCHELASTIC_RUN_ID") is not None


def _rank(env: Mapping[str, str], name: str | None, num_nodes: int | None, count_name: str) -> int | None:
    if name is None:
        return None
    text = env[name]
    rank = parse_count(name, text, low=0, high=MAX_NODES - 1, what="a node rank")
    if num_nodes is not None and rank >= num_nodes:
        raise PlatformError(name, text, f"is not below {count_name}={num_nodes}; pass --node_rank and --num_nodes, "
                                        "or --platform none")
    return rank


def _master(env: Mapping[str, str], addr_names: tuple[str, ...], port_names: tuple[str, ...]
            ) -> tuple[str | None, int | None]:
    addr_name, port_name = _first_set(env, *addr_names), _first_set(env, *port_names)
    addr = parse_address(addr_name, env[addr_name]) if addr_name else None
    port = parse_port(port_name, env[port_name]) if port_name else None
    return addr, port


def _slots(env: Mapping[str, str], *names: str) -> tuple[int | None, tuple[str, ...]]:
    """Slots per node from the first of ``names`` that is set; None: count this node's devices."""
    name = _first_set(env, *names)
    if name is None:
        return None, ()
    text = env[name].strip()
    if text.lower() in _LOCAL_COUNT_WORDS:
        return None, (f"{name}={text}: slots counted on this node",)
    count = parse_count(name, text, low=1, high=MAX_SLOTS_PER_NODE, what="the processes per node (or auto)")
    return count, (f"{count} slot(s) per node from {name}",)


def _nnodes(text: str) -> tuple[int, tuple[str, ...]]:
    """``PET_NNODES``: ``4``, or ``2:4`` for an elastic PyTorchJob (xrun plans the maximum)."""
    low_text, colon, high_text = text.strip().partition(":")
    high = parse_count("PET_NNODES", high_text if colon else low_text, low=1, high=MAX_NODES, what="the node count")
    if not colon:
        return high, ()
    low = parse_count("PET_NNODES", low_text, low=1, high=MAX_NODES, what="the minimum node count")
    if low > high:
        raise PlatformError("PET_NNODES", text, "MIN:MAX has MIN above MAX")
    return high, (f"PET_NNODES={text.strip()} (elastic) read as its maximum, {high} nodes",)


# ---------------------------------------------------------------------------------------------------------------
# Pod platforms, in precedence order.


def _pod(platform: Platform, source: str, reading: _Reading, hosts: tuple[str, ...] = ()) -> Detection:
    where = f"node {reading.node_rank}" if reading.node_rank is not None else "node rank not given"
    if reading.num_nodes is not None:
        where += f" of {reading.num_nodes}"
    parts = [where]
    if reading.master_addr is not None:
        port = f":{reading.master_port}" if reading.master_port is not None else ""
        parts.append(f"master {reading.master_addr}{port}")
    line = f"xrun: {platform.title} ({source}): {', '.join(parts)}"
    return Detection(
        platform=platform, source=source, announcement="; ".join((line, *reading.notes)),
        node_rank=reading.node_rank, num_nodes=reading.num_nodes, master_addr=reading.master_addr,
        master_port=reading.master_port, slots_per_node=reading.slots_per_node, hosts=hosts,
    )


def _kubeflow(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    if _value(env, "PET_NNODES") is None:
        return None
    num_nodes, notes = _nnodes(env["PET_NNODES"])
    rank_name = _first_set(env, "PET_NODE_RANK", "RANK")
    addr, port = _master(env, ("PET_MASTER_ADDR", "MASTER_ADDR"), ("PET_MASTER_PORT", "MASTER_PORT"))
    slots, slot_notes = _slots(env, "PET_NPROC_PER_NODE", "NPROC_PER_NODE")
    reading = _Reading(_rank(env, rank_name, num_nodes, "PET_NNODES"), num_nodes, addr, port, slots,
                       notes + slot_notes)
    return _pod(Platform.KUBEFLOW, ", ".join(n for n in ("PET_NNODES", rank_name) if n), reading)


def _generic(env: Mapping[str, str]) -> _Reading | None:
    """``WORLD_SIZE``/``RANK`` read as pods (see the module doc for when they are not read at all)."""
    if _value(env, "WORLD_SIZE") is None or _value(env, "RANK") is None or _inside_a_rank(env):
        return None
    num_nodes = parse_count("WORLD_SIZE", env["WORLD_SIZE"], low=1, high=MAX_NODES, what="the number of pods")
    node_rank = _rank(env, "RANK", num_nodes, "WORLD_SIZE")
    addr, port = _master(env, ("MASTER_ADDR",), ("MASTER_PORT",))
    slots, slot_notes = _slots(env, "PET_NPROC_PER_NODE", "NPROC_PER_NODE")
    trap = (f"WORLD_SIZE={num_nodes} read as {num_nodes} nodes (pods); pass --num_nodes to override, or unset "
            "WORLD_SIZE and RANK to run on this machine alone")
    return _Reading(node_rank, num_nodes, addr, port, slots, (trap, *slot_notes))


def _pytorchjob(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    reading = _generic(env)
    return None if reading is None else _pod(Platform.PYTORCHJOB, "WORLD_SIZE, RANK", reading)


def _volcano_lists(env: Mapping[str, str], read: ReadFile) -> dict[str, tuple[str, ...]]:
    """Task name -> its hosts: ``/etc/volcano/<task>.host`` (one per line), else ``VC_<TASK>_HOSTS`` (commas)."""
    lists = {}
    for name in sorted(env):
        match = re.fullmatch(r"VC_([A-Z0-9_]+)_HOSTS", name)
        if match is None or _value(env, name) is None:
            continue
        task = match.group(1).lower()  # Volcano's file name: the task name with '-' -> '_' (a DNS label)
        path = f"{VOLCANO_HOSTS_DIR}/{task}.host"
        try:
            lists[task] = parse_host_list(path, read(path), "\n")
        except SmallFileError as err:
            if not err.missing:
                raise PlatformError(name, path, err.reason) from None
            lists[task] = parse_host_list(name, env[name], ",")
    return lists


def _volcano(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    index = _value(env, "VC_TASK_INDEX")
    lists = _volcano_lists(env, read)
    if index is None and not lists:
        return None
    reading = _generic(env)
    if reading is not None:
        # The pytorch plugin numbers master 0 and worker i as i + 1 (RANK): the world is master's hosts, then
        # worker's. Renamed tasks or lists that do not add up: no names, the nodes are numbered instead.
        hosts = lists.get("master", ()) + lists.get("worker", ())
        hosts = hosts if len(hosts) == reading.num_nodes and "master" in lists else ()
        return _pod(Platform.VOLCANO, "WORLD_SIZE, RANK, VC_* (pytorch plugin)", reading, hosts)
    return _volcano_task(env, index, lists)


def _volcano_task(env: Mapping[str, str], index: str | None, lists: dict[str, tuple[str, ...]]) -> Detection:
    """Without the pytorch plugin: the pod's index in its task; the task's hosts when the job has one task."""
    hosts = next(iter(lists.values())) if len(lists) == 1 else ()
    node_rank = None
    if index is not None:
        node_rank = parse_count("VC_TASK_INDEX", index, low=0, high=MAX_NODES - 1, what="a task index")
        if hosts and node_rank >= len(hosts):
            raise PlatformError("VC_TASK_INDEX", index, f"is not below the task's {len(hosts)} hosts")
    addr, port = _master(env, ("MASTER_ADDR",), ("MASTER_PORT",))
    notes = () if hosts else ("several tasks or no host list: pass -H or --hosts with every pod's name",)
    reading = _Reading(node_rank, len(hosts) or None, addr or (hosts[0] if hosts else None), port, None, notes)
    return _pod(Platform.VOLCANO, "VC_TASK_INDEX" if index is not None else "VC_*_HOSTS", reading, hosts)


def _lws(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    if _value(env, "LWS_GROUP_SIZE") is None:
        return None
    size = parse_count("LWS_GROUP_SIZE", env["LWS_GROUP_SIZE"], low=1, high=MAX_NODES, what="the group size")
    rank_name = _first_set(env, "LWS_WORKER_INDEX")
    addr, port = _master(env, ("LWS_LEADER_ADDRESS",), ("MASTER_PORT",))
    reading = _Reading(_rank(env, rank_name, size, "LWS_GROUP_SIZE"), size, addr, port)
    return _pod(Platform.LWS, "LWS_GROUP_SIZE, LWS_WORKER_INDEX", reading)


def _skypilot(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    if _value(env, "SKYPILOT_NODE_IPS") is None:
        return None
    hosts = parse_host_list("SKYPILOT_NODE_IPS", env["SKYPILOT_NODE_IPS"], "\n ")
    count = _value(env, "SKYPILOT_NUM_NODES")
    if count is not None and parse_count("SKYPILOT_NUM_NODES", count, low=1, high=MAX_NODES,
                                         what="the node count") != len(hosts):
        raise PlatformError("SKYPILOT_NUM_NODES", count, f"but SKYPILOT_NODE_IPS lists {len(hosts)} hosts")
    rank = _rank(env, _first_set(env, "SKYPILOT_NODE_RANK"), len(hosts), "SKYPILOT_NUM_NODES")
    no_gpus = (env.get("SKYPILOT_NUM_GPUS_PER_NODE") or "").strip() == "0"  # a CPU cluster: count locally
    slots, notes = (None, ()) if no_gpus else _slots(env, "SKYPILOT_NUM_GPUS_PER_NODE")
    reading = _Reading(rank, len(hosts), hosts[0], None, slots, notes)
    return _pod(Platform.SKYPILOT, "SKYPILOT_NODE_IPS, SKYPILOT_NODE_RANK", reading, hosts)


def _indexed_job(env: Mapping[str, str], read: ReadFile) -> Detection | None:
    if _value(env, "JOB_COMPLETION_INDEX") is None:
        return None
    rank = _rank(env, "JOB_COMPLETION_INDEX", None, "")
    note = "the node count and names come from -H or --hosts; master = the first host"
    return _pod(Platform.INDEXED_JOB, "JOB_COMPLETION_INDEX", _Reading(rank, None, None, None, None, (note,)))


_POD_DETECTORS: tuple[Callable[[Mapping[str, str], ReadFile], Detection | None], ...] = (
    _kubeflow, _volcano, _pytorchjob, _lws, _skypilot, _indexed_job,
)
