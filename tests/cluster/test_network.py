"""xrun check --network and --network_interface on the namespace cluster (issue 24).

Faults, made here with the kernel's tools on the node's own links (only the cluster's addresses are touched):
* slow: a token bucket (tc tbf, 4 Mbit/s) on the host-side end of the node's veth, so every packet *into* the
  node waits its turn: the node's ingress is slowed, its egress is not (this kernel has no netem);
* refusing: an iptables rule in the node's namespace that rejects every new inbound TCP connection except ssh.
The remote interpreter is a wrapper that puts this tree first on PYTHONPATH (over ssh nothing else would: the
``python`` fixture).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import xrun
from tests.cluster.harness import IFACE, _cmdline, netns_pids, tool
from tests.conftest import ROOT

RANK_SCRIPT = "import os, socket; print('IF', socket.gethostname(), os.environ.get('GLOO_SOCKET_IFNAME'), " \
              "os.environ.get('NCCL_SOCKET_IFNAME'), flush=True)\n"


def check(cluster, tmp_path, python, *args, nodes=None, timeout=60, mode=None):
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=1, nodes=nodes)
    start = time.monotonic()
    network = "--network" if mode is None else f"--network={mode}"
    done = subprocess.run([sys.executable, "-m", "xrun", "check", network, "-H", str(hostfile), "--python", python,
                           "--ssh_config", str(cluster.ssh_config), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    return done, time.monotonic() - start


def verdicts(stdout):
    return {n["host"]: n["verdict"] for n in json.loads(stdout)["nodes"]}


def slow_ingress(cluster, node):
    subprocess.run([tool("tc"), "qdisc", "replace", "dev", cluster.node(node).host_veth, "root", "tbf", "rate",
                    "4mbit", "burst", "32kbit", "latency", "400ms"], check=True)


def heal_ingress(cluster, node):
    subprocess.run([tool("tc"), "qdisc", "del", "dev", cluster.node(node).host_veth, "root"], check=False)


def refuse_inbound(cluster, node, on=True):
    rule = ["INPUT", "-p", "tcp", "--syn", "!", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    cluster.run_on(node, [tool("iptables"), "-A" if on else "-D", *rule], check=True)


def test_a_healthy_cluster_passes_and_json_lists_every_host(cluster, tmp_path, python):
    done, elapsed = check(cluster, tmp_path, python, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [n["host"] for n in report["nodes"]] == ["node1", "node2", "node3"]  # 3 nodes: an odd count
    for node in report["nodes"]:
        assert node["verdict"] == "ok" and node["interface"] == IFACE and node["throughput_mbs"] > 0, node
    assert elapsed < 30


def test_allreduce_on_a_healthy_cluster_gives_every_node_a_figure(cluster, tmp_path, python):
    done, elapsed = check(cluster, tmp_path, python, "--json", mode="allreduce", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [n["host"] for n in report["nodes"]] == ["node1", "node2", "node3"]
    for node in report["nodes"]:
        assert node["verdict"] == "ok" and node["allreduce_mbs"] > 0 and node["throughput_mbs"] > 0, node
    print(f"--network=allreduce, 3 nodes: {elapsed:.1f} s")  # the time docs/network-check.md quotes
    done, _ = check(cluster, tmp_path, python, mode="allreduce", timeout=180)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "allreduce MB/s" in lines[0], done.stdout + done.stderr
    assert all(len(line.split()) == 7 and line.split()[5] != "-" for line in lines[1:4]), done.stdout
    print(done.stdout)


def test_allreduce_without_torch_on_the_nodes_is_one_line_exit_2(cluster, tmp_path):
    # -S: no site-packages, so no torch; xrun itself comes from PYTHONPATH, a folder that holds only the installed
    # package (its site-packages would bring torch back)
    only_xrun = tmp_path / "only-xrun"
    only_xrun.mkdir()
    (only_xrun / "xrun").symlink_to(os.path.dirname(xrun.__file__))
    bare = tmp_path / "python-bare"
    bare.write_text(f'#!/bin/sh\nPYTHONPATH={only_xrun} exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done, _ = check(cluster, tmp_path, str(bare), mode="allreduce")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "needs torch on every node" in done.stderr, done.stderr
    assert "node1, node2, node3" in done.stderr, done.stderr


def test_allreduce_names_a_node_slowed_on_ingress_slow_and_no_other(cluster, tmp_path, python):
    slow_ingress(cluster, "node2")
    try:
        done, elapsed = check(cluster, tmp_path, python, "--json", mode="allreduce", timeout=240)
    finally:
        heal_ingress(cluster, "node2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert verdicts(done.stdout) == {"node1": "ok", "node2": "slow", "node3": "ok"}, done.stdout
    nodes = {n["host"]: n for n in json.loads(done.stdout)["nodes"]}
    assert nodes["node2"]["allreduce_mbs"] < 0.5 * nodes["node1"]["allreduce_mbs"], nodes
    print(f"--network=allreduce, 3 nodes, one slowed: {elapsed:.1f} s")


def test_the_table_names_each_nodes_interface(cluster, tmp_path, python):
    done, _ = check(cluster, tmp_path, python)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("node")]
    assert len(lines) == 3 and all(IFACE in line and line.rstrip().endswith("ok") for line in lines), done.stdout


def test_a_node_slowed_on_ingress_is_named_slow_and_no_other(cluster, tmp_path, python):
    slow_ingress(cluster, "node2")
    try:
        done, _ = check(cluster, tmp_path, python, "--json")
    finally:
        heal_ingress(cluster, "node2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert verdicts(done.stdout) == {"node1": "ok", "node2": "slow", "node3": "ok"}, done.stdout
    assert "node2 slow" in done.stderr


def test_a_node_refusing_inbound_tcp_is_unreachable_and_no_other(cluster, tmp_path, python):
    refuse_inbound(cluster, "node3")
    try:
        done, _ = check(cluster, tmp_path, python, "--json")
    finally:
        refuse_inbound(cluster, "node3", on=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert verdicts(done.stdout) == {"node1": "ok", "node2": "ok", "node3": "unreachable"}, done.stdout


def test_five_nodes_odd_count_all_covered_in_time(make_cluster, tmp_path, python):
    cluster = make_cluster(5)
    slow_ingress(cluster, "node5")  # the odd one out of round 0
    try:
        done, elapsed = check(cluster, tmp_path, python, "--json")
    finally:
        heal_ingress(cluster, "node5")
    assert verdicts(done.stdout) == {"node1": "ok", "node2": "ok", "node3": "ok", "node4": "ok", "node5": "slow"}
    done, elapsed = check(cluster, tmp_path, python, "--json")
    assert done.returncode == 0 and elapsed < 30, (elapsed, done.stdout, done.stderr)


def run_job(cluster, tmp_path, python, *args, env=None, script_text=RANK_SCRIPT):
    script = tmp_path / "ifname.py"
    script.write_text(script_text)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=1)
    argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", "ssh", "--python", python,
            "--ssh_config", str(cluster.ssh_config), *args, str(script)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))
    seen = {}
    for line in done.stdout.splitlines():
        if "IF node" in line:
            host, gloo, nccl = line.split("IF ", 1)[1].split()
            seen[host] = (gloo, nccl)
    return done, seen


def test_each_rank_sees_its_nodes_interface(cluster, tmp_path, python):
    done, seen = run_job(cluster, tmp_path, python)
    assert done.returncode == 0, done.stderr
    assert seen == {f"node{i}": (IFACE, IFACE) for i in (1, 2, 3)}, done.stdout


def test_a_users_value_is_kept(cluster, tmp_path, python):
    done, seen = run_job(cluster, tmp_path, python, env={"NCCL_SOCKET_IFNAME": "^docker,lo"})
    assert done.returncode == 0, done.stderr
    assert seen == {f"node{i}": (IFACE, "^docker,lo") for i in (1, 2, 3)}, done.stdout


def test_network_interface_none_and_a_missing_name(cluster, tmp_path, python):
    done, seen = run_job(cluster, tmp_path, python, "--network_interface", "none")
    assert done.returncode == 0 and seen == {f"node{i}": ("None", "None") for i in (1, 2, 3)}, done.stdout
    # checked before the start barrier: the runner says it, one line naming a node, and no rank starts
    done, seen = run_job(cluster, tmp_path, python, "--network_interface", "ib7")
    assert done.returncode != 0 and seen == {}, done.stdout + done.stderr
    named = [line for line in done.stderr.splitlines() if "has no interface 'ib7'; it has: lo, xceth0" in line]
    assert len(named) == 1 and named[0].startswith("xrun:"), done.stderr
    assert "ranks" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr  # bad input, not a node failure


# -- --precheck: the same check across a job's nodes, over its agents, before any rank starts ------------------

# Each rank leaves a file named after its host the moment it starts: no file, no rank ever ran.
MARKED_SCRIPT = ("import os, socket, sys; open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "
                 "'started-' + socket.gethostname()), 'w').close(); " + RANK_SCRIPT)


def agents_left(cluster):
    """Every xrun process still running on a node (agents, ranks): none may outlive the job."""
    return [(node.name, _cmdline(pid)) for node in cluster.nodes for pid in netns_pids(node.netns)
            if "xrun.launch" in _cmdline(pid) or "ifname.py" in _cmdline(pid)]


def test_precheck_on_a_healthy_cluster_starts_the_ranks(cluster, tmp_path, python):
    done, seen = run_job(cluster, tmp_path, python, "--precheck", script_text=MARKED_SCRIPT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert seen == {f"node{i}": (IFACE, IFACE) for i in (1, 2, 3)}, done.stdout
    passed = [line for line in done.stderr.splitlines() if "precheck passed: 3 node(s) ok in" in line]
    assert len(passed) == 1, done.stderr


def test_precheck_ends_the_job_before_any_rank_when_a_node_is_slow(cluster, tmp_path, python):
    slow_ingress(cluster, "node2")
    try:
        done, seen = run_job(cluster, tmp_path, python, "--precheck", script_text=MARKED_SCRIPT)
    finally:
        heal_ingress(cluster, "node2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert seen == {} and not list(tmp_path.glob("started-*")), done.stdout  # no rank ever started
    failed = [line for line in done.stderr.splitlines() if line.startswith("xrun: job failed: precheck:")]
    assert len(failed) == 1 and "node2 slow: throughput" in failed[0] and "MB/s" in failed[0], done.stderr
    assert "node1 slow" not in failed[0] and "node3" not in failed[0], failed[0]
    deadline = time.monotonic() + 10
    while agents_left(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents_left(cluster) == []


def test_precheck_names_a_node_refusing_inbound_tcp_unreachable(cluster, tmp_path, python):
    refuse_inbound(cluster, "node3")  # its agent still reaches the head (outbound): only its probe server is refused
    try:
        done, seen = run_job(cluster, tmp_path, python, "--precheck", script_text=MARKED_SCRIPT)
    finally:
        refuse_inbound(cluster, "node3", on=False)
    assert done.returncode == 1 and seen == {} and not list(tmp_path.glob("started-*")), done.stdout + done.stderr
    failed = [line for line in done.stderr.splitlines() if line.startswith("xrun: job failed: precheck:")]
    assert len(failed) == 1 and "node3 unreachable: refuses connections" in failed[0], done.stderr
    assert "node1" not in failed[0] and "node2" not in failed[0], failed[0]
