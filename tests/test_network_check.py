"""xrun check --network (issue 24): the round planner, the verdict rules, the coordinator over a fake prober,
interface selection over literal tables, the flags and bad input, and a real probe pair on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_layers import Level, cycles, import_edges, internal_graph
from xrun.common.network import interfaces, socket_ifname
from xrun.common.network.interfaces import Route, parse_routes, route_interface, select_interface
from xrun.common.spec import AgentOptions, NodeSpec
from xrun.errors import UsageError
from xrun.launch.network.probe_server import ProbeServer
from xrun.launch.network.tcp_probe import measure, reach
from xrun.runner.network import rounds
from xrun.runner.network.coordinate import REACH, Check, Request
from xrun.runner.network.node_verdicts import Figures, LinkVerdict, Probe, best_figures, blame, judge, pair_figures

# -- the round planner -------------------------------------------------------------------------------------------


def pairs_of(round_):
    return [pair for wave in round_ for pair in wave]


def covered(round_):
    """Every node that is in a pair of the round."""
    return {node for pair in pairs_of(round_) for node in pair}


def test_round_zero_pairs_neighbours():
    assert rounds.neighbour_round(4) == (((0, 1), (2, 3)),)
    assert rounds.neighbour_round(2) == (((0, 1),),)


def test_round_zero_odd_count_gives_the_last_node_a_wave_of_its_own():
    assert rounds.neighbour_round(5) == (((0, 1), (2, 3)), ((4, 0),))
    assert rounds.neighbour_round(3) == (((0, 1),), ((2, 0),))


def test_round_one_pairs_fastest_with_slowest():
    assert rounds.extremes_round([3, 1, 0, 2]) == (((3, 2), (1, 0)),)
    assert rounds.extremes_round([4, 0, 2, 1, 3]) == (((4, 3), (0, 1)), ((2, 4),))


@pytest.mark.parametrize("count", range(2, 40))
def test_every_node_is_in_both_rounds_and_waves_share_no_node(count):
    order = list(reversed(range(count)))
    for round_ in (rounds.neighbour_round(count), rounds.extremes_round(order)):
        assert covered(round_) == set(range(count))
        assert len(round_) <= 2  # a round costs at most two waves, whatever the count
        for wave in round_:
            nodes = [n for pair in wave for n in pair]
            assert len(nodes) == len(set(nodes))
        assert all(a != b for a, b in pairs_of(round_))


def test_one_node_is_not_a_round():
    with pytest.raises(ValueError):
        rounds.neighbour_round(1)


# -- verdicts -----------------------------------------------------------------------------------------------------


def test_pair_figures_are_the_worse_direction():
    there = Probe(0, 1, True, latency_ms=0.1, throughput_mbs=900.0)
    back = Probe(1, 0, True, latency_ms=0.3, throughput_mbs=2.0)
    assert pair_figures([there, back]) == Figures(0.3, 2.0)
    assert pair_figures([there, Probe(1, 0, False, error="refused")]) is None


def test_each_node_keeps_its_best():
    best = best_figures([((0, 1), Figures(0.3, 2.0)), ((0, 2), Figures(0.1, 800.0)), ((1, 2), None)])
    assert best == {0: Figures(0.1, 800.0), 1: Figures(0.3, 2.0), 2: Figures(0.1, 800.0)}


def test_slow_by_throughput_below_half_the_median():
    best = {0: Figures(0.1, 800.0), 1: Figures(0.1, 390.0), 2: Figures(0.1, 810.0), 3: Figures(0.1, 790.0)}
    verdicts = judge(best, {}, [0, 1, 2, 3])
    assert [verdicts[n].verdict for n in range(4)] == [LinkVerdict.OK, LinkVerdict.SLOW, LinkVerdict.OK, LinkVerdict.OK]
    assert "390.0 MB/s" in verdicts[1].reason
    best[1] = Figures(0.1, 401.0)  # 401 >= 0.5 x median 795: ok
    assert judge(best, {}, [0, 1, 2, 3])[1].verdict is LinkVerdict.OK


def test_slow_by_latency_above_twice_the_median_plus_the_floor():
    best = {0: Figures(1.0, 800.0), 1: Figures(7.5, 800.0), 2: Figures(1.0, 800.0)}
    assert judge(best, {}, [0, 1, 2])[1].verdict is LinkVerdict.SLOW  # 7.5 > 2 x 1 + 5
    best[1] = Figures(6.9, 800.0)
    assert judge(best, {}, [0, 1, 2])[1].verdict is LinkVerdict.OK


def test_unreachable_and_bare_nodes():
    best = {0: Figures(0.1, 800.0), 2: Figures(0.1, 800.0)}
    verdicts = judge(best, {1: "refuses connections"}, [0, 1, 2, 3])
    assert verdicts[1].verdict is LinkVerdict.UNREACHABLE and verdicts[1].reason == "refuses connections"
    assert verdicts[3].verdict is LinkVerdict.UNREACHABLE and "no pair" in verdicts[3].reason


def test_blame_asks_a_third_node():
    failure = Probe(0, 1, False, error="refused")
    assert set(blame(failure, Probe(2, 1, False, error="refused"), Probe(0, 2, True))) == {1}
    assert set(blame(failure, Probe(2, 1, True), Probe(0, 2, False, error="refused"))) == {0}
    assert set(blame(failure, None, None)) == {0, 1}


# -- the coordinator over a fake network --------------------------------------------------------------------------


class FakeNet:
    """Literal links: ``refuses`` nodes accept nothing, ``slow`` nodes receive at 1 MB/s."""

    def __init__(self, refuses=(), slow=(), mute=()):
        self.refuses, self.slow, self.mute = set(refuses), set(slow), set(mute)
        self.batches = []

    def run(self, requests):
        self.batches.append(list(requests))
        return [self._one(r) for r in requests]

    def _one(self, r: Request) -> Probe:
        if r.dst in self.refuses or r.src in self.mute:
            return Probe(r.src, r.dst, False, error="refused")
        rate = 1.0 if r.dst in self.slow else 800.0
        return Probe(r.src, r.dst, True, latency_ms=0.1, throughput_mbs=None if r.mode == REACH else rate)


def verdicts_of(net, count, down=None):
    outcome = Check(range(count), down).run(net)
    return {n: v.verdict.value for n, v in outcome.verdicts.items()}


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9, 32])
def test_a_healthy_network_is_all_ok(count):
    net = FakeNet()
    assert set(verdicts_of(net, count).values()) == {"ok"}
    assert len(net.batches) <= 8  # 2 rounds x 2 waves x 2 directions, whatever the count


@pytest.mark.parametrize("count,bad", [(3, 1), (3, 2), (4, 0), (5, 4), (8, 3), (9, 8)])
def test_one_slow_node_is_named_and_no_other(count, bad):
    got = verdicts_of(FakeNet(slow=[bad]), count)
    assert got == {n: "slow" if n == bad else "ok" for n in range(count)}


@pytest.mark.parametrize("count,bad", [(3, 1), (3, 2), (4, 0), (5, 4), (8, 3), (9, 8)])
def test_one_node_refusing_connections_is_unreachable_and_no_other(count, bad):
    got = verdicts_of(FakeNet(refuses=[bad]), count)
    assert got == {n: "unreachable" if n == bad else "ok" for n in range(count)}


@pytest.mark.parametrize("count,bad", [(3, 0), (5, 2), (8, 7)])
def test_a_node_that_cannot_connect_out_is_unreachable_and_no_other(count, bad):
    got = verdicts_of(FakeNet(mute=[bad]), count)
    assert got == {n: "unreachable" if n == bad else "ok" for n in range(count)}


def test_a_node_whose_probe_never_started_is_unreachable():
    got = verdicts_of(FakeNet(), 4, down={2: "ssh: timed out"})
    assert got == {0: "ok", 1: "ok", 2: "unreachable", 3: "ok"}


def test_two_nodes_without_a_third_name_both_sides():
    assert verdicts_of(FakeNet(refuses=[1]), 2) == {0: "unreachable", 1: "unreachable"}


# -- interfaces ----------------------------------------------------------------------------------------------------

PROC_ROUTE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
ib0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
*\t00004D0A\t00000000\t0201\t0\t0\t4000\t0000FFFF\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""
ADDRESSES = {"lo": ("127.0.0.1", "::1"), "eth0": ("192.0.2.2",), "ib0": ("10.77.0.12",)}


def test_routes_parse_from_proc():
    routes = parse_routes(PROC_ROUTE)
    assert routes[1] == Route("ib0", 0x0A4D0000, 0xFFFFFF00, 0)
    assert routes[1].prefix == 24 and routes[2].metric == 4000


def test_the_longest_prefix_wins():
    routes = parse_routes(PROC_ROUTE)
    assert route_interface("10.77.0.11", routes) == "ib0"
    assert route_interface("192.0.2.9", routes) == "eth0"
    assert route_interface("8.8.8.8", routes) == "eth0"  # the default route
    assert route_interface("10.77.9.9", routes) is None  # the unreachable route
    assert route_interface("fe80::1", routes) is None


def test_the_master_node_uses_the_interface_holding_the_master_address():
    # the kernel's route to a local address is lo; no peer can reach that
    routes = parse_routes(PROC_ROUTE)
    assert select_interface("10.77.0.12", "10.77.0.12", routes, ADDRESSES) == "ib0"
    assert select_interface("127.0.0.1", "127.0.0.1", routes, ADDRESSES) == "lo"


def test_the_source_address_decides_before_the_route_table():
    routes = parse_routes(PROC_ROUTE)
    assert select_interface("10.77.0.11", "192.0.2.2", routes, ADDRESSES) == "eth0"  # policy routing said so
    assert select_interface("10.77.0.11", None, routes, ADDRESSES) == "ib0"


def test_a_user_value_is_kept():
    env = {"NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert socket_ifname.interface_variables("ib0", env) == {"GLOO_SOCKET_IFNAME": "ib0"}
    assert socket_ifname.interface_variables(None, {}) == {}


def test_a_named_interface_a_node_lacks_is_one_line_naming_the_node():
    with pytest.raises(UsageError, match=r"node7 has no interface 'ib9'; it has: lo, eth0"):
        socket_ifname.check_interface_name("node7", "ib9", ("lo", "eth0"))


def test_rank_env_modes(monkeypatch):
    monkeypatch.setattr(interfaces, "interface_names", lambda: ("lo", "eth0"))
    monkeypatch.setattr(socket_ifname, "gloo_trap", lambda host, nodes: None)
    env = {"MASTER_ADDR": "127.0.0.1"}
    assert socket_ifname.rank_network_env("h", "none", env, 3) == {}
    assert socket_ifname.rank_network_env("h", "eth0", env, 1) == {"GLOO_SOCKET_IFNAME": "eth0",
                                                               "NCCL_SOCKET_IFNAME": "eth0"}
    assert socket_ifname.rank_network_env("h", "auto", env, 1) == {}  # one node: loopback whatever they say
    assert socket_ifname.rank_network_env("h", "auto", env, 2) == {"GLOO_SOCKET_IFNAME": "lo",
                                                               "NCCL_SOCKET_IFNAME": "lo"}
    with pytest.raises(UsageError, match="h has no interface 'ib0'"):
        socket_ifname.rank_network_env("h", "ib0", env, 2)


def test_the_gloo_trap_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(interfaces, "hostname_is_loopback", lambda name: "127.0.1.1")
    monkeypatch.setattr(interfaces, "interface_toward", lambda host: interfaces.Choice("eth0", "x"))
    assert socket_ifname.rank_network_env("node2", "auto", {"MASTER_ADDR": "node1"}, 4)["GLOO_SOCKET_IFNAME"] == "eth0"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "127.0.1.1" in err and "4 nodes" in err


def test_the_spec_carries_the_flag_only_when_set():
    spec = NodeSpec(host="h", node_rank=0, ranks=())
    assert "network_interface" not in spec.to_json()["options"]
    named = NodeSpec(host="h", node_rank=0, ranks=(), options=AgentOptions(network_interface="ib0"))
    assert NodeSpec.from_json(named.to_json()).options.network_interface == "ib0"
    assert NodeSpec.from_json(spec.to_json()).options.network_interface == "auto"


# -- the probe on loopback -----------------------------------------------------------------------------------------


def test_a_probe_pair_on_loopback():
    server = ProbeServer()
    try:
        got = measure("127.0.0.2", server.port, seconds=0.2)
        assert got.ok and got.latency_ms is not None and got.latency_ms < 50 and got.throughput_mbs > 10, got
        assert reach("127.0.0.1", server.port).ok
    finally:
        server.close()
    refused = reach("127.0.0.2", server.port, timeout=1)
    assert not refused.ok and "refused" in refused.error


def test_two_probe_processes_talk_over_json_lines():
    env = {"PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-m", "xrun.launch.network", "--toward", "127.0.0.1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        hellos = [json.loads(p.stdout.readline()) for p in procs]
        assert hellos[0]["interface"] == "lo" and hellos[0]["address"] == "127.0.0.1"
        procs[0].stdin.write(json.dumps({"probe": f"127.0.0.2:{hellos[1]['port']}", "seconds": 0.2}) + "\n")
        procs[0].stdin.flush()
        answer = json.loads(procs[0].stdout.readline())
        assert answer["ok"] and answer["throughput_mbs"] > 10, answer
    finally:
        for p in procs:
            p.stdin.close()
            assert p.wait(timeout=10) == 0


# -- flags and bad input -------------------------------------------------------------------------------------------


def xrun(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "xrun", *args], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT}, cwd=ROOT)


@pytest.mark.parametrize("args,needle", [
    (["check", "--network=ring"], "unknown mode 'ring'; known: tcp, allreduce"),
    (["check", "--network"], "needs at least 2 hosts"),
    (["check", "--json"], "--json: only applies with --network"),
    (["--network_interface", "a b", "x.py"], "is not an interface name"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    done = xrun(*args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_help_states_the_rule():
    text = " ".join(xrun("check", "--help").stdout.split())
    assert "0.5 x the median" in text and "2 x the median + 5 ms" in text


def test_untried_pairs_skip_what_was_tried():
    assert rounds.untried_pairs([0, 1, 2], [(0, 1), (2, 0)]) == [(1, 2)]
    assert rounds.untried_pairs([0, 1], [(1, 0)]) == []
    assert rounds.untried_pairs([], []) == []


# -- the code's shape (issue 30 §4) --------------------------------------------------------------------------------


def test_the_checks_modules_are_in_no_circle_even_counting_function_level_imports():
    graph = internal_graph(import_edges(), set(Level))
    assert [c for c in cycles(graph) if any(".network" in module for module in c)] == []


def test_the_checks_file_names_are_found_once_in_the_tree():
    package = Path(ROOT) / "src" / "xrun"
    names = [path.name for path in package.rglob("*.py") if path.name not in ("__init__.py", "__main__.py")]
    for folder in (package / "common" / "network", package / "launch" / "network", package / "runner" / "network"):
        for path in folder.glob("*.py"):
            assert path.name in ("__init__.py", "__main__.py") or names.count(path.name) == 1, path
