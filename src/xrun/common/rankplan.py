"""The rank plan: from the world (DeepSpeed's world info) and the user's program to every rank's argv and env
contract. One pure function, ``node_ranks``, shared by the runner's plan and dry-run and the agent's stand-alone CLI;
a connect-mode agent is sent its ranks (``xrun.common.spec``) and plans none.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import itertools
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xrun.common.spec import REPLICA_GROUP_ID, RESTART_COUNT, PythonMode, RankSpec, ReplicaGroups
from xrun.errors import UsageError, WorldInfoError
from xrun.hostlist import host_name_problem
from xrun.printable import shown
from xrun.strict_numbers import MAX_HOSTS, MAX_SLOTS_PER_HOST

World = Mapping[str, tuple[int, ...]]
DEFAULT_ROLE = "default"  # torchrun's --role default: every rank's ROLE_NAME


# ---------------------------------------------------------------------------------------------------------------
# World info: DeepSpeed's base64 JSON of {host: [slot ids]} in node order, byte-compatible.


def encode_world_info(world: World) -> str:
    """Encode like DeepSpeed: urlsafe base64 of ``json.dumps`` with default separators."""
    as_lists = {host: list(slots) for host, slots in world.items()}
    return base64.urlsafe_b64encode(json.dumps(as_lists).encode("utf-8")).decode("ascii")


def decode_world_info(text: str) -> dict[str, tuple[int, ...]]:
    """Decode a world info string (ours or DeepSpeed's); node order is the JSON object order."""
    try:
        raw = base64.urlsafe_b64decode(_pad_base64(text.strip()).encode("ascii"))
        decoded = json.loads(raw.decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeError) as err:
        reason = f"not base64-encoded JSON ({err.__class__.__name__}); pass the string xrun printed"
        raise WorldInfoError(reason) from None
    if not isinstance(decoded, dict) or not decoded:
        raise WorldInfoError('expected a non-empty JSON object {"host": [slot, ...]}')
    if len(decoded) > MAX_HOSTS:
        raise WorldInfoError(f"{len(decoded)} hosts; {MAX_HOSTS} is the most xrun accepts")
    world: dict[str, tuple[int, ...]] = {}
    for host, slots in decoded.items():
        world[host] = _host_slots(host, slots)
    return world


def _host_slots(host: str, slots: Any) -> tuple[int, ...]:
    """One host's slot ids, held to what a hostfile may say: a host name, distinct device ids, at most
    ``MAX_SLOTS_PER_HOST`` of them (a DeepSpeed world info string is user input on the agent's command line)."""
    problem = host_name_problem(host)
    if problem is not None:
        raise WorldInfoError(problem)
    if not isinstance(slots, list) or not slots or not all(_is_slot(s) for s in slots):
        raise WorldInfoError(f"host {shown(host)}: slots must be a non-empty list of device ids "
                             f"(0-{MAX_SLOTS_PER_HOST - 1})")
    if len(slots) > MAX_SLOTS_PER_HOST:
        raise WorldInfoError(f"host {shown(host)}: {len(slots)} slots; {MAX_SLOTS_PER_HOST} is the most xrun accepts")
    if len(set(slots)) != len(slots):
        raise WorldInfoError(f"host {shown(host)}: a device is listed twice in {shown(str(slots))}; each rank needs "
                             "its own")
    return tuple(slots)


def _pad_base64(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _is_slot(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SLOTS_PER_HOST


# ---------------------------------------------------------------------------------------------------------------
# What one node runs.


@dataclass(frozen=True)
class LaunchOptions:
    """How each rank's command line is built from the user's program."""

    python: str = sys.executable
    mode: PythonMode = PythonMode.SCRIPT
    local_rank_arg: bool = True  # DeepSpeed appends --local_rank=N unless --no_local_rank
    device_per_rank: bool = False  # --device_per_rank: each rank sees only its own device, as its local rank 0
    role: str = DEFAULT_ROLE  # --role (torchrun's): ROLE_NAME

    def __post_init__(self) -> None:
        mode: object = self.mode  # a plain string when the options come from JSON (the node spec)
        if not isinstance(mode, PythonMode):
            object.__setattr__(self, "mode", PythonMode(mode))



# ---------------------------------------------------------------------------------------------------------------
# The rank plan: one pure function shared by the runner's dry-run/plan and the agent's own CLI.


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: rank 0's address and port, and the run id (torch's rendezvous contract).

    ``master_addr`` is None in the plan of a channel backend: node 0's address as its agent sees it is decided once,
    at the start barrier (``xrun.runner.job.barrier``), and each agent sets it in its ranks' env then
    (``xrun.common.spec.with_rendezvous``)."""

    master_addr: str | None
    master_port: int
    run_id: str = "xrun"

    @property
    def known_master_addr(self) -> str:
        """The address where the plan knows it (a local run, ``--elastic``, pod mode, ``--master_addr``)."""
        if self.master_addr is None:
            raise ValueError("the master address is decided at the start barrier, not in the plan")
        return self.master_addr


@functools.lru_cache(maxsize=256)
def rank_argv(launch: LaunchOptions, local_rank: int, script: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """``python -u [-m] SCRIPT [--local_rank=N] ARGS`` — the user's args untouched, always a list. Cached: the
    ranks with the same local rank share one tuple (a head plans 10,000 nodes' ranks at once)."""
    if launch.mode is PythonMode.NONE:
        head: tuple[str, ...] = (script,)
    elif launch.mode is PythonMode.MODULE:
        head = (launch.python, "-u", "-m", script)
    else:
        # A script named like an option (``xrun -- -weird.py``) needs python's own ``--`` to be run as a script.
        head = (launch.python, "-u", "--", script) if script.startswith("-") else (launch.python, "-u", script)
    local = (f"--local_rank={local_rank}",) if launch.local_rank_arg else ()
    return head + local + tuple(args)


@dataclass(frozen=True)
class WorldShape:
    """What every rank's env needs from the whole world, computed once per plan (per rank it made planning
    65536 hosts take minutes)."""

    hosts: tuple[str, ...]
    first_ranks: tuple[int, ...]  # of each node, in world order
    world_size: int


def world_shape(world: World) -> WorldShape:
    hosts = tuple(world)
    firsts = tuple(itertools.accumulate((len(world[h]) for h in hosts), initial=0))
    return WorldShape(hosts=hosts, first_ranks=firsts[:-1], world_size=firsts[-1])


# Every rank's env holds the same few values (the world size, the port, its node's devices): one string each,
# shared by the ranks that repeat it, since a head plans 10,000 nodes' environments at once (a string per rank:
# +29 MiB for 80,000 ranks).


@functools.lru_cache(maxsize=1024)
def _number(n: int) -> str:
    return str(n)


@functools.lru_cache(maxsize=1024)
def _devices(slots: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in slots)


def rank_env(
    world: World, node_rank: int, local_rank: int, rdzv: Rendezvous, *, shape: WorldShape | None = None,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The union of the torchrun and DeepSpeed per-rank env contracts (``max_restarts``: a static job's
    ``--max_restarts``; the agent raises ``TORCHELASTIC_RESTART_COUNT`` with each attempt)."""
    shape = shape or world_shape(world)
    hosts = shape.hosts
    slots = world[hosts[node_rank]]
    rank, node = str(shape.first_ranks[node_rank] + local_rank), _number(node_rank)
    rank = node if rank == node else rank  # one rank per node: one string for both
    size, local, nodes = _number(shape.world_size), _number(len(slots)), _number(len(hosts))
    env = {
        "RANK": rank,
        "LOCAL_RANK": _number(local_rank),
        "WORLD_SIZE": size,
        "LOCAL_WORLD_SIZE": local,
        "LOCAL_SIZE": local,
        "GROUP_RANK": node,
        "NODE_RANK": node,
        "CROSS_RANK": node,
        "GROUP_WORLD_SIZE": nodes,
        "CROSS_SIZE": nodes,
        "ROLE_NAME": "default",
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": size,
    }
    if rdzv.master_addr is not None:  # else the start barrier decides it (with_rendezvous)
        env["MASTER_ADDR"] = rdzv.master_addr
    env.update({
        "MASTER_PORT": _number(rdzv.master_port),
        "CUDA_VISIBLE_DEVICES": _devices(slots),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        RESTART_COUNT: "0",
        "TORCHELASTIC_MAX_RESTARTS": _number(max_restarts),
        # rank 0's agent hosts the store at MASTER_PORT, a new one each attempt (xrun.launch.store; issue 39)
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    })
    return env


def group_env(env: dict[str, str], world: World, node_rank: int, local_rank: int, rdzv: Rendezvous,
              replicas: ReplicaGroups, *, shape: WorldShape) -> int:
    """``--replica_groups`` (torchft, issue 39 §2): turn one rank's world contract (``rank_env``'s) into its
    group's, in place, as one torchrun per group would set it (torchft's README); returns the local rank the
    program is told.

    The world's ranks fall into ``replicas.count`` groups of equal size in rank order, so a group may span nodes
    and a node may hold several groups. Within its group a rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE`` (its group's ranks on its node), ``GROUP_RANK``/``GROUP_WORLD_SIZE`` (the group's nodes),
    ``CUDA_VISIBLE_DEVICES`` (its group's slots on its node, so ``cuda:LOCAL_RANK`` is its own device) and
    ``MASTER_ADDR``/``MASTER_PORT`` of the group's rank 0 (where that node's agent hosts the group's store); and
    ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` (node 0's Lighthouse)."""
    size = shape.world_size // replicas.count
    first_here = shape.first_ranks[node_rank]
    rank = first_here + local_rank
    group = rank // size
    first = group * size  # the group's rank 0
    node0 = max(first_here, first)  # this node's first rank of the group
    local_ranks = min(first_here + len(world[shape.hosts[node_rank]]), first + size) - node0
    first_node = bisect.bisect_right(shape.first_ranks, first) - 1  # the node of the group's rank 0
    last_node = bisect.bisect_right(shape.first_ranks, first + size - 1) - 1
    slots = world[shape.hosts[node_rank]][node0 - first_here: node0 - first_here + local_ranks]
    # Node 0's address is rdzv's (or the start barrier's); a group led from another node meets at that node's name.
    master = rdzv.master_addr if first_node == 0 else shape.hosts[first_node]
    seen = rank - node0
    env.update({
        "RANK": _number(rank - first),
        "LOCAL_RANK": _number(seen),
        "WORLD_SIZE": _number(size),
        "LOCAL_WORLD_SIZE": _number(local_ranks),
        "LOCAL_SIZE": _number(local_ranks),
        "GROUP_RANK": _number(node_rank - first_node),
        "NODE_RANK": _number(node_rank - first_node),
        "CROSS_RANK": _number(node_rank - first_node),
        "GROUP_WORLD_SIZE": _number(last_node - first_node + 1),
        "CROSS_SIZE": _number(last_node - first_node + 1),
        "ROLE_RANK": _number(rank - first),
        "ROLE_WORLD_SIZE": _number(size),
        "MASTER_PORT": _number(replicas.master_ports[group]),
        "CUDA_VISIBLE_DEVICES": _devices(slots),
        REPLICA_GROUP_ID: _number(group),
        "NUM_REPLICA_GROUPS": _number(replicas.count),
    })
    if master is not None:
        env["MASTER_ADDR"] = master
    if rdzv.master_addr is not None:  # else the start barrier decides node 0's address
        env["TORCHFT_LIGHTHOUSE"] = replicas.lighthouse_url(rdzv.master_addr)
    return seen


def node_ranks(
    world: World,
    node_rank: int,
    rdzv: Rendezvous,
    launch: LaunchOptions,
    script: str,
    args: tuple[str, ...],
    *,
    shape: WorldShape | None = None,
    max_restarts: int = 0,
    replicas: ReplicaGroups | None = None,
) -> tuple[RankSpec, ...]:
    """Every rank of one node, in slot order (``shape``: the world's, when the caller plans every node;
    ``replicas``: each rank's contract counted within its replica group, ``group_env``)."""
    shape = shape or world_shape(world)
    hosts = shape.hosts
    if not 0 <= node_rank < len(hosts):
        raise UsageError("--node_rank", f"{node_rank} is outside 0..{len(hosts) - 1} for a {len(hosts)}-node world")
    slots = world[hosts[node_rank]]
    ranks = []
    for local_rank in range(len(slots)):
        env = rank_env(world, node_rank, local_rank, rdzv, shape=shape, max_restarts=max_restarts)
        seen = local_rank  # the local rank the program is told
        if replicas is not None:
            seen = group_env(env, world, node_rank, local_rank, rdzv, replicas, shape=shape)
        if launch.role != DEFAULT_ROLE:
            env["ROLE_NAME"] = launch.role
        if launch.device_per_rank:  # torchrun's virtual local rank: one device, always cuda:0
            env.update({"CUDA_VISIBLE_DEVICES": str(slots[local_rank]), "LOCAL_RANK": "0"})
            seen = 0
        rank = shape.first_ranks[node_rank] + local_rank  # the global rank: logs, console, the head's counts
        ranks.append(RankSpec(rank, local_rank, env, rank_argv(launch, seen, script, tuple(args))))
    return tuple(ranks)
