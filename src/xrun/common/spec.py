"""The wire contract between the runner and a node agent: the node spec, its ranks and the agent's options.

``launch`` owns this format because it is the lower layer: the runner imports it to build plans, the agent
imports it to execute them. Every type here is a frozen dataclass that converts to and from plain JSON. How the
ranks' argv and env are planned from the world is ``xrun.common.rankplan``'s (a connect-mode agent, which is sent
them, never loads it).
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from xrun.errors import UsageError
from xrun.printable import shown
from xrun.strict_numbers import MAX_RANKS

SPEC_VERSION = 1
DEFAULT_MASTER_PORT = 29500
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # torch's contract: the ranks' attempt (their group's restarts)
REPLICA_GROUP_ID = "REPLICA_GROUP_ID"  # --replica_groups: a rank's group (xrun.common.rankplan)
# torch elastic gives workers 30 s between SIGTERM and SIGKILL; matching it keeps checkpoints-on-TERM working.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# --join_timeout: how long a job waits for its last node (spot nodes pulling images start minutes apart).
DEFAULT_JOIN_TIMEOUT = 1800.0
RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# torchrun's --numa-binding modes (torch.numa.binding.AffinityMode, torch >= 2.9)
NUMA_MODES = ("node", "socket", "exclusive", "core-complex")
# --forward_signals: Slurm preemption (--signal=USR1@90) and checkpoint-on-signal scripts (issue 13).
DEFAULT_FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# Signals that cannot be forwarded: uncatchable, xrun's own (a stop of the whole job), or the reaper's.
# SIGQUIT is the hang doctor's key (Ctrl-\\ shows every rank's stack); forwarded, its default action kills the ranks.
_NOT_FORWARDED = frozenset({signal.SIGKILL, signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                            signal.SIGQUIT, signal.SIGCHLD})  # fmt: skip

class PythonMode(enum.Enum):
    """How the rank command starts the user's program."""

    SCRIPT = "script"  # python -u SCRIPT
    MODULE = "module"  # python -u -m MODULE
    NONE = "none"  # SCRIPT is an executable, run as is


ON_DEMAND_BUDGET = 5.0  # a dump at SIGQUIT or a hang: a loaded node may need a while per process (the head waits too)


class HangAction(enum.Enum):
    """What ``--hang_timeout`` does once no rank anywhere has written output for that long (issue 14)."""

    DUMP = "dump"  # print the merged stacks and go on; again only after new output and another silence
    STOP = "stop"  # print them, then stop the job with HANG_EXIT (xrun.common.result.outcome)
    RESTART = "restart"  # as stop, then the hang is a failure like any other: --max_restarts may restart the job


class OnRankExit(enum.Enum):
    """``--on_rank_exit``: what a rank's failure does to the others (issue 39 §3)."""

    STOP = "stop"  # the first rank that fails stops every other rank (torchrun's rule)
    KEEP = "keep"  # in-process recovery (NVRx's Wrapper): nobody is signalled, the job ends with its last rank


@dataclass(frozen=True)
class LocalEcho:
    """torchrun's console rules, by local rank and the same on every node (issue 41): ``--local-ranks-filter`` echoes
    only these local ranks; ``--redirects`` keeps a rank's stdout (1), its stderr (2) or both (3) off the console,
    in its log files only (torch's ``Std``: one value for every local rank, or ``LOCAL:STD,...`` per local rank)."""

    ranks: tuple[int, ...] | None = None  # --local-ranks-filter (None: every local rank)
    redirects: int = 0  # --redirects N: every local rank
    rank_redirects: tuple[tuple[int, int], ...] = ()  # --redirects LOCAL:STD,...: these ranks (the others 0)

    def __post_init__(self) -> None:  # JSON lists when the options come from the node spec
        if self.ranks is not None:
            object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "rank_redirects", tuple((int(r), int(s)) for r, s in self.rank_redirects))

    def echoes(self, local_rank: int, fd: int) -> bool:
        """Whether this local rank's stream ``fd`` (1 stdout, 2 stderr) reaches the console."""
        if self.ranks is not None and local_rank not in self.ranks:
            return False
        return not dict(self.rank_redirects).get(local_rank, self.redirects) & fd

    def shows(self, local_rank: int) -> bool:
        """Whether any of the rank's lines reach the console."""
        return self.echoes(local_rank, 1) or self.echoes(local_rank, 2)

    def redirects_text(self) -> str | None:
        """``--redirects`` as torchrun writes it (None: nothing redirected)."""
        if self.rank_redirects:
            return ",".join(f"{rank}:{std}" for rank, std in self.rank_redirects)
        return str(self.redirects) if self.redirects else None


def parse_std(flag: str, text: str) -> dict[int, int] | int:
    """torchrun's ``Std.from_str`` (``--tee``, ``--redirects``): ``0``-``3`` for every local rank, or
    ``LOCAL:STD,...`` per local rank."""
    if re.fullmatch(r"[0-3]", text.strip()):
        return int(text)
    found: dict[int, int] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]{1,4}):([0-3])\s*", part)
        if match is None:
            raise UsageError(flag, f"{shown(text)} is not 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,...; "
                             "e.g. 3 or 0:3,1:1")
        found[int(match.group(1))] = int(match.group(2))
    return found


def local_echo(local_ranks_filter: str | None, redirects: str | None) -> LocalEcho:
    """``--local-ranks-filter`` and ``--redirects`` as the node applies them (torchrun: an empty filter is none)."""
    ranks = parse_rank_list("--local-ranks-filter", local_ranks_filter) if local_ranks_filter else None
    std = parse_std("--redirects", redirects) if redirects is not None else 0
    if isinstance(std, int):
        return LocalEcho(ranks=ranks, redirects=std)
    return LocalEcho(ranks=ranks, rank_redirects=tuple(sorted((r, s) for r, s in std.items() if s)))


@dataclass(frozen=True)
class AgentOptions:
    """How the node agent supervises, binds and logs its ranks."""

    log_dir: str | None = None
    prefix: bool = True
    quiet: bool = False
    dedupe: bool = True  # identical console lines of several ranks shown once (xrun.common.output.dedupe); --no_dedupe
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    bind_cores: bool = False
    bind_core_list: str | None = None
    console_ranks: tuple[int, ...] | None = None  # --console_ranks: the global ranks echoed (None: all)
    forward_signals: tuple[int, ...] = DEFAULT_FORWARD_SIGNALS  # passed on to every rank, the job goes on
    hang_timeout: float | None = None  # --hang_timeout: seconds of silence from every rank that make a hang
    hang_action: HangAction = HangAction.DUMP
    on_rank_exit: OnRankExit = OnRankExit.STOP  # --on_rank_exit keep: a failed rank stops no other (issue 39 §3)
    failure_stacks: bool = True  # the survivors' stacks in the failure report (--no_failure_stacks: off)
    network_interface: str = "auto"  # --network_interface NAME|auto|none: the ranks' *_SOCKET_IFNAME (issue 24)
    telemetry: bool = True  # every rank's collective records on a Unix socket (issue 31); --no_telemetry: off
    preload: tuple[str, ...] = ()  # --preload: modules one helper imports; the ranks are forked from it (issue 32)
    numa_binding: str | None = None  # torchrun's --numa-binding MODE, with bind_cores (issue 41)
    # torchrun's --duplicate-std{out,err}-filters: lines holding one of these words are copied to a node file
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    local_echo: LocalEcho = LocalEcho()  # torchrun's --local-ranks-filter and --redirects, by local rank

    def __post_init__(self) -> None:
        if isinstance(self.local_echo, Mapping):  # a JSON object when the options come from the node spec
            object.__setattr__(self, "local_echo", LocalEcho(**self.local_echo))
        object.__setattr__(self, "preload", tuple(self.preload))  # a JSON list when the options come from the spec
        object.__setattr__(self, "duplicate_stdout_filters", tuple(self.duplicate_stdout_filters))
        object.__setattr__(self, "duplicate_stderr_filters", tuple(self.duplicate_stderr_filters))
        object.__setattr__(self, "hang_action", HangAction(self.hang_action))  # a plain string from JSON
        object.__setattr__(self, "on_rank_exit", OnRankExit(self.on_rank_exit))  # the same
        if self.console_ranks is not None:  # a JSON list when the options come from the node spec
            object.__setattr__(self, "console_ranks", tuple(self.console_ranks))
        object.__setattr__(self, "forward_signals", tuple(signal.Signals(s) for s in self.forward_signals))


@dataclass(frozen=True)
class ElasticOptions:
    """``--elastic``: torch's elastic agent runs the node's ranks (restarts, nodes leaving and joining).

    ``min_nodes``/``max_nodes`` are None only in a request (the planner fills them from the world);
    ``rdzv_conf`` holds the user's ``--rdzv_conf`` keys, already checked against ``xrun.common.rdzv``.
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
class ReplicaGroups:
    """``--replica_groups G`` (torchft, issue 39 §2): the world's ranks in ``count`` groups of equal size, in rank
    order, each a world of its own (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ... counted within the group, each
    with its own store), meeting across groups only through torchft's Lighthouse on node 0."""

    count: int
    master_ports: tuple[int, ...]  # group g's MASTER_PORT, where the agent of its rank 0's node hosts its store
    lighthouse_port: int  # torchft_lighthouse's, on node 0 (TORCHFT_LIGHTHOUSE)

    def __post_init__(self) -> None:  # a JSON list when the groups come from the node spec
        object.__setattr__(self, "master_ports", tuple(int(p) for p in self.master_ports))

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "master_ports": list(self.master_ports), "lighthouse_port": self.lighthouse_port}

    def lighthouse_url(self, node0: str) -> str:
        """``TORCHFT_LIGHTHOUSE`` for node 0 at address ``node0`` (an IPv6 address in brackets, as a URL's host)."""
        return f"http://{f'[{node0}]' if ':' in node0 else node0}:{self.lighthouse_port}"


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
    replicas: ReplicaGroups | None = None  # --replica_groups: torchft's replica groups (None: one world)
    version: int = SPEC_VERSION

    @property
    def world_size(self) -> int:
        """Every node's ranks together, as the ranks are told (``WORLD_SIZE``, a group's under --replica_groups,
        times the groups; this node's alone without it)."""
        told = self.ranks[0].env.get("WORLD_SIZE", "") if self.ranks else ""
        return int(told) * (self.replicas.count if self.replicas else 1) if told.isdigit() else len(self.ranks)

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
        if self.replicas is not None:
            data["replicas"] = self.replicas.to_json()
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
            replicas=ReplicaGroups(**data["replicas"]) if data.get("replicas") else None,
        )


def with_rendezvous(spec: NodeSpec, master_addr: str, master_port: int, restart_count: int = 0) -> NodeSpec:
    """``spec`` with what the start barrier decided filled in (a channel backend's plan has no MASTER_ADDR, and its
    port is only node 0's first try) and, with --max_restarts, the attempt (torch's contract:
    ``TORCHELASTIC_RESTART_COUNT``)."""
    told = {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), RESTART_COUNT: str(restart_count)}
    unless_planned = dict[str, str]()
    if spec.replicas is not None:
        # --replica_groups: each group keeps the port planned for it and the address where the plan knew it (a group
        # on another node than node 0: that node's name); node 0's groups meet at node 0's address, where the
        # Lighthouse listens. Each group counts its own restarts (the head restarts no job): a group moved to a hot
        # spare starts from its count so far (``moved_to``)
        told = {}
        unless_planned = {"MASTER_ADDR": master_addr, "TORCHFT_LIGHTHOUSE": spec.replicas.lighthouse_url(master_addr)}
    ranks = tuple(
        RankSpec(rank=r.rank, local_rank=r.local_rank, argv=r.argv, env={**unless_planned, **r.env, **told})
        for r in spec.ranks
    )
    return replace(spec, ranks=ranks)


def moved_to(spec: NodeSpec, host: str, restarts: Mapping[int, int]) -> NodeSpec:
    """A node's ``spec`` for the hot spare on ``host`` that takes its place (same node rank, same slots). Under
    ``--replica_groups`` its groups meet at the spare (their ``MASTER_ADDR``, the lost host's name in the plan,
    becomes ``host``), and those in ``restarts`` (group -> its restart count: ``TORCHELASTIC_RESTART_COUNT``, from
    which the spare's agent counts each group's budget on) start from their count so far."""
    if spec.replicas is None:
        return replace(spec, host=host)
    lost = spec.host
    ranks = []
    for r in spec.ranks:
        group = replica_group(r.env)
        count = {RESTART_COUNT: str(restarts[group])} if group in restarts else {}
        ranks.append(replace(r, env={**r.env, **count, **({"MASTER_ADDR": host} if r.env.get("MASTER_ADDR") == lost
                                                          else {})}))
    return replace(spec, host=host, ranks=tuple(ranks))


def replica_group(env: Mapping[str, str]) -> int:
    """A rank's replica group, as its environment tells it (``REPLICA_GROUP_ID``, xrun.common.rankplan); 0 for a
    rank of a job without groups."""
    return int(env.get(REPLICA_GROUP_ID) or 0)


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
        {} if options.on_rank_exit is OnRankExit.STOP else {"on_rank_exit": options.on_rank_exit.value}) | (
        {} if options.failure_stacks else {"failure_stacks": False}) | (
        {} if options.network_interface == "auto" else {"network_interface": options.network_interface}
    ) | ({} if options.telemetry else {"telemetry": False}) | (
        {"preload": list(options.preload)} if options.preload else {}) | (
        {"numa_binding": options.numa_binding} if options.numa_binding is not None else {}) | (
        {"duplicate_stdout_filters": list(options.duplicate_stdout_filters)}
        if options.duplicate_stdout_filters else {}) | (
        {"duplicate_stderr_filters": list(options.duplicate_stderr_filters)}
        if options.duplicate_stderr_filters else {}) | (
        {"local_echo": {"ranks": options.local_echo.ranks, "redirects": options.local_echo.redirects,
                        "rank_redirects": [list(p) for p in options.local_echo.rank_redirects]}}
        if options.local_echo != LocalEcho() else {})


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


def parse_module_list(flag: str, text: str) -> tuple[str, ...]:
    """``torch,transformers`` -> the module names, in order (a repeat dropped). Each is a dotted name as ``import``
    takes it: an empty list, a space, or a path or file name is a UsageError that says what to write instead."""
    if not text:
        raise UsageError(flag, "names no module; e.g. torch or torch,transformers")
    if any(c.isspace() for c in text):
        raise UsageError(flag, f"{shown(text)}: no spaces; separate the modules with commas only, e.g. torch,numpy")
    found: list[str] = []
    for name in text.split(","):
        said = f"{shown(text)}: {shown(name)}" if "," in text else shown(name)
        if "/" in name or "\\" in name or name.endswith((".py", ".pyc", ".so")):
            raise UsageError(flag, f"{said} is a path or a file name, not a module name; give the name import takes "
                                   "(e.g. mypkg.models) and put its directory on PYTHONPATH")
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(flag, f"{said} is not a module name; e.g. torch or torch,numpy")
        if name not in found:
            found.append(name)
    return tuple(found)


def parse_filter_list(text: str) -> tuple[str, ...]:
    """torchrun's ``comma_separated_list``: ``apple,orange``; a double comma is a comma; empty words dropped."""
    return tuple(word.replace("\0", ",") for word in text.replace(",,", "\0").split(",") if word)


def filter_list(words: tuple[str, ...]) -> str:
    """The duplicate filters' spelling (``parse_filter_list`` reads it back): a comma in a word doubled."""
    return ",".join(word.replace(",", ",,") for word in words)


def signal_list(signals: tuple[int, ...]) -> str:
    """The ``--forward_signals`` spelling of ``signals``: ``USR1,USR2``."""
    return ",".join(signal.Signals(s).name.removeprefix("SIG") for s in signals)


def parse_rank_list(flag: str, text: str) -> tuple[int, ...]:
    """``0,2-3`` -> ``(0, 2, 3)``: global ranks and low-high ranges, sorted; anything else is a UsageError.

    Each number is held to ASCII digits (``'²'.isdigit()`` is true, ``int('²')`` a ValueError) and below the most
    ranks xrun accepts before any range is expanded (``0-99999999999`` took minutes and gigabytes)."""
    ranks: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", part)
        if match is None:
            raise UsageError(flag, f"{shown(text)}: {shown(part)} is not a rank or a low-high range; e.g. 0 or 0,2-3")
        low, high = match.groups()
        for number in filter(None, (low, high)):
            if len(number) > 7 or int(number) >= MAX_RANKS:
                raise UsageError(flag, f"{shown(text)}: rank {shown(number)} is past the most ranks xrun accepts "
                                 f"({MAX_RANKS})")
        first, last = int(low), int(high) if high is not None else int(low)
        if last < first:
            raise UsageError(flag, f"{text!r}: range {part.strip()} runs backwards (write {last}-{first})")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))


def check_rank_list(flag: str, ranks: tuple[int, ...] | None, world_size: int) -> None:
    """Every rank of ``ranks`` exists in a world of ``world_size`` ranks."""
    outside = [r for r in ranks or () if r >= world_size]
    if outside:
        raise UsageError(flag, f"rank {outside[0]} does not exist: the job has ranks 0-{world_size - 1}")
