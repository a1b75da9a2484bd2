"""Core binding for ``--bind_cores_to_rank``: which CPUs, and which NUMA node's memory, each local rank gets.

The planning is pure (``plan_binding`` takes a ``Topology`` and the agent's affinity mask and returns one
``RankBinding`` per local rank); the I/O sits at the edges (``read_topology`` reads ``/sys``, ``find_numactl``
looks up the binary). The agent then wraps each rank's argv with ``numactl_argv`` or, without numactl, starts
the rank with the CPU affinity of its binding.

How the CPUs are split, and why:

* The pool is the agent's own affinity mask (``os.sched_getaffinity(0)``: real CPU ids inside a cgroup or
  taskset, not 0..P-1 as DeepSpeed assumed), narrowed by ``--bind_core_list``.
* The unit is the physical core (a core and its SMT siblings): two ranks on one core's hyperthreads slow
  each other down, so each rank gets ``cores // ranks`` whole cores, split contiguously like DeepSpeed, and
  the remainder stays unused.
* Ranks are placed inside one NUMA node wherever the node has room for a whole share, so their memory can be
  bound to that node; only the shares that fit in no single node span nodes (and get no ``--membind``).
* Every rank gets the same number of CPUs (``OMP_NUM_THREADS`` is one number): first threads of its cores
  first, then as many siblings as every rank can have.
* On a GPU node, each rank's cores come from its GPU's NUMA node (``gpu_nodes``: the PCI device's
  ``numa_node``) when every node has a whole core per rank it hosts; else the even split above.
* With more ranks than physical cores, cores must be shared: CPUs are then dealt first threads first,
  siblings after, so ranks land on distinct physical cores for as long as there are any.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from xrun.errors import BindingError

__all__ = [
    "Cpu",
    "RankBinding",
    "Topology",
    "binding_env",
    "binding_note",
    "binding_pool",
    "check_binding_env",
    "find_numactl",
    "format_cpus",
    "numactl_argv",
    "parse_cpu_list",
    "plan_binding",
    "plan_numa_binding",
    "read_cache_groups",
    "read_topology",
]

# Linux caps NR_CPUS at 8192 on x86_64 and 4096 on arm64; a larger id is a typo, and refusing it keeps a range
# like 0-99999999 from building a huge set.
MAX_CPU_ID = 65535


@dataclass(frozen=True)
class Cpu:
    """One logical CPU, numbered as the kernel numbers it."""

    id: int
    package: int  # physical_package_id: the socket
    core: int  # the physical core inside the package; SMT siblings share (package, core)
    numa_node: int | None  # None when the kernel exposes no NUMA information for this CPU


@dataclass(frozen=True)
class Topology:
    """The logical CPUs of one machine (in any order)."""

    cpus: tuple[Cpu, ...]


@dataclass(frozen=True)
class RankBinding:
    """The CPUs of one local rank, ascending; ``numa_node`` is set only when all of them sit in that node."""

    cpus: tuple[int, ...]
    numa_node: int | None


# ---------------------------------------------------------------------------------------------------------------
# CPU lists: the kernel's cpulist format ("0-3,8-11"), used by /sys, --bind_core_list and numactl.

_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+))?")  # ASCII digits only: int() would also take "+1", " 1" or "١"


def parse_cpu_list(text: str, *, flag: str = "--bind_core_list") -> frozenset[int]:
    """Parse ``0-3,8-11`` into CPU ids; anything else is a one-line ``BindingError`` that quotes ``text``."""
    try:
        return _parse_ranges(text)
    except ValueError as err:
        raise BindingError(f"{flag} {text!r}: {err}; expected CPU ids and low-high ranges, e.g. 0-3,8-11") from None


def _parse_ranges(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for item in text.split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()!r} is not a CPU id or a range" if item.strip() else "empty item")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ValueError(f"range {low}-{high} runs backwards (write {high}-{low})")
        if high > MAX_CPU_ID:
            raise ValueError(f"CPU id {high} is above {MAX_CPU_ID}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """Compact ascending ranges, as numactl and the kernel write them: ``{0,1,2,3,8}`` -> ``"0-3,8"``."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


# ---------------------------------------------------------------------------------------------------------------
# Planning: pure.


@dataclass(frozen=True)
class _Core:
    """One physical core's CPUs that are in the pool, ascending (the first is the one dealt first)."""

    cpus: tuple[int, ...]
    numa_node: int | None


def binding_pool(allowed: frozenset[int], core_list: str | None = None) -> frozenset[int]:
    """The CPUs to split: the affinity mask, narrowed by ``--bind_core_list`` (which must lie inside it)."""
    if core_list is None:
        return frozenset(allowed)
    listed = parse_cpu_list(core_list)
    outside = listed - allowed
    if outside:
        raise BindingError(
            f"--bind_core_list {core_list!r}: CPUs {format_cpus(outside)} are outside this agent's CPU affinity "
            f"({format_cpus(allowed) or 'empty'}); list only those, or widen the affinity (taskset, cgroup cpuset)"
        )
    return listed


def plan_binding(
    topology: Topology,
    n_ranks: int,
    allowed: frozenset[int],
    core_list: str | None = None,
    gpu_nodes: Sequence[int | None] | None = None,
) -> tuple[RankBinding, ...]:
    """Split the pool among ``n_ranks`` local ranks: equal CPU counts, whole cores, one NUMA node each if it fits.

    ``allowed`` is the agent's affinity mask. CPUs of the pool that ``topology`` does not describe count as
    single-thread cores of unknown NUMA node, so a /sys without topology still gives a usable (if naive) split.
    ``gpu_nodes`` (local rank -> the NUMA node of its GPU) puts each rank on its GPU's node when every rank's
    node is known and has a whole core for each of its ranks; otherwise the even split below.
    """
    if n_ranks < 1:
        raise BindingError(f"cannot bind {n_ranks} local ranks; need at least one")
    pool = binding_pool(allowed, core_list)
    if n_ranks > len(pool):
        raise BindingError(
            f"{n_ranks} local ranks need at least {n_ranks} CPUs, but only {len(pool)} are available "
            f"({format_cpus(pool) or 'none'}); start fewer ranks or drop --bind_cores_to_rank"
        )
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    cores = _physical_cores(topology, pool)
    near = _gpu_near_shares(cores, gpu_nodes) if gpu_nodes is not None and len(gpu_nodes) == n_ranks else None
    if near is not None:
        return tuple(_rank_binding(share, node_of) for share in near)
    cores_per_rank = len(cores) // n_ranks
    if cores_per_rank:
        shares = _whole_core_shares(cores, n_ranks, cores_per_rank)
    else:
        shares = _shared_core_shares(cores, n_ranks)
    return tuple(_rank_binding(share, node_of) for share in shares)


def plan_numa_binding(
    topology: Topology,
    mode: str,
    allowed: frozenset[int],
    core_list: str | None,
    gpu_nodes: Sequence[int | None] | None,
    cache_groups: Mapping[int, int] | None = None,
) -> tuple[RankBinding, ...]:
    """torchrun's ``--numa-binding`` (torch.numa.binding, torch >= 2.9): each rank near its GPU. ``node``: every CPU
    of its GPU's NUMA node (shared by that node's ranks); ``socket``: every CPU of that node's socket; ``exclusive``:
    whole cores of its GPU's node, no two ranks alike; ``core-complex``: the CPUs of one last-level cache of that
    node (``cache_groups``: CPU -> its cache's first CPU), the node's ranks dealt the caches with the most CPUs first,
    round robin, as torch deals them. As in torchrun, a rank without a GPU of known NUMA node is an error, not a
    silent fallback."""
    if not gpu_nodes or any(node is None for node in gpu_nodes):
        raise BindingError(f"--numa-binding {mode}: needs every rank's GPU and its NUMA node (an NVIDIA GPU per "
                           "local rank, its PCI device's numa_node known); use --bind_cores_to_rank on CPU ranks")
    pool = binding_pool(allowed, core_list)
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    if mode == "exclusive":
        near = _gpu_near_shares(_physical_cores(topology, pool), gpu_nodes)
        if near is None:
            raise BindingError("--numa-binding exclusive: a GPU's NUMA node has fewer whole cores than the ranks it "
                               "hosts; use --numa-binding node")
        return tuple(_rank_binding(share, node_of) for share in near)
    if mode == "core-complex":
        return _core_complex(topology, pool, [n for n in gpu_nodes if n is not None], cache_groups or {})
    package_of_node = {cpu.numa_node: cpu.package for cpu in topology.cpus if cpu.numa_node is not None}
    bindings = []
    for node in (n for n in gpu_nodes if n is not None):  # every one, as checked above
        if mode == "node":
            cpus = [cpu.id for cpu in topology.cpus if cpu.numa_node == node and cpu.id in pool]
        else:  # socket
            package = package_of_node.get(node)
            cpus = [cpu.id for cpu in topology.cpus if cpu.package == package and cpu.id in pool]
        if not cpus:
            raise BindingError(f"--numa-binding {mode}: NUMA node {node} has no CPU this agent may use")
        bindings.append(_rank_binding(cpus, node_of))
    return tuple(bindings)


def _core_complex(topology: Topology, pool: frozenset[int], gpu_nodes: Sequence[int],
                  cache_groups: Mapping[int, int]) -> tuple[RankBinding, ...]:
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    dealt: dict[int, int] = {}
    bindings = []
    for node in gpu_nodes:  # local rank order: the n-th rank on a node gets its n-th cache, round robin
        caches: dict[int, list[int]] = {}
        for cpu in topology.cpus:
            if cpu.numa_node == node and cpu.id in pool:
                caches.setdefault(cache_groups.get(cpu.id, cpu.id), []).append(cpu.id)
        if not caches:
            raise BindingError(f"--numa-binding core-complex: NUMA node {node} has no CPU this agent may use")
        ordered = sorted(caches.items(), key=lambda item: (-len(item[1]), item[0]))
        index = dealt.get(node, 0)
        dealt[node] = index + 1
        bindings.append(_rank_binding(ordered[index % len(ordered)][1], node_of))
    return tuple(bindings)


def _physical_cores(topology: Topology, pool: frozenset[int]) -> list[_Core]:
    """Group the pool into physical cores, ordered by NUMA node, then by CPU id."""
    known = {cpu.id: cpu for cpu in topology.cpus}
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    groups: dict[tuple[int | None, int], list[int]] = {}
    for cpu_id in sorted(pool):
        cpu = known.get(cpu_id)
        # (None, id) cannot collide with a real (package, core) key: an undescribed CPU is its own core.
        key = (cpu.package, cpu.core) if cpu is not None else (None, cpu_id)
        groups.setdefault(key, []).append(cpu_id)
    cores = [_Core(tuple(cpus), _common_node(cpus, node_of)) for cpus in groups.values()]
    return sorted(cores, key=_core_order)


def _core_order(core: _Core) -> tuple[bool, int, int]:
    # Known nodes in ascending order, unknown last; inside a node, by first CPU id (DeepSpeed's contiguous order).
    return (core.numa_node is None, core.numa_node or 0, core.cpus[0])


def _common_node(cpus: Iterable[int], node_of: Mapping[int, int | None]) -> int | None:
    nodes = {node_of.get(cpu) for cpu in cpus}
    return nodes.pop() if len(nodes) == 1 else None


def _whole_core_shares(cores: Sequence[_Core], n_ranks: int, size: int) -> list[list[int]]:
    """Give each rank ``size`` whole cores, inside one NUMA node where a node has room for a whole share."""
    local: list[list[_Core]] = []
    leftover: list[_Core] = []
    for node_cores in _runs_by_node(cores):
        fits = min(len(node_cores) // size, n_ranks - len(local))
        local.extend(node_cores[i * size : (i + 1) * size] for i in range(fits))
        leftover.extend(node_cores[fits * size :])
    # Shares that fit in no single node take the leftover cores contiguously, spanning nodes.
    spanning = [leftover[i * size : (i + 1) * size] for i in range(n_ranks - len(local))]
    # Local rank order follows CPU order (rank 0 on the first node), as GPUs are usually numbered that way too.
    chunks = sorted(local + spanning, key=lambda chunk: _core_order(chunk[0]))
    # Equal CPU counts: every rank has `size` first threads, and as many siblings as the poorest rank has.
    siblings = min(sum(len(core.cpus) - 1 for core in chunk) for chunk in chunks)
    return [_first_threads_first(chunk)[: size + siblings] for chunk in chunks]


def _gpu_near_shares(cores: Sequence[_Core], gpu_nodes: Sequence[int | None]) -> list[list[int]] | None:
    """Each rank's share from its GPU's NUMA node (issue 13): the same number of whole cores for every rank, as
    many as the most crowded node allows. None when a node is unknown or has fewer cores than ranks."""
    if any(node is None for node in gpu_nodes):
        return None
    on_node = {node: [c for c in cores if c.numa_node == node] for node in set(gpu_nodes)}
    size = min(len(on_node[node]) // gpu_nodes.count(node) for node in on_node)
    if size < 1:
        return None
    dealt = dict.fromkeys(on_node, 0)
    chunks = []
    for node in gpu_nodes:  # local rank order
        chunks.append(on_node[node][dealt[node] * size : (dealt[node] + 1) * size])
        dealt[node] += 1
    siblings = min(sum(len(core.cpus) - 1 for core in chunk) for chunk in chunks)
    return [_first_threads_first(chunk)[: size + siblings] for chunk in chunks]


def _runs_by_node(cores: Sequence[_Core]) -> list[list[_Core]]:
    """Consecutive cores of the same NUMA node (``cores`` is sorted by node, so one run per node)."""
    runs: list[list[_Core]] = []
    for core in cores:
        if runs and runs[-1][0].numa_node == core.numa_node:
            runs[-1].append(core)
        else:
            runs.append([core])
    return runs


def _shared_core_shares(cores: Sequence[_Core], n_ranks: int) -> list[list[int]]:
    """More ranks than cores: deal CPUs first threads first, so ranks share a core only once all are taken."""
    cpus = _first_threads_first(cores)
    size = len(cpus) // n_ranks
    return [cpus[i * size : (i + 1) * size] for i in range(n_ranks)]


def _first_threads_first(cores: Sequence[_Core]) -> list[int]:
    """Every core's first CPU, then every core's second CPU, and so on (physical cores before SMT siblings)."""
    depth = max((len(core.cpus) for core in cores), default=0)
    return [core.cpus[level] for level in range(depth) for core in cores if level < len(core.cpus)]


def _rank_binding(cpus: Iterable[int], node_of: Mapping[int, int | None]) -> RankBinding:
    ordered = tuple(sorted(cpus))
    return RankBinding(cpus=ordered, numa_node=_common_node(ordered, node_of))


def binding_note(bindings: Sequence[RankBinding], pool: frozenset[int]) -> str | None:
    """Say which CPUs of the pool no rank got, and why; ``None`` when every CPU is used."""
    used = {cpu for binding in bindings for cpu in binding.cpus}
    unused = pool - used
    if not bindings or not unused:
        return None
    return (
        f"CPUs {format_cpus(unused)} left unused: {len(bindings)} ranks get equal shares of whole cores, "
        f"{len(bindings[0].cpus)} of the {len(pool)} CPUs each"
    )


# ---------------------------------------------------------------------------------------------------------------
# What a bound rank runs with.


def check_binding_env(user_env: Mapping[str, str]) -> None:
    """Refuse to bind when Intel OpenMP's own pinning is on: it would silently override ours."""
    if "KMP_AFFINITY" in user_env:
        raise BindingError(
            f"KMP_AFFINITY is set ({user_env['KMP_AFFINITY']!r}); it overrides xrun's binding: "
            "run 'unset KMP_AFFINITY' or drop --bind_cores_to_rank"
        )


def binding_env(binding: RankBinding, user_env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to a bound rank's environment: ``OMP_NUM_THREADS``, unless the user set it."""
    check_binding_env(user_env)
    if "OMP_NUM_THREADS" in user_env:
        return {}
    # One OpenMP thread per CPU of the rank: more would time-share them, fewer would leave some idle.
    return {"OMP_NUM_THREADS": str(len(binding.cpus))}


def numactl_argv(binding: RankBinding, argv: Sequence[str], numactl_path: str) -> tuple[str, ...]:
    """``numactl --physcpubind=CPUS [--membind=NODE] -- ARGV``; memory is bound only when the CPUs share a node."""
    command = [numactl_path, f"--physcpubind={format_cpus(binding.cpus)}"]
    if binding.numa_node is not None:
        command.append(f"--membind={binding.numa_node}")
    # "--" ends numactl's options, so a program whose name or first argument starts with "-" is not eaten.
    return (*command, "--", *argv)


def find_numactl() -> str | None:
    """The numactl binary on PATH, or ``None`` (the agent then binds by CPU affinity alone, without memory)."""
    return shutil.which("numactl")


# ---------------------------------------------------------------------------------------------------------------
# Reading the topology: the only I/O here. Every file is optional; what is missing falls back to "no SMT
# sharing, no NUMA information" rather than failing, since containers and some VMs hide parts of /sys.


@dataclass(frozen=True)
class _RawCpu:
    package: int
    core_id: int | None
    siblings: frozenset[int] | None


def read_topology(sys_root: str = "/sys") -> Topology:
    """Read the online CPUs' package, core and NUMA node from ``SYS_ROOT/devices/system/{cpu,node}``."""
    cpu_dir = os.path.join(sys_root, "devices", "system", "cpu")
    online = _online_cpus(cpu_dir)
    raw = {cpu: _read_raw_cpu(os.path.join(cpu_dir, f"cpu{cpu}", "topology")) for cpu in sorted(online)}
    cores = _core_numbers(raw)
    node_of = _numa_nodes(os.path.join(sys_root, "devices", "system", "node"))
    return Topology(tuple(Cpu(cpu, info.package, cores[cpu], node_of.get(cpu)) for cpu, info in raw.items()))


def read_cache_groups(sys_root: str = "/sys") -> dict[int, int]:
    """Online CPU -> the first CPU that shares its last-level cache (the highest-level data or unified cache in
    ``cpuN/cache/index*``), as torch's core-complex binding reads them; a CPU without cache information is left out."""
    cpu_dir = os.path.join(sys_root, "devices", "system", "cpu")
    groups: dict[int, int] = {}
    for cpu in sorted(_online_cpus(cpu_dir)):
        cache_dir = os.path.join(cpu_dir, f"cpu{cpu}", "cache")
        best: tuple[int, frozenset[int]] | None = None
        for index in _numbered_entries(cache_dir, "index"):
            entry = os.path.join(cache_dir, f"index{index}")
            level = _read_int(os.path.join(entry, "level"))
            shared = _read_cpulist(os.path.join(entry, "shared_cpu_list"))
            if _read_text(os.path.join(entry, "type")) not in ("Unified", "Data") or level is None or not shared:
                continue
            if best is None or level > best[0]:
                best = (level, shared)
        if best is not None:
            groups[cpu] = min(best[1])
    return groups


def _online_cpus(cpu_dir: str) -> frozenset[int]:
    # Offline CPUs keep their cpuN directory but lose topology/; "online" is the authoritative list.
    online = _read_cpulist(os.path.join(cpu_dir, "online"))
    if online is not None:
        return online
    return frozenset(_numbered_entries(cpu_dir, "cpu"))


def _read_raw_cpu(topology_dir: str) -> _RawCpu:
    package = _read_int(os.path.join(topology_dir, "physical_package_id"))
    return _RawCpu(
        package=package if package is not None else 0,
        core_id=_read_int(os.path.join(topology_dir, "core_id")),
        siblings=_read_cpulist(os.path.join(topology_dir, "thread_siblings_list")),
    )


def _core_numbers(raw: Mapping[int, _RawCpu]) -> dict[int, int]:
    """Each CPU's core number: the kernel's core_id when it groups SMT siblings right, else the lowest sibling.

    core_id is not always a core's identity: multi-die parts repeat it on every die of a package, and some VMs
    report 0 everywhere; thread_siblings_list is the ground truth for which CPUs share a core.
    """
    online = frozenset(raw)
    by_core_id: dict[tuple[int, int], set[int]] = {}
    for cpu, info in raw.items():
        if info.core_id is not None:
            by_core_id.setdefault((info.package, info.core_id), set()).add(cpu)
    trusted = all(
        info.core_id is not None
        and (info.siblings is None or by_core_id[(info.package, info.core_id)] == info.siblings & online)
        for info in raw.values()
    )
    if trusted:
        return {cpu: info.core_id for cpu, info in raw.items() if info.core_id is not None}
    # Without core_id or siblings a CPU is taken as its own core: never group CPUs that may not share one.
    return {cpu: min((info.siblings or frozenset()) & online or {cpu}) for cpu, info in raw.items()}


def _numa_nodes(node_dir: str) -> dict[int, int]:
    """CPU id -> NUMA node, from nodeN/cpulist; empty when the kernel has no NUMA support compiled in."""
    node_of: dict[int, int] = {}
    for node in _numbered_entries(node_dir, "node"):
        for cpu in _read_cpulist(os.path.join(node_dir, f"node{node}", "cpulist")) or ():
            node_of[cpu] = node
    return node_of


def _numbered_entries(directory: str, prefix: str) -> list[int]:
    pattern = re.compile(re.escape(prefix) + r"([0-9]+)")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(pattern.fullmatch, names) if m is not None)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeError):
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _read_cpulist(path: str) -> frozenset[int] | None:
    text = _read_text(path)
    if text is None:
        return None
    if not text:  # a node with memory but no CPUs has an empty cpulist
        return frozenset()
    try:
        return _parse_ranges(text)
    except ValueError:
        return None
