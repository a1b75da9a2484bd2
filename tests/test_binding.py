"""Core binding: the pure split on literal topologies, the /sys reader on fake trees, and real bound children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xrun.common.ranks.binding import (
    Cpu,
    RankBinding,
    Topology,
    binding_env,
    binding_note,
    binding_pool,
    check_binding_env,
    find_numactl,
    format_cpus,
    numactl_argv,
    parse_cpu_list,
    plan_binding,
    read_topology,
)
from xrun.errors import BindingError

# ---------------------------------------------------------------------------------------------------------------
# Literal topologies.

# 2 sockets x 8 cores, SMT2, numbered the Linux way: cpu N and N+16 are siblings; socket s = NUMA node s.
TWO_SOCKETS_SMT = Topology(
    tuple(Cpu(cpu, package=(cpu % 16) // 8, core=cpu % 8, numa_node=(cpu % 16) // 8) for cpu in range(32))
)
# 1 socket x 8 cores, no SMT.
EIGHT_CORES = Topology(tuple(Cpu(cpu, package=0, core=cpu, numa_node=0) for cpu in range(8)))
# 1 socket x 4 cores, SMT2 numbered with siblings adjacent (cpu 2k and 2k+1 share core k), as some BIOSes do.
ADJACENT_SMT = Topology(tuple(Cpu(cpu, package=0, core=cpu // 2, numa_node=0) for cpu in range(8)))
ALL_32 = frozenset(range(32))


def _span(text: str) -> frozenset[int]:
    return parse_cpu_list(text)


def _rendered(bindings: tuple[RankBinding, ...]) -> list[tuple[str, int | None]]:
    return [(format_cpus(b.cpus), b.numa_node) for b in bindings]


PLAN_CASES = [
    # (id, topology, n_ranks, allowed, core_list, expected [(cpus, numa_node)], expected note or None)
    ("2s-1rank-spans", TWO_SOCKETS_SMT, 1, ALL_32, None, [("0-31", None)], None),
    ("2s-2ranks", TWO_SOCKETS_SMT, 2, ALL_32, None, [("0-7,16-23", 0), ("8-15,24-31", 1)], None),
    (
        "2s-4ranks",
        TWO_SOCKETS_SMT,
        4,
        ALL_32,
        None,
        [("0-3,16-19", 0), ("4-7,20-23", 0), ("8-11,24-27", 1), ("12-15,28-31", 1)],
        None,
    ),
    (
        "2s-8ranks",
        TWO_SOCKETS_SMT,
        8,
        ALL_32,
        None,
        [
            ("0-1,16-17", 0),
            ("2-3,18-19", 0),
            ("4-5,20-21", 0),
            ("6-7,22-23", 0),
            ("8-9,24-25", 1),
            ("10-11,26-27", 1),
            ("12-13,28-29", 1),
            ("14-15,30-31", 1),
        ],
        None,
    ),
    (
        "2s-16ranks-one-core-each",
        TWO_SOCKETS_SMT,
        16,
        ALL_32,
        None,
        [(f"{c},{c + 16}", c // 8) for c in range(16)],
        None,
    ),
    (
        # 5 cores each: one share fits in each node, the third cannot and spans both; core 15 (15,31) is left over.
        "2s-3ranks-one-spans",
        TWO_SOCKETS_SMT,
        3,
        ALL_32,
        None,
        [("0-4,16-20", 0), ("5-7,13-14,21-23,29-30", None), ("8-12,24-28", 1)],
        "CPUs 15,31 left unused: 3 ranks get equal shares of whole cores, 10 of the 32 CPUs each",
    ),
    (
        # More ranks than physical cores: first threads first, then the siblings.
        "2s-17ranks-share-cores",
        TWO_SOCKETS_SMT,
        17,
        ALL_32,
        None,
        [(str(c), c // 8) for c in range(16)] + [("16", 0)],
        "CPUs 17-31 left unused: 17 ranks get equal shares of whole cores, 1 of the 32 CPUs each",
    ),
    ("2s-32ranks", TWO_SOCKETS_SMT, 32, ALL_32, None, [(str(c), (c % 16) // 8) for c in range(32)], None),
    (
        "8cores-3ranks-remainder-unused",
        EIGHT_CORES,
        3,
        frozenset(range(8)),
        None,
        [("0-1", 0), ("2-3", 0), ("4-5", 0)],
        "CPUs 6-7 left unused: 3 ranks get equal shares of whole cores, 2 of the 8 CPUs each",
    ),
    # Affinity masks that are real CPU ids, not 0..P-1, crossing the NUMA boundary at CPU 8.
    ("mask-4-11-2ranks", TWO_SOCKETS_SMT, 2, _span("4-11"), None, [("4-7", 0), ("8-11", 1)], None),
    ("mask-4-11-1rank-spans", TWO_SOCKETS_SMT, 1, _span("4-11"), None, [("4-11", None)], None),
    (
        "mask-4-11-3ranks",
        TWO_SOCKETS_SMT,
        3,
        _span("4-11"),
        None,
        [("4-5", 0), ("6-7", 0), ("8-9", 1)],
        "CPUs 10-11 left unused: 3 ranks get equal shares of whole cores, 2 of the 8 CPUs each",
    ),
    (
        "mask-4-11+siblings-2ranks",
        TWO_SOCKETS_SMT,
        2,
        _span("4-11,20-27"),
        None,
        [("4-7,20-23", 0), ("8-11,24-27", 1)],
        None,
    ),
    (
        # Siblings only for cores 0-3: rank 1 has none, so rank 0 gets none either (equal OMP_NUM_THREADS).
        "mask-uneven-siblings",
        TWO_SOCKETS_SMT,
        2,
        _span("0-7,16-19"),
        None,
        [("0-3", 0), ("4-7", 0)],
        "CPUs 16-19 left unused: 2 ranks get equal shares of whole cores, 4 of the 12 CPUs each",
    ),
    ("core-list-2ranks", TWO_SOCKETS_SMT, 2, ALL_32, "0-3,8-11", [("0-3", 0), ("8-11", 1)], None),
    (
        "core-list-inside-mask",
        TWO_SOCKETS_SMT,
        2,
        _span("0-11"),
        "2-5",
        [("2-3", 0), ("4-5", 0)],
        None,
    ),
    ("adjacent-smt-2ranks", ADJACENT_SMT, 2, frozenset(range(8)), None, [("0-3", 0), ("4-7", 0)], None),
    (
        "adjacent-smt-8ranks-first-threads-first",
        ADJACENT_SMT,
        8,
        frozenset(range(8)),
        None,
        [("0", 0), ("2", 0), ("4", 0), ("6", 0), ("1", 0), ("3", 0), ("5", 0), ("7", 0)],
        None,
    ),
    # /sys told us nothing: every allowed CPU is its own core, NUMA node unknown.
    ("no-topology", Topology(()), 3, frozenset({3, 5, 9}), None, [("3", None), ("5", None), ("9", None)], None),
]


@pytest.mark.parametrize(
    ("topology", "n_ranks", "allowed", "core_list", "expected", "note"),
    [case[1:] for case in PLAN_CASES],
    ids=[case[0] for case in PLAN_CASES],
)
def test_plan_binding(topology, n_ranks, allowed, core_list, expected, note):
    bindings = plan_binding(topology, n_ranks, allowed, core_list)
    assert _rendered(bindings) == expected
    assert binding_note(bindings, binding_pool(allowed, core_list)) == note


def test_plan_binding_returns_rank_bindings():
    assert plan_binding(EIGHT_CORES, 2, frozenset({1, 2, 5, 6})) == (
        RankBinding(cpus=(1, 2), numa_node=0),
        RankBinding(cpus=(5, 6), numa_node=0),
    )


PLAN_ERRORS = [
    (
        "more-ranks-than-cpus",
        EIGHT_CORES,
        3,
        frozenset({0, 1}),
        None,
        "core binding: 3 local ranks need at least 3 CPUs, but only 2 are available (0-1); "
        "start fewer ranks or drop --bind_cores_to_rank",
    ),
    (
        "more-ranks-than-listed",
        TWO_SOCKETS_SMT,
        5,
        ALL_32,
        "0-3",
        "core binding: 5 local ranks need at least 5 CPUs, but only 4 are available (0-3); "
        "start fewer ranks or drop --bind_cores_to_rank",
    ),
    (
        "listed-not-allowed",
        TWO_SOCKETS_SMT,
        2,
        _span("0-7"),
        "0-3,8-11",
        "core binding: --bind_core_list '0-3,8-11': CPUs 8-11 are outside this agent's CPU affinity (0-7); "
        "list only those, or widen the affinity (taskset, cgroup cpuset)",
    ),
    (
        "zero-ranks",
        EIGHT_CORES,
        0,
        frozenset(range(8)),
        None,
        "core binding: cannot bind 0 local ranks; need at least one",
    ),
    (
        "bad-core-list",
        EIGHT_CORES,
        2,
        frozenset(range(8)),
        "3-1",
        "core binding: --bind_core_list '3-1': range 3-1 runs backwards (write 1-3); "
        "expected CPU ids and low-high ranges, e.g. 0-3,8-11",
    ),
]


@pytest.mark.parametrize(
    ("topology", "n_ranks", "allowed", "core_list", "message"),
    [case[1:] for case in PLAN_ERRORS],
    ids=[case[0] for case in PLAN_ERRORS],
)
def test_plan_binding_errors(topology, n_ranks, allowed, core_list, message):
    with pytest.raises(BindingError) as info:
        plan_binding(topology, n_ranks, allowed, core_list)
    assert str(info.value) == message


# ---------------------------------------------------------------------------------------------------------------
# --bind_core_list parsing and formatting.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", {0}),
        ("3-3", {3}),
        ("0-3,8-11", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("8-11,0-3", {0, 1, 2, 3, 8, 9, 10, 11}),
        ("0-3,2-5", {0, 1, 2, 3, 4, 5}),
        ("1,1", {1}),
        (" 0-1 , 4 ", {0, 1, 4}),
        ("007", {7}),
        ("65535", {65535}),
    ],
)
def test_parse_cpu_list(text, expected):
    assert parse_cpu_list(text) == frozenset(expected)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty item"),
        ("  ", "empty item"),
        ("1,,2", "empty item"),
        ("1,", "empty item"),
        (",1", "empty item"),
        ("a", "'a' is not a CPU id or a range"),
        ("-1", "'-1' is not a CPU id or a range"),
        ("1-", "'1-' is not a CPU id or a range"),
        ("1-2-3", "'1-2-3' is not a CPU id or a range"),
        ("0x1", "'0x1' is not a CPU id or a range"),
        ("1.5", "'1.5' is not a CPU id or a range"),
        ("+1", "'+1' is not a CPU id or a range"),
        ("1 2", "'1 2' is not a CPU id or a range"),
        ("0;3", "'0;3' is not a CPU id or a range"),
        ("\u0663", "'\u0663' is not a CPU id or a range"),  # ARABIC-INDIC DIGIT THREE: int() would take it
        ("3-1", "range 3-1 runs backwards (write 1-3)"),
        ("65536", "CPU id 65536 is above 65535"),
        ("0-99999999", "CPU id 99999999 is above 65535"),
    ],
)
def test_parse_cpu_list_rejects(text, reason):
    with pytest.raises(BindingError) as info:
        parse_cpu_list(text)
    message = str(info.value)
    assert message == (
        f"core binding: --bind_core_list {text!r}: {reason}; expected CPU ids and low-high ranges, e.g. 0-3,8-11"
    )
    assert "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ((), ""),
        ((3,), "3"),
        ((0, 1), "0-1"),
        ((0, 1, 2, 3, 8, 9, 10, 11), "0-3,8-11"),
        ((5, 1, 3), "1,3,5"),
        ((2, 2, 3), "2-3"),
        ((0, 16), "0,16"),
    ],
)
def test_format_cpus(cpus, text):
    assert format_cpus(cpus) == text


@given(st.sets(st.integers(0, 300), min_size=1))
def test_format_then_parse_round_trips(cpus):
    assert parse_cpu_list(format_cpus(cpus)) == frozenset(cpus)


# ---------------------------------------------------------------------------------------------------------------
# Environment and numactl.


def test_kmp_affinity_is_refused_with_the_fix():
    env = {"KMP_AFFINITY": "granularity=fine,compact,1,0"}
    expected = (
        "core binding: KMP_AFFINITY is set ('granularity=fine,compact,1,0'); it overrides xrun's binding: "
        "run 'unset KMP_AFFINITY' or drop --bind_cores_to_rank"
    )
    with pytest.raises(BindingError) as info:
        check_binding_env(env)
    assert str(info.value) == expected
    with pytest.raises(BindingError) as info:
        binding_env(RankBinding((0, 1), 0), env)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("cpus", "user_env", "expected"),
    [
        ((0, 1, 2, 3), {}, {"OMP_NUM_THREADS": "4"}),
        ((0, 16), {"PATH": "/bin"}, {"OMP_NUM_THREADS": "2"}),
        ((0, 1, 2, 3), {"OMP_NUM_THREADS": "7"}, {}),
        ((0, 1, 2, 3), {"OMP_NUM_THREADS": ""}, {}),  # set, even if empty: the user's choice
    ],
)
def test_binding_env(cpus, user_env, expected):
    assert binding_env(RankBinding(cpus, 0), user_env) == expected


@pytest.mark.parametrize(
    ("binding", "expected"),
    [
        (
            RankBinding((0, 1, 2, 3), 0),
            ("/usr/bin/numactl", "--physcpubind=0-3", "--membind=0", "--", "python", "-u", "train.py"),
        ),
        (
            RankBinding((5, 6, 7, 13, 14), None),
            ("/usr/bin/numactl", "--physcpubind=5-7,13-14", "--", "python", "-u", "train.py"),
        ),
        (
            RankBinding((8, 9, 10, 11, 24, 25, 26, 27), 1),
            ("/usr/bin/numactl", "--physcpubind=8-11,24-27", "--membind=1", "--", "python", "-u", "train.py"),
        ),
    ],
)
def test_numactl_argv(binding, expected):
    assert numactl_argv(binding, ["python", "-u", "train.py"], "/usr/bin/numactl") == expected


def test_numactl_argv_keeps_weird_arguments_as_they_are():
    weird = ["-x", "a'; echo foo", "a\n0", "--physcpubind=9"]
    assert numactl_argv(RankBinding((2,), None), weird, "numactl") == ("numactl", "--physcpubind=2", "--", *weird)


# ---------------------------------------------------------------------------------------------------------------
# read_topology on fake /sys trees.

# 2 sockets x 2 cores x SMT2 = 8 CPUs numbered the Linux way (cpu N and N+4 are siblings), one node per socket.
FAKE_SYS = {
    "devices/system/cpu/online": "0-7\n",
    **{
        f"devices/system/cpu/cpu{cpu}/topology/{name}": value
        for cpu, package, core, siblings in [
            (0, 0, 0, "0,4"),
            (1, 0, 1, "1,5"),
            (2, 1, 0, "2,6"),
            (3, 1, 1, "3,7"),
            (4, 0, 0, "0,4"),
            (5, 0, 1, "1,5"),
            (6, 1, 0, "2,6"),
            (7, 1, 1, "3,7"),
        ]
        for name, value in [
            ("physical_package_id", f"{package}\n"),
            ("core_id", f"{core}\n"),
            ("thread_siblings_list", f"{siblings}\n"),
        ]
    },
    "devices/system/node/online": "0-1\n",
    "devices/system/node/node0/cpulist": "0-1,4-5\n",
    "devices/system/node/node1/cpulist": "2-3,6-7\n",
}
FAKE_TOPOLOGY = Topology(
    (
        Cpu(0, package=0, core=0, numa_node=0),
        Cpu(1, package=0, core=1, numa_node=0),
        Cpu(2, package=1, core=0, numa_node=1),
        Cpu(3, package=1, core=1, numa_node=1),
        Cpu(4, package=0, core=0, numa_node=0),
        Cpu(5, package=0, core=1, numa_node=0),
        Cpu(6, package=1, core=0, numa_node=1),
        Cpu(7, package=1, core=1, numa_node=1),
    )
)


def _write_tree(root: Path, files: dict[str, str]) -> str:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return str(root)


def _without(files: dict[str, str], *prefixes: str) -> dict[str, str]:
    return {path: text for path, text in files.items() if not path.startswith(prefixes)}


def test_read_topology_fake_tree(tmp_path):
    topology = read_topology(_write_tree(tmp_path, FAKE_SYS))
    assert topology == FAKE_TOPOLOGY
    assert _rendered(plan_binding(topology, 2, frozenset(range(8)))) == [("0-1,4-5", 0), ("2-3,6-7", 1)]


def test_read_topology_without_numa_nodes(tmp_path):
    topology = read_topology(_write_tree(tmp_path, _without(FAKE_SYS, "devices/system/node")))
    assert topology == Topology(tuple(Cpu(c.id, c.package, c.core, None) for c in FAKE_TOPOLOGY.cpus))
    # Same whole-core split, but no node to bind memory to.
    assert _rendered(plan_binding(topology, 2, frozenset(range(8)))) == [("0-1,4-5", None), ("2-3,6-7", None)]


def test_read_topology_memory_only_node_and_no_online_file(tmp_path):
    files = {
        **_without(FAKE_SYS, "devices/system/cpu/online"),
        "devices/system/node/node2/cpulist": "\n",  # CXL / HBM memory without CPUs
    }
    assert read_topology(_write_tree(tmp_path, files)) == FAKE_TOPOLOGY


def test_read_topology_repeated_core_ids_fall_back_to_siblings(tmp_path):
    # Multi-die parts (and some VMs) repeat core_id inside a package; thread_siblings_list still tells the truth.
    files = {path: ("0\n" if path.endswith("/core_id") else text) for path, text in FAKE_SYS.items()}
    topology = read_topology(_write_tree(tmp_path, files))
    assert [(c.id, c.package, c.core) for c in topology.cpus] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 2),
        (3, 1, 3),
        (4, 0, 0),
        (5, 0, 1),
        (6, 1, 2),
        (7, 1, 3),
    ]
    assert _rendered(plan_binding(topology, 4, frozenset(range(8)))) == [
        ("0,4", 0),
        ("1,5", 0),
        ("2,6", 1),
        ("3,7", 1),
    ]


def test_read_topology_offline_cpu_is_left_out(tmp_path):
    # cpu3 is offline: its directory stays but loses topology/; its sibling cpu7 becomes a core of its own.
    files = {**_without(FAKE_SYS, "devices/system/cpu/cpu3/"), "devices/system/cpu/online": "0-2,4-7\n"}
    (tmp_path / "devices/system/cpu/cpu3").mkdir(parents=True)
    topology = read_topology(_write_tree(tmp_path, files))
    assert [c.id for c in topology.cpus] == [0, 1, 2, 4, 5, 6, 7]
    assert Cpu(7, package=1, core=1, numa_node=1) in topology.cpus


def test_read_topology_without_topology_files(tmp_path):
    # Only cpuN directories: each CPU is taken as its own core in package 0 (never group what may not share).
    for cpu in range(3):
        (tmp_path / f"devices/system/cpu/cpu{cpu}").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/cpufreq").mkdir()
    assert read_topology(str(tmp_path)) == Topology(tuple(Cpu(c, package=0, core=c, numa_node=None) for c in range(3)))


def test_read_topology_garbage_files_fall_back(tmp_path):
    files = {
        path: ("??\n" if path.endswith(("/core_id", "/thread_siblings_list")) else text)
        for path, text in FAKE_SYS.items()
    }
    files["devices/system/node/node1/cpulist"] = "x\n"
    topology = read_topology(_write_tree(tmp_path, files))
    assert topology == Topology(
        tuple(Cpu(c.id, c.package, c.id, 0 if c.numa_node == 0 else None) for c in FAKE_TOPOLOGY.cpus)
    )


def test_read_topology_empty_root(tmp_path):
    assert read_topology(str(tmp_path)) == Topology(())
    assert plan_binding(Topology(()), 2, frozenset({0, 1})) == (RankBinding((0,), None), RankBinding((1,), None))


def test_read_topology_on_this_machine():
    topology = read_topology()
    allowed = frozenset(os.sched_getaffinity(0))
    assert allowed <= {cpu.id for cpu in topology.cpus}
    assert len({cpu.id for cpu in topology.cpus}) == len(topology.cpus)
    (everything,) = plan_binding(topology, 1, allowed)
    assert set(everything.cpus) == allowed


# ---------------------------------------------------------------------------------------------------------------
# Properties over random topologies, masks and rank counts.


@st.composite
def topologies(draw) -> Topology:
    packages = draw(st.integers(1, 3))
    cores = draw(st.integers(1, 6))
    threads = draw(st.integers(1, 4))
    nodes_per_package = draw(st.integers(0, 2))  # 0: the kernel exposes no NUMA nodes
    slots = [(t, p, c) for t in range(threads) for p in range(packages) for c in range(cores)]  # Linux order
    numbering = draw(st.sampled_from(["linux", "adjacent", "shuffled"]))
    if numbering == "adjacent":
        slots.sort(key=lambda slot: (slot[1], slot[2], slot[0]))
    ids = list(range(len(slots)))
    if numbering == "shuffled":
        ids = draw(st.permutations(range(len(slots) + 8)))[: len(slots)]

    def node(package: int, core: int) -> int | None:
        return package * nodes_per_package + core * nodes_per_package // cores if nodes_per_package else None

    return Topology(tuple(Cpu(cpu, package=p, core=c, numa_node=node(p, c)) for cpu, (_, p, c) in zip(ids, slots)))


@st.composite
def binding_requests(draw):
    topology = draw(topologies())
    known = sorted(cpu.id for cpu in topology.cpus)
    # A few ids the topology does not describe (hot-added CPUs, a /sys that hides them).
    candidates = known + [max(known) + 1 + i for i in range(3)]
    allowed = frozenset(draw(st.sets(st.sampled_from(candidates), min_size=1)))
    core_list = draw(
        st.one_of(
            st.none(),
            st.sets(st.sampled_from(candidates), min_size=1).map(format_cpus),
            st.text(alphabet="0123456789-, a", max_size=8),
        )
    )
    n_ranks = draw(st.integers(1, len(candidates) + 2))
    return topology, n_ranks, allowed, core_list


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(binding_requests())
def test_plan_binding_properties(request):
    topology, n_ranks, allowed, core_list = request
    try:
        pool = binding_pool(allowed, core_list)
    except BindingError:
        with pytest.raises(BindingError):
            plan_binding(topology, n_ranks, allowed, core_list)
        return
    if n_ranks > len(pool):
        with pytest.raises(BindingError, match=f"{n_ranks} local ranks need at least {n_ranks} CPUs"):
            plan_binding(topology, n_ranks, allowed, core_list)
        return

    bindings = plan_binding(topology, n_ranks, allowed, core_list)

    assert len(bindings) == n_ranks
    sizes = {len(b.cpus) for b in bindings}
    assert len(sizes) == 1 and sizes.pop() >= 1, "every rank gets the same, non-zero number of CPUs"
    given_out = [cpu for b in bindings for cpu in b.cpus]
    assert len(given_out) == len(set(given_out)), "no CPU is given twice"
    assert set(given_out) <= pool <= allowed, "every CPU is in the pool and allowed"
    assert all(list(b.cpus) == sorted(b.cpus) for b in bindings)

    by_id = {cpu.id: cpu for cpu in topology.cpus}
    for b in bindings:
        nodes = {by_id[c].numa_node if c in by_id else None for c in b.cpus}
        assert b.numa_node == (nodes.pop() if len(nodes) == 1 else None), "numa_node only when all CPUs share it"

    # Whole physical cores: with at least one core per rank, no core is split between two ranks, and every
    # rank gets its even share of cores.
    def core_of(cpu: int) -> tuple[int | None, int]:
        return (by_id[cpu].package, by_id[cpu].core) if cpu in by_id else (None, cpu)

    n_cores = len({core_of(cpu) for cpu in pool})
    if n_cores >= n_ranks:
        owners: dict[tuple[int | None, int], int] = {}
        for rank, b in enumerate(bindings):
            for cpu in b.cpus:
                assert owners.setdefault(core_of(cpu), rank) == rank, "a physical core is shared by two ranks"
            assert len({core_of(cpu) for cpu in b.cpus}) == n_cores // n_ranks

    note = binding_note(bindings, pool)
    assert (note is None) == (len(given_out) == len(pool))


# ---------------------------------------------------------------------------------------------------------------
# Real children: the binding is what the child actually runs with.

AFFINITY_CHILD = (
    "import json, os; "
    "print(json.dumps({'cpus': sorted(os.sched_getaffinity(0)), 'omp': os.environ.get('OMP_NUM_THREADS')}))"
)


def _real_bindings(n_ranks: int) -> tuple[RankBinding, ...]:
    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < n_ranks:
        pytest.skip(f"needs {n_ranks} CPUs in the affinity mask, has {len(allowed)}")
    return plan_binding(read_topology(), n_ranks, allowed)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "KMP_AFFINITY")}


def _start_with_affinity(cpus: tuple[int, ...], argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    # What the agent does without numactl: the child inherits the mask the parent holds at fork time.
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
    finally:
        os.sched_setaffinity(0, saved)


def _report(child: subprocess.Popen[str]) -> dict:
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    return json.loads(out)


def test_real_children_run_with_their_binding_affinity():
    bindings = _real_bindings(2)
    before = os.sched_getaffinity(0)
    base = _clean_env()
    children = [
        _start_with_affinity(b.cpus, [sys.executable, "-c", AFFINITY_CHILD], {**base, **binding_env(b, base)})
        for b in bindings
    ]
    reports = [_report(child) for child in children]
    assert os.sched_getaffinity(0) == before, "the parent's own mask is restored"
    assert [r["cpus"] for r in reports] == [list(b.cpus) for b in bindings]
    assert [r["omp"] for r in reports] == [str(len(b.cpus)) for b in bindings]


@pytest.mark.skipif(find_numactl() is None, reason="numactl is not installed (apt-get install -y numactl)")
def test_real_children_run_under_numactl():
    bindings = _real_bindings(2)
    numactl = find_numactl()
    assert numactl is not None
    base = _clean_env()
    children = [
        subprocess.Popen(
            numactl_argv(b, [sys.executable, "-c", AFFINITY_CHILD], numactl),
            stdout=subprocess.PIPE,
            env={**base, **binding_env(b, base)},
            text=True,
        )
        for b in bindings
    ]
    reports = [_report(child) for child in children]
    assert [r["cpus"] for r in reports] == [list(b.cpus) for b in bindings]
