"""The wire contract between the runner and a node agent: world info, node spec, rank spec.

``launch`` owns this format because it is the lower layer: the runner imports it to build plans, the agent
imports it to execute them. Every type here is a frozen dataclass that converts to and from plain JSON.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import itertools
import json
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xrun.errors import UsageError, WorldInfoError

SPEC_VERSION = 1
DEFAULT_MASTER_PORT = 29500
# torch elastic gives workers 30 s between SIGTERM and SIGKILL; matching it keeps checkpoints-on-TERM working.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# --join_timeout: how long a job waits for its last node (spot nodes pulling images start minutes apart).
DEFAULT_JOIN_TIMEOUT = 1800.0
RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# --forward_signals: Slurm preemption (--signal=USR1@90) and checkpoint-on-signal scripts (issue 13).
DEFAULT_FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# Signals that cannot be forwarded: uncatchable, xrun's own (a stop of the whole job), or the reaper's.
_NOT_FORWARDED = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                            signal.SIGCHLD})  # fmt: skip

World = Mapping[str, tuple[int, ...]]


class PythonMode(enum.Enum):
    """How the rank command starts the user's program."""

    SCRIPT = "script"  # python -u SCRIPT
    MODULE = "module"  # python -u -m MODULE
    NONE = "none"  # SCRIPT is an executable, run as is


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
    world: dict[str, tuple[int, ...]] = {}
    for host, slots in decoded.items():
        if not isinstance(slots, list) or not slots or not all(_is_slot(s) for s in slots):
            raise WorldInfoError(f"host {host!r}: slots must be a non-empty list of non-negative integers")
        world[host] = tuple(slots)
    return world


def _pad_base64(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _is_slot(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---------------------------------------------------------------------------------------------------------------
# What one node runs.


@dataclass(frozen=True)
class LaunchOptions:
    """How each rank's command line is built from the user's program."""

    python: str = sys.executable
    mode: PythonMode = PythonMode.SCRIPT
    local_rank_arg: bool = True  # DeepSpeed appends --local_rank=N unless --no_local_rank
    device_per_rank: bool = False  # --device_per_rank: each rank sees only its own device, as its local rank 0

    def __post_init__(self) -> None:
        mode: object = self.mode  # a plain string when the options come from JSON (the node spec)
        if not isinstance(mode, PythonMode):
            object.__setattr__(self, "mode", PythonMode(mode))


class HangAction(enum.Enum):
    """What ``--hang_timeout`` does once no rank anywhere has written output for that long (issue 14)."""

    DUMP = "dump"  # print the merged stacks and go on; again only after new output and another silence
    STOP = "stop"  # print them, then stop the job with HANG_EXIT (xrun.launch.result.outcome)
    RESTART = "restart"  # as stop, then the hang is a failure like any other: --max_restarts may restart the job


@dataclass(frozen=True)
class AgentOptions:
    """How the node agent supervises, binds and logs its ranks."""

    log_dir: str | None = None
    prefix: bool = True
    quiet: bool = False
    dedupe: bool = True  # identical console lines of several ranks shown once (xrun.launch.output.dedupe); --no_dedupe
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    bind_cores: bool = False
    bind_core_list: str | None = None
    console_ranks: tuple[int, ...] | None = None  # --console_ranks: the global ranks echoed (None: all)
    forward_signals: tuple[int, ...] = DEFAULT_FORWARD_SIGNALS  # passed on to every rank, the job goes on
    hang_timeout: float | None = None  # --hang_timeout: seconds of silence from every rank that make a hang
    hang_action: HangAction = HangAction.DUMP
    failure_stacks: bool = True  # the survivors' stacks in the failure report (--no_failure_stacks: off)
    network_interface: str = "auto"  # --network_interface NAME|auto|none: the ranks' *_SOCKET_IFNAME (issue 24)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hang_action", HangAction(self.hang_action))  # a plain string from JSON
        if self.console_ranks is not None:  # a JSON list when the options come from the node spec
            object.__setattr__(self, "console_ranks", tuple(self.console_ranks))
        object.__setattr__(self, "forward_signals", tuple(signal.Signals(s) for s in self.forward_signals))


@dataclass(frozen=True)
class ElasticOptions:
    """``--elastic``: torch's elastic agent runs the node's ranks (restarts, nodes leaving and joining).

    ``min_nodes``/``max_nodes`` are None only in a request (the planner fills them from the world);
    ``rdzv_conf`` holds the user's ``--rdzv_conf`` keys, already checked against ``xrun.launch.elastic.rdzv``.
    """

    min_nodes: int | None = None
    max_nodes: int | None = None
    max_restarts: int = 0
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None  # HOST:PORT; default: the master address and port
    rdzv_id: str | None = None  # default: the run id
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    monitor_interval: float = 0.1  # torch >= 2.4's default: a failure is seen within 0.1 s

    def to_json(self) -> dict[str, Any]:
        return {
            "min_nodes": self.min_nodes,
            "max_nodes": self.max_nodes,
            "max_restarts": self.max_restarts,
            "rdzv_backend": self.rdzv_backend,
            "rdzv_endpoint": self.rdzv_endpoint,
            "rdzv_id": self.rdzv_id,
            "rdzv_conf": dict(self.rdzv_conf),
            "join_timeout": self.join_timeout,
            "monitor_interval": self.monitor_interval,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ElasticOptions:
        return cls(**{**data, "rdzv_conf": dict(data.get("rdzv_conf") or {})})


@dataclass(frozen=True)
class RankSpec:
    """One rank: the env contract xrun adds on top of the node's environment, and its argv."""

    rank: int
    local_rank: int
    env: Mapping[str, str]
    argv: tuple[str, ...]


@dataclass(frozen=True)
class NodeSpec:
    """Everything a node agent needs to run its share of the job."""

    host: str
    node_rank: int
    ranks: tuple[RankSpec, ...]
    options: AgentOptions = field(default_factory=AgentOptions)
    # Variables the runner exports to this node (remote nodes only); applied before the rank contract.
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    run_id: str = "xrun"
    elastic: ElasticOptions | None = None  # None: xrun supervises the ranks itself (static job)
    version: int = SPEC_VERSION

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "host": self.host,
            "node_rank": self.node_rank,
            "run_id": self.run_id,
            "cwd": self.cwd,
            "env": dict(self.env),
            "options": _options_to_json(self.options),
            "ranks": [
                {"rank": r.rank, "local_rank": r.local_rank, "env": dict(r.env), "argv": list(r.argv)}
                for r in self.ranks
            ],
        }
        if self.elastic is not None:
            data["elastic"] = self.elastic.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSpec:
        version = data.get("version")
        if version != SPEC_VERSION:
            reason = f"version {version!r} is not {SPEC_VERSION}; install the same xrun on every node"
            raise UsageError("node spec", reason)
        ranks = tuple(
            RankSpec(rank=int(r["rank"]), local_rank=int(r["local_rank"]), env=dict(r["env"]), argv=tuple(r["argv"]))
            for r in data["ranks"]
        )
        return cls(
            host=str(data["host"]),
            node_rank=int(data["node_rank"]),
            ranks=ranks,
            options=AgentOptions(**data["options"]),
            env=dict(data.get("env", {})),
            cwd=data.get("cwd"),
            run_id=str(data.get("run_id", "xrun")),
            elastic=ElasticOptions.from_json(data["elastic"]) if data.get("elastic") else None,
        )


def _options_to_json(options: AgentOptions) -> dict[str, Any]:
    return {
        "log_dir": options.log_dir,
        "prefix": options.prefix,
        "quiet": options.quiet,
        "shutdown_timeout": options.shutdown_timeout,
        "bind_cores": options.bind_cores,
        "bind_core_list": options.bind_core_list,
    } | ({"console_ranks": list(options.console_ranks)} if options.console_ranks is not None else {}) | (
        {} if options.dedupe else {"dedupe": False}
    ) | (
        {"forward_signals": [int(s) for s in options.forward_signals]}
        if options.forward_signals != DEFAULT_FORWARD_SIGNALS
        else {}
    ) | ({"hang_timeout": options.hang_timeout, "hang_action": options.hang_action.value}
         if options.hang_timeout is not None else {}) | (
        {} if options.failure_stacks else {"failure_stacks": False}) | (
        {} if options.network_interface == "auto" else {"network_interface": options.network_interface}
    )


def parse_signal_list(flag: str, text: str) -> tuple[int, ...]:
    """``USR1,SIGUSR2`` -> the signal numbers (empty text: none); uncatchable or job-stopping ones are refused."""
    found: list[int] = []
    for part in filter(None, (p.strip().upper() for p in text.split(","))):
        name = part if part.startswith("SIG") else f"SIG{part}"
        try:
            signum = signal.Signals[name]
        except KeyError:
            raise UsageError(flag, f"{text!r}: {part!r} is not a signal name; e.g. USR1,USR2 (empty: none)") from None
        if signum in _NOT_FORWARDED:
            raise UsageError(flag, f"{text!r}: {name} cannot be forwarded (it is uncatchable, or xrun's own)")
        if signum not in found:
            found.append(signum)
    return tuple(found)


def signal_list(signals: tuple[int, ...]) -> str:
    """The ``--forward_signals`` spelling of ``signals``: ``USR1,USR2``."""
    return ",".join(signal.Signals(s).name.removeprefix("SIG") for s in signals)


def parse_rank_list(flag: str, text: str) -> tuple[int, ...]:
    """``0,2-3`` -> ``(0, 2, 3)``: global ranks and low-high ranges, sorted; anything else is a UsageError."""
    ranks: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UsageError(flag, f"{text!r}: {part!r} is not a rank or a low-high range; e.g. 0 or 0,2-3")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise UsageError(flag, f"{text!r}: range {part} runs backwards (write {last}-{first})")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))


def check_rank_list(flag: str, ranks: tuple[int, ...] | None, world_size: int) -> None:
    """Every rank of ``ranks`` exists in a world of ``world_size`` ranks."""
    outside = [r for r in ranks or () if r >= world_size]
    if outside:
        raise UsageError(flag, f"rank {outside[0]} does not exist: the job has ranks 0-{world_size - 1}")


# ---------------------------------------------------------------------------------------------------------------
# The rank plan: one pure function shared by the runner's dry-run/plan and the agent's own CLI.


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: rank 0's address and port, and the run id (torch's rendezvous contract)."""

    master_addr: str
    master_port: int
    run_id: str = "xrun"


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
    local = (sys.intern(f"--local_rank={local_rank}"),) if launch.local_rank_arg else ()  # one per value, not per rank
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


def rank_env(
    world: World, node_rank: int, local_rank: int, rdzv: Rendezvous, *, shape: WorldShape | None = None,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The union of the torchrun and DeepSpeed per-rank env contracts (``max_restarts``: a static job's
    ``--max_restarts``; the agent raises ``TORCHELASTIC_RESTART_COUNT`` with each attempt)."""
    shape = shape or world_shape(world)
    hosts = shape.hosts
    slots = world[hosts[node_rank]]
    # one string per value, shared by the keys (and, interned, the ranks) that repeat it: a head plans 10,000
    # nodes' environments at once
    rank, node = str(shape.first_ranks[node_rank] + local_rank), str(node_rank)
    rank = node if rank == node else rank  # one rank per node: one string for both
    size, local, nodes, port, restarts = (sys.intern(str(n)) for n in (shape.world_size, len(slots), len(hosts),
                                                                        rdzv.master_port, max_restarts))
    return {
        "RANK": rank,
        "LOCAL_RANK": sys.intern(str(local_rank)),
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
        "MASTER_ADDR": rdzv.master_addr,
        "MASTER_PORT": port,
        "CUDA_VISIBLE_DEVICES": sys.intern(",".join(str(s) for s in slots)),
        "TORCHELASTIC_RUN_ID": rdzv.run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": restarts,
    }


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
) -> tuple[RankSpec, ...]:
    """Every rank of one node, in slot order (``shape``: the world's, when the caller plans every node)."""
    shape = shape or world_shape(world)
    hosts = shape.hosts
    if not 0 <= node_rank < len(hosts):
        raise UsageError("--node_rank", f"{node_rank} is outside 0..{len(hosts) - 1} for a {len(hosts)}-node world")
    slots = world[hosts[node_rank]]
    ranks = []
    for local_rank in range(len(slots)):
        env = rank_env(world, node_rank, local_rank, rdzv, shape=shape, max_restarts=max_restarts)
        seen = local_rank  # the local rank the program is told
        if launch.device_per_rank:  # torchrun's virtual local rank: one device, always cuda:0
            env.update({"CUDA_VISIBLE_DEVICES": str(slots[local_rank]), "LOCAL_RANK": "0"})
            seen = 0
        ranks.append(RankSpec(int(env["RANK"]), local_rank, env, rank_argv(launch, seen, script, tuple(args))))
    return tuple(ranks)
