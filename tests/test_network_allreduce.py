"""xrun check --network=allreduce (issue 24): the verdict with all-reduce figures, the backend choice (gloo or
nccl), the coordinator asking for one all-reduce per pair, the report, and a real gloo pair on loopback.

This machine has no GPU: nccl is tested in its selection only (``backend_for`` and the command a probe is sent);
the pairs that run here are gloo."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from xrun.common.network.probe_terms import BYTES, MIN_BYTES, backend_for, size_for
from xrun.errors import UsageError
from xrun.launch.network.allreduce_pair import run_pair
from xrun.launch.network.probe_server import ProbeServer
from xrun.runner.network import node_results
from xrun.runner.network.check_command import check_torch
from xrun.runner.network.coordinate import ALLREDUCE, MEASURE, REACH, Check, Request
from xrun.runner.network.node_verdicts import (
    Figures,
    LinkVerdict,
    NodeVerdict,
    Probe,
    best_figures,
    judge,
    pair_figures,
)
from xrun.runner.network.ssh_probes import LinkProber

# -- the verdict with all-reduce figures ---------------------------------------------------------------------------


def test_the_pair_takes_its_tcp_both_ways_and_its_all_reduce():
    there = Probe(0, 1, True, latency_ms=0.1, throughput_mbs=900.0)
    back = Probe(1, 0, True, latency_ms=0.2, throughput_mbs=800.0)
    reduce = Probe(0, 1, True, allreduce_mbs=300.0)
    assert pair_figures([there, back, reduce]) == Figures(0.2, 800.0, 300.0)
    assert pair_figures([there, back]) == Figures(0.2, 800.0, None)
    assert pair_figures([there, back, Probe(0, 1, False, error="all-reduce: did not form")]) is None
    assert pair_figures([reduce]) is None  # no TCP figures: nothing to judge by


def test_each_node_keeps_its_best_all_reduce():
    best = best_figures([((0, 1), Figures(0.1, 800.0, 20.0)), ((0, 2), Figures(0.1, 800.0, 300.0)),
                         ((1, 3), Figures(0.1, 800.0, None))])
    assert best[0].allreduce_mbs == 300.0 and best[1].allreduce_mbs == 20.0 and best[3].allreduce_mbs is None


def test_slow_by_all_reduce_below_half_the_median_even_with_good_tcp():
    best = {0: Figures(0.1, 800.0, 300.0), 1: Figures(0.1, 800.0, 140.0), 2: Figures(0.1, 800.0, 310.0)}
    verdicts = judge(best, {}, [0, 1, 2])
    assert [verdicts[n].verdict for n in range(3)] == [LinkVerdict.OK, LinkVerdict.SLOW, LinkVerdict.OK]
    assert "all-reduce 140.0 MB/s < 0.5 x median 300.0" in verdicts[1].reason
    best[1] = Figures(0.1, 800.0, 151.0)  # 151 >= 0.5 x 300: ok
    assert judge(best, {}, [0, 1, 2])[1].verdict is LinkVerdict.OK


def test_tcp_figures_alone_still_judge_by_tcp():
    best = {0: Figures(0.1, 800.0), 1: Figures(0.1, 100.0), 2: Figures(0.1, 810.0)}
    assert [v.verdict for v in judge(best, {}, [0, 1, 2]).values()] == [LinkVerdict.OK, LinkVerdict.SLOW, LinkVerdict.OK]


# -- the backend and the commands ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus,backend", [((0, 0), "gloo"), ((8, 0), "gloo"), ((0, 1), "gloo"), ((1, 8), "nccl")])
def test_nccl_only_where_both_nodes_have_gpus(gpus, backend):
    assert backend_for(*gpus) == backend


class FakeLink:
    """A probe process that answers every command at once (records what it was sent)."""

    def __init__(self, gpus, answer):
        self.hello = {"address": "10.0.0.1", "port": 4000, "gpus": gpus}
        self.sent, self._answer = [], answer

    def send(self, command):
        self.sent.append(command)

    def read(self, timeout):
        self.timeout = timeout
        return self._answer


@pytest.mark.parametrize("gpus,backend", [((2, 2), "nccl"), ((2, 0), "gloo"), ((0, 0), "gloo")])
def test_the_prober_sends_the_backend_of_the_pair(gpus, backend):
    answer = {"ok": True, "latency_ms": 0.1, "throughput_mbs": 900.0, "allreduce_mbs": 321.0}
    links = {0: FakeLink(gpus[0], answer), 1: FakeLink(gpus[1], answer)}
    probes = LinkProber(links).run([Request(0, 1, ALLREDUCE, 0.1), Request(1, 0, MEASURE)])
    assert links[0].sent[0]["mode"] == "allreduce" and links[0].sent[0]["backend"] == backend
    assert links[0].sent[0]["bytes"] == MIN_BYTES  # a 0.1 MB/s link gets the smallest tensor
    assert "backend" not in links[1].sent[0] and probes[0].allreduce_mbs == 321.0
    assert links[0].timeout > links[1].timeout  # a pair's group gets its own, longer bound


def test_the_tensor_shrinks_on_a_slow_link_only():
    assert size_for(None) == size_for(5000.0) == BYTES == 8 << 20
    assert size_for(10.0) == 2_000_000  # 0.2 s at 10 MB/s
    assert size_for(0.01) == MIN_BYTES


class FakeNet:
    """Literal links: an all-reduce with a ``slow`` node runs at 10 MB/s, with a ``split`` node it cannot form."""

    def __init__(self, slow=(), split=()):
        self.slow, self.split = set(slow), set(split)
        self.requests = []

    def run(self, requests):
        self.requests += requests
        return [self._one(r) for r in requests]

    def _one(self, r):
        if r.mode == REACH:
            return Probe(r.src, r.dst, True, latency_ms=0.1)
        if r.mode == ALLREDUCE and {r.src, r.dst} & self.split:
            return Probe(r.src, r.dst, False, error="all-reduce: the gloo group did not form within 30 s")
        if r.mode == ALLREDUCE:
            assert r.rate_mbs == 800.0  # the pair's TCP figure sizes the tensor
            return Probe(r.src, r.dst, True, allreduce_mbs=10.0 if {r.src, r.dst} & self.slow else 300.0)
        return Probe(r.src, r.dst, True, latency_ms=0.1, throughput_mbs=800.0)


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_one_all_reduce_per_pair_and_a_healthy_network_is_ok(count):
    net = FakeNet()
    outcome = Check(range(count), allreduce=True).run(net)
    assert {v.verdict for v in outcome.verdicts.values()} == {LinkVerdict.OK}
    assert all(v.figures.allreduce_mbs == 300.0 for v in outcome.verdicts.values())
    reduced = sorted(sorted((r.src, r.dst)) for r in net.requests if r.mode == ALLREDUCE)
    measured = sorted(sorted((r.src, r.dst)) for r in net.requests if r.mode == MEASURE)
    assert measured == sorted(reduced + reduced)  # TCP both ways, then one all-reduce per pair


@pytest.mark.parametrize("count,bad", [(3, 1), (4, 0), (5, 4), (8, 3)])
def test_a_node_with_a_slow_all_reduce_is_named_slow_and_no_other(count, bad):
    verdicts = Check(range(count), allreduce=True).run(FakeNet(slow={bad})).verdicts
    assert {n for n, v in verdicts.items() if v.verdict is not LinkVerdict.OK} == {bad}
    assert verdicts[bad].verdict is LinkVerdict.SLOW and "all-reduce" in verdicts[bad].reason


@pytest.mark.parametrize("count,bad", [(3, 1), (4, 0), (5, 4)])
def test_a_node_whose_groups_cannot_form_is_unreachable_and_no_other(count, bad):
    verdicts = Check(range(count), allreduce=True).run(FakeNet(split={bad})).verdicts
    assert {n for n, v in verdicts.items() if v.verdict is not LinkVerdict.OK} == {bad}
    assert verdicts[bad].verdict is LinkVerdict.UNREACHABLE


def test_the_tcp_mode_asks_for_no_all_reduce():
    net = FakeNet()
    Check(range(4)).run(net)
    assert {r.mode for r in net.requests} == {MEASURE}


def test_a_node_without_torch_is_one_line_naming_it():
    with pytest.raises(UsageError, match="not importable with --python on node2, node3"):
        check_torch(["node1", "node2", "node3"], {0: {"torch": True}, 1: {"torch": False}, 2: {}})
    check_torch(["node1", "node2"], {0: {"torch": True}, 1: {"torch": True}})


def test_the_report_carries_the_all_reduce_figure():
    rows = [node_results.NodeRow("n1", "lo", "127.0.0.1", NodeVerdict(LinkVerdict.OK, Figures(0.1, 800.0, 300.0))),
            node_results.NodeRow("n2", "lo", "127.0.0.2", NodeVerdict(LinkVerdict.SLOW, Figures(0.1, 800.0, 10.0), "why"))]
    table = node_results.format_table(rows).splitlines()
    assert "allreduce MB/s" in table[0] and "300.0" in table[1] and "10.0" in table[2]
    assert [n["allreduce_mbs"] for n in json.loads(node_results.format_json(rows, 1.0))["nodes"]] == [300.0, 10.0]
    assert "all-reduce 10.0 MB/s" in node_results.BadNode(1, rows[1]).describe()
    tcp = [node_results.NodeRow("n1", "lo", "127.0.0.1", NodeVerdict(LinkVerdict.OK, Figures(0.1, 800.0)))]
    assert "allreduce" not in node_results.format_table(tcp)


# -- real gloo pairs on loopback -----------------------------------------------------------------------------------


def test_a_gloo_pair_on_loopback():
    server = ProbeServer()
    try:
        got = run_pair("127.0.0.2", server.port, timeout=60)
    finally:
        server.close()
    assert got.ok and got.allreduce_mbs is not None and got.allreduce_mbs > 1, got


def test_a_rank_whose_group_cannot_form_fails_within_its_bound():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nobody listens here: rank 0 never comes
    spec = {"master": "127.0.0.1", "port": port, "backend": "gloo", "bytes": 1024, "iters": 1, "timeout": 3}
    done = subprocess.run([sys.executable, "-m", "xrun.launch.network.allreduce_worker", "--rank", "1",
                           "--spec", json.dumps(spec)], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and not answer["ok"] and "gloo group failed" in answer["error"], done


def test_two_probe_processes_run_an_all_reduce_over_json_lines():
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-m", "xrun.launch.network", "--toward", "127.0.0.1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    try:
        hellos = [json.loads(p.stdout.readline()) for p in procs]
        assert hellos[0]["torch"] is True and hellos[0]["gpus"] == 0  # this machine: torch CPU, no GPU
        command = {"probe": f"127.0.0.2:{hellos[1]['port']}", "mode": "allreduce", "bytes": 1 << 20,
                   "backend": backend_for(hellos[0]["gpus"], hellos[1]["gpus"]), "group_timeout": 60}
        procs[0].stdin.write(json.dumps(command) + "\n")
        procs[0].stdin.flush()
        answer = json.loads(procs[0].stdout.readline())
        assert answer["ok"] and answer["allreduce_mbs"] > 1 and answer["error"] == "", answer
    finally:
        for p in procs:
            p.stdin.close()
            assert p.wait(timeout=10) == 0
