"""``--replica_groups G`` (torchft's replica groups, issue 39 §2): the plan (pure) and its refusals."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, eventually, run_xrun, torchft_missing
from tests.report_browser import open_report
from xrun.channel import Kind, message
from xrun.common.output.writer import writer
from xrun.common.rankplan import LaunchOptions, Rendezvous, node_ranks
from xrun.common.result.group_restart import GROUPS_NAMED, GroupRestart, restarted_words
from xrun.common.result.summary import RankFigures, success_line
from xrun.common.spec import NodeSpec, ReplicaGroups, moved_to, with_rendezvous
from xrun.errors import UsageError
from xrun.joined.pod import pod_node
from xrun.launch.replicas import lighthouse
from xrun.launch.replicas.supervision import GroupPolicy
from xrun.launch.session.pod import Node0
from xrun.launch.store.agent_store import store_endpoints
from xrun.runner.backends import Invocation
from xrun.runner.cli import parse_request
from xrun.runner.dryrun import plan_json, plan_text
from xrun.runner.job.config import JobConfig
from xrun.runner.job.figures import JobFigures
from xrun.runner.plan import JobRequest, PortChoice, make_plan
from xrun.runner.planner import plan_job, with_replica_ports
from xrun.runner.pod.digest import first_difference
from xrun.runner.pod.placement import pod_setup
from xrun.runner.replica_options import ReplicaRequest
from xrun.runner.report.command import report
from xrun.runner.restart_options import RestartPolicy

GROUP_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE")


def contract(world, replicas, master="127.0.0.1", **launch):
    """Every rank's group contract, by global rank: the values of GROUP_KEYS and its argv's --local_rank."""
    found = {}
    for node_rank in range(len(world)):
        for rank in node_ranks(world, node_rank, Rendezvous(master, 5000, "job"), LaunchOptions(python="py", **launch),
                               "t.py", (), replicas=replicas):
            found[rank.rank] = (*(rank.env.get(k) for k in GROUP_KEYS), rank.argv[-1])
    return found


def test_one_node_in_two_groups_each_a_world_of_its_own():
    """As one torchrun per group on one machine (torchft's README): CUDA_VISIBLE_DEVICES=0,1 and 2,3."""
    groups = ReplicaGroups(count=2, master_ports=(5000, 5001), lighthouse_port=5002)
    light = "http://127.0.0.1:5002"
    assert contract({"localhost": (0, 1, 2, 3)}, groups) == {
        0: ("0", "0", "2", "2", "0", "1", "127.0.0.1", "5000", "0,1", "0", "2", light, "--local_rank=0"),
        1: ("1", "1", "2", "2", "0", "1", "127.0.0.1", "5000", "0,1", "0", "2", light, "--local_rank=1"),
        2: ("0", "0", "2", "2", "0", "1", "127.0.0.1", "5001", "2,3", "1", "2", light, "--local_rank=0"),
        3: ("1", "1", "2", "2", "0", "1", "127.0.0.1", "5001", "2,3", "1", "2", light, "--local_rank=1"),
    }


def test_a_group_may_span_nodes_and_meets_at_its_rank_0s_node():
    """3 groups of 2 over 2 nodes of 3 slots: group 1 is node a's last slot and node b's first."""
    groups = ReplicaGroups(count=3, master_ports=(5000, 5001, 5002), lighthouse_port=5003)
    light = "http://10.0.0.1:5003"
    found = contract({"a": (0, 1, 2), "b": (4, 5, 6)}, groups, master="10.0.0.1")
    assert found[2] == ("0", "0", "2", "1", "0", "2", "10.0.0.1", "5001", "2", "1", "3", light, "--local_rank=0")
    assert found[3] == ("1", "0", "2", "1", "1", "2", "10.0.0.1", "5001", "4", "1", "3", light, "--local_rank=0")
    assert found[5] == ("1", "1", "2", "2", "0", "1", "b", "5002", "5,6", "2", "3", light, "--local_rank=1")


def test_device_per_rank_and_ipv6_keep_their_rules_inside_a_group():
    groups = ReplicaGroups(count=2, master_ports=(5000, 5001), lighthouse_port=5002)
    found = contract({"localhost": (0, 1, 2, 3)}, groups, master="::1", device_per_rank=True)
    assert found[3][1] == "0" and found[3][8] == "3" and found[3][-1] == "--local_rank=0"
    assert found[3][11] == "http://[::1]:5002"


def test_a_channel_plan_leaves_addresses_to_the_barrier_and_node_spec_round_trips():
    groups = ReplicaGroups(count=2, master_ports=(5000, 5001), lighthouse_port=5002)
    world = {"a": (0,), "b": (0,)}
    ranks = node_ranks(world, 0, Rendezvous(None, 5000, "job"), LaunchOptions(python="py"), "t.py", (),
                       replicas=groups)
    assert "MASTER_ADDR" not in ranks[0].env and "TORCHFT_LIGHTHOUSE" not in ranks[0].env
    spec = NodeSpec("a", 0, ranks, replicas=groups)
    assert NodeSpec.from_json(spec.to_json()) == spec
    assert spec.world_size == 2  # the job's ranks, not the group's


def test_the_start_keeps_each_groups_port_and_restart_count():
    """The head restarts no job under --replica_groups: each group counts its own restarts, so the start keeps the
    port and the count each rank's group was planned (or moved, ``moved_to``) with."""
    node = plan(2).nodes[0]
    again = with_rendezvous(node, "127.0.0.1", 7777, 1)
    assert [(r.env["MASTER_PORT"], r.env["TORCHELASTIC_RESTART_COUNT"]) for r in again.ranks] == [
        ("6000", "0"), ("6000", "0"), ("6001", "0"), ("6001", "0")]


def test_a_lost_nodes_spec_moved_to_a_spare_meets_there_and_counts_on():
    """--spares: node b's groups on the spare c: their MASTER_ADDR (b's name in the plan) becomes c, each group's
    restart count is the head's, the ports and node 0's Lighthouse stay."""
    lost = plan(3, world={"a": (0, 1), "b": (0, 1, 2, 3)}, backend="ssh").nodes[1]
    assert {r.env["MASTER_ADDR"] for r in lost.ranks} == {"b"}
    moved = with_rendezvous(moved_to(lost, "c", {1: 1, 2: 2}), "10.0.0.1", 6000)
    assert moved.host == "c" and moved.node_rank == 1
    assert [(r.rank, r.env["MASTER_ADDR"], r.env["MASTER_PORT"], r.env["TORCHELASTIC_RESTART_COUNT"],
             r.env["TORCHFT_LIGHTHOUSE"]) for r in moved.ranks] == [
        (2, "c", "6001", "1", "http://10.0.0.1:6003"), (3, "c", "6001", "1", "http://10.0.0.1:6003"),
        (4, "c", "6002", "2", "http://10.0.0.1:6003"), (5, "c", "6002", "2", "http://10.0.0.1:6003")]
    policy = GroupPolicy.of(((r.rank, r.env) for r in moved.ranks), budget=2)
    assert (policy.restarts(1), policy.restarts(2)) == (1, 2)  # the spare's agent counts each budget on
    assert policy.fail(5, "exited with code 1", running={1}, wall=0.0, deadline=0.0) is None  # group 2's is spent


def plan(groups, *, ports=(), world=None, backend="local", master_port=6000, spares=0):
    req = JobRequest(script="t.py", master_port=master_port, replicas=ReplicaRequest(groups, ports),
                     restart=RestartPolicy(spares=spares))
    return make_plan(req, world or {"localhost": (0, 1, 2, 3)}, backend)


def test_ports_count_up_from_the_master_port_or_are_the_ones_drawn():
    assert plan(2).nodes[0].replicas == ReplicaGroups(2, (6000, 6001), 6002)
    assert plan(2, ports=(6000, 7100, 7200)).nodes[0].replicas == ReplicaGroups(2, (6000, 7100), 7200)
    drawn = with_replica_ports(JobRequest(script="t.py", master_port=6000, master_port_choice=PortChoice.FREE,
                                          replicas=ReplicaRequest(4)))
    assert drawn.replicas is not None and drawn.replicas.ports[0] == 6000 and len(set(drawn.replicas.ports)) == 5


def test_the_dry_run_shows_the_groups():
    shown = plan(2)
    text = plan_text(shown, Invocation("local", ()))
    assert ("replica groups: 2 of 2 ranks, each its own world and store (0 ranks 0-1 port 6000, 1 ranks 2-3 port "
            "6001); torchft_lighthouse on node 0 at port 6002") in text
    assert "rank 3 (local 3, group 1 rank 1)" in text
    data = plan_json(shown, Invocation("local", ()))
    assert data["replica_groups"] == {"count": 2, "master_ports": [6000, 6001], "lighthouse_port": 6002,
                                      "lighthouse": "127.0.0.1:6002"}
    assert "replica_groups" not in plan_json(make_plan(JobRequest(script="t.py"), {"h": (0,)}, "local"),
                                             Invocation("local", ()))


def test_max_restarts_is_each_groups_and_the_head_restarts_no_whole_job():
    request = JobRequest(script="t.py", master_port=6000, replicas=ReplicaRequest(2), restart=RestartPolicy(3))
    shown = make_plan(request, {"localhost": (0, 1, 2, 3)}, "local")
    assert ("restarts: up to 3 of each replica group alone after a failure in it, the other groups running on; a "
            "group with none left fails the job") in plan_text(shown, Invocation("local", ()))
    assert JobConfig.from_plan(shown, join_timeout=1).restart.max_restarts == 0
    assert {r.env["TORCHELASTIC_MAX_RESTARTS"] for r in shown.nodes[0].ranks} == {"3"}  # the nodes' budget


def test_on_several_nodes_each_group_lies_on_one_node_and_meets_there():
    """2 nodes of 4 slots, 4 groups: each node's agent hosts its own groups' stores. The plan leaves node 0's address
    (its groups' MASTER_ADDR, the Lighthouse's) to the start barrier; node 1's groups meet at node 1's name."""
    shown = plan(4, world={"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)}, backend="ssh")
    assert not shown.node0_picks_port  # every group's port is counted up from the plan's, known to every node
    keys = ("REPLICA_GROUP_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
            "TORCHFT_LIGHTHOUSE")
    node0, node1 = ([tuple(r.env.get(k) for k in keys) for r in node.ranks] for node in shown.nodes)
    assert node1 == [("2", "0", "2", "0", "b", "6002", "0,1", None), ("2", "1", "2", "1", "b", "6002", "0,1", None),
                     ("3", "0", "2", "0", "b", "6003", "2,3", None), ("3", "1", "2", "1", "b", "6003", "2,3", None)]
    assert [e[:4] + e[5:] for e in node0] == [
        ("0", "0", "2", "0", "6000", "0,1", None), ("0", "1", "2", "1", "6000", "0,1", None),
        ("1", "0", "2", "0", "6001", "2,3", None), ("1", "1", "2", "1", "6001", "2,3", None)]
    assert {e[4] for e in node0} == {None}
    # the start barrier's node 0 address: node 0's groups meet there, every rank finds the Lighthouse there
    started = [with_rendezvous(node, "10.0.0.1", 7777) for node in shown.nodes]
    assert [(r.env["MASTER_ADDR"], r.env["MASTER_PORT"], r.env["TORCHFT_LIGHTHOUSE"]) for r in started[0].ranks[1:3]] \
        == [("10.0.0.1", "6000", "http://10.0.0.1:6004"), ("10.0.0.1", "6001", "http://10.0.0.1:6004")]
    assert {(r.env["MASTER_ADDR"], r.env["TORCHFT_LIGHTHOUSE"]) for r in started[1].ranks} == {
        ("b", "http://10.0.0.1:6004")}
    assert with_rendezvous(shown.nodes[0], "fd00::1", 7777).ranks[0].env["TORCHFT_LIGHTHOUSE"] == "http://[fd00::1]:6004"
    text = plan_text(shown, Invocation("ssh", ()))
    assert ("replica groups: 4 of 2 ranks, each its own world and store (0 ranks 0-1 port 6000 on a, 1 ranks 2-3 port "
            "6001 on a, 2 ranks 4-5 port 6002 on b, 3 ranks 6-7 port 6003 on b); torchft_lighthouse on node 0 at port "
            "6004") in text
    assert "master port:" not in text  # not a free one: the plan's, as given
    assert plan_json(shown, Invocation("ssh", ()))["replica_groups"]["lighthouse"] == "<a address>:6004"


@pytest.mark.parametrize(("groups", "kwargs", "said"), [
    (3, {}, "3 groups cannot split 4 ranks evenly; give a divisor of 4"),
    (2, {"world": {"a": (0, 1), "b": (0, 1)}, "backend": "ssh", "master_port": 0}, "needs a master port on several "
     "nodes"),
    (2, {"master_port": 65534}, "2 groups need ports 65534-65536"),
])
def test_what_cannot_work_is_refused(groups, kwargs, said):
    with pytest.raises(UsageError, match=said):
        plan(groups, **kwargs)


@pytest.mark.parametrize(("flags", "said"), [
    (["--replica_groups", "0"], "xrun: --replica_groups: must be at least 1, not 0"),
    (["--replica_groups", "3"], "xrun: --replica_groups: 3 groups cannot split 4 ranks evenly; give a divisor of 4"),
    (["--replica_groups", "2", "--elastic"], "xrun: --replica_groups: does not apply with --elastic yet"),
])
def test_bad_groups_are_one_line_and_exit_2(flags, said):
    done = run_xrun("--num_gpus", "4", *flags, "--dry-run", "t.py")
    assert done.returncode == 2 and done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr


def test_a_group_across_nodes_meets_at_its_rank_0s_node():
    """Group 0 spans a and b, group 1 b and c (2 slots each, groups of 3): each rank is told its group's world, and
    the group meets at its rank 0's node, whose agent alone hosts the group's store."""
    nodes = [with_rendezvous(n, "10.0.0.1", 6000) for n in plan(2, world={"a": (0, 1), "b": (0, 1), "c": (0, 1)},
                                                                  backend="ssh").nodes]
    keys = ("REPLICA_GROUP_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    assert [[tuple(r.env[k] for k in keys) for r in node.ranks] for node in nodes] == [
        [("0", "0", "3", "0", "10.0.0.1", "6000"), ("0", "1", "3", "1", "10.0.0.1", "6000")],
        [("0", "2", "3", "0", "10.0.0.1", "6000"), ("1", "0", "3", "0", "b", "6001")],
        [("1", "1", "3", "0", "b", "6001"), ("1", "2", "3", "1", "b", "6001")]]
    assert [sorted(store_endpoints(n)) for n in nodes] == [[0], [1], []]


def test_a_group_across_nodes_with_a_spare_is_planned_and_the_dry_run_says_what_the_spare_is_for(tmp_path):
    (tmp_path / "hosts").write_text("a slots=2\nb slots=2\nc slots=2\n")
    done = run_xrun("-H", str(tmp_path / "hosts"), "--launcher", "ssh", "--replica_groups", "1", "--max_restarts",
                    "1", "--spares", "1", "--dry-run", "t.py")
    assert done.returncode == 0, done.stderr
    assert ("spares: c (hot: its agent starts with the job and waits; a lost node's replica groups start again on it, "
            "each restart of its budget; every other node keeps running)") in done.stdout


def test_a_groups_store_port_taken_is_found_at_the_preflight_one_line_exit_2(tmp_path):
    """Each node checks its groups' store ports before it says ready (on several nodes, found at the start, a taken
    one would fail the job after every node began); here the local run's group 1."""
    (tmp_path / "t.py").write_text("print('never')\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = run_xrun("--num_gpus", "2", "--replica_groups", "2", "--master_port", str(port - 1),
                        str(tmp_path / "t.py"))
    assert done.returncode == 2 and re.fullmatch(
        rf"xrun: --replica_groups: port {port} \(group 1's store\) is already in use on localhost( by pid \d+ \(\S+\))?; "
        r"give another --master_port \(group g's port is it \+ g\)\n", done.stderr), done.stderr
    assert "never" not in done.stdout


# -- pod mode: every node's xrun plans the job alone (docs/pod-mode.md) -------------------------------------------


def pod_plan(node_rank, *flags, groups=2, hosts=("--hosts", "a,b")):
    request, _ = parse_request(["--pod", "--platform", "none", *hosts, "--num_gpus", "2", "--node_rank",
                                str(node_rank), "--replica_groups", str(groups), *flags, "t.py"])
    return plan_job(request)


def test_pod_mode_plans_the_same_groups_on_every_node():
    """Node 0's groups and the Lighthouse meet at node 0's name (a pod plan knows it: no barrier decides it), node
    1's groups at node 1's; every node's digest is the same and names the groups; the job as a whole is never
    restarted (--max_restarts is each group's, spent by its node), so no node waits for node 0's restart."""
    plans = [pod_plan(k, "--max_restarts", "2") for k in (0, 1)]
    keys = ("REPLICA_GROUP_ID", "RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHFT_LIGHTHOUSE")
    for plan_k in plans:
        assert [[tuple(r.env[k] for k in keys) for r in node.ranks] for node in plan_k.nodes] == [
            [("0", "0", "a", "29500", "http://a:29502"), ("0", "1", "a", "29500", "http://a:29502")],
            [("1", "0", "b", "29501", "http://a:29502"), ("1", "1", "b", "29501", "http://a:29502")]]
    setups = [pod_setup(plan_k, token=None) for plan_k in plans]
    assert setups[0].digest == setups[1].digest
    assert setups[0].digest.fields["replicas"] == {"count": 2, "master_ports": [29500, 29501], "lighthouse_port": 29502}
    other = pod_setup(plan_job(parse_request(["--pod", "--platform", "none", "--hosts", "a,b", "--num_gpus", "2",
                                              "--node_rank", "1", "--max_restarts", "2", "t.py"])[0]), token=None)
    assert first_difference(setups[0].digest, other.digest, node_name="b") == (
        "b has no --replica_groups; node 0 has --replica_groups 2")
    assert not pod_node(plans[1], setups[1], Node0("a", 29499, "a")).restarts
    assert not JobConfig.from_plan(plans[0], join_timeout=1).rejoins


def test_pod_mode_refuses_what_head_mode_refuses_and_unnamed_nodes():
    across = pod_plan(0, groups=1)  # a group across nodes: node 0's agent hosts its store, the head restarts it
    assert {r.env["MASTER_ADDR"] for node in across.nodes for r in node.ranks} == {"a"}
    with pytest.raises(UsageError, match="needs every node's name in pod mode .* name them with -H HOSTFILE or "
                       "--hosts PATTERN"):  # node1's groups would meet at "node1", which no one resolves
        pod_plan(0, hosts=("--num_nodes", "2", "--master_addr", "m"))


def test_pod_control_port_lies_below_every_groups_port():
    """One rule: the job's ports count up from the master port (group g's store at + g, the Lighthouse's at + G),
    node 0's control port defaults to the master port - 1 and may be none of them."""
    assert pod_setup(pod_plan(0), token=None).control_port == 29499
    assert pod_setup(pod_plan(0, "--control_port", "29503"), token=None).control_port == 29503
    with pytest.raises(UsageError, match=r"--control_port: 29501 is replica group 1's store port \(--master_port "
                       r"29500 \+ 1, --replica_groups\); give one outside 29500-29502"):
        pod_plan(0, "--control_port", "29501")
    done = run_xrun("--pod", "--hosts", "a,b", "--num_gpus", "2", "--node_rank", "1", "--replica_groups", "2",
                    "--master_port", "7000", "--control_port", "7002", "--dry-run", "t.py")
    assert done.returncode == 2 and done.stderr == (
        "xrun: --control_port: 7002 is the Lighthouse's port (--master_port 7000 + 2, --replica_groups); give one "
        "outside 7000-7002, or leave it out (--master_port - 1)\n"), done.stderr


# -- the Lighthouse's keeper (real processes) ------------------------------------------------------------------


def test_a_lighthouse_that_keeps_dying_is_restarted_then_gone_for_good(capfd):
    assert lighthouse.keep("n0", ["sh", "-c", "exit 3"]) == lighthouse.GONE_EXIT
    writer().drain()  # the notices are written from the console's thread
    said = capfd.readouterr().err.splitlines()
    assert len(said) == lighthouse.GIVE_UP_AFTER
    assert all(re.fullmatch(r"xrun\[n0\]: torchft's Lighthouse \(pid \d+\) exited with code 3; restarting it "
                            r"\(--replica_groups\)", line) for line in said[:-1]), said
    assert said[-1].endswith(f"exited with code 3, its {lighthouse.GIVE_UP_AFTER}th death in 60 s: it is gone for "
                             "good, not restarted (--replica_groups)")


def test_the_keeper_stops_its_lighthouse_and_a_missing_program_is_one_line(monkeypatch, tmp_path):
    keeper = subprocess.Popen([sys.executable, "-m", "xrun.launch.replicas.lighthouse", "n0", "sleep", "60"],
                              start_new_session=True)
    assert eventually(lambda: bool(children(keeper.pid)), within=10)
    (child,) = children(keeper.pid)
    os.killpg(keeper.pid, signal.SIGTERM)  # as the agent stops it
    assert keeper.wait(10) == 0
    assert eventually(lambda: not os.path.exists(f"/proc/{child}"), within=5)
    monkeypatch.setattr(lighthouse, "extension", lambda: None)  # an interpreter without torchft
    with pytest.raises(UsageError, match="torchft is not installed for .*: pip install torchft"):
        lighthouse.lighthouse_argv("127.0.0.1", 1)


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


# -- torchft under xrun: 2 groups x 2 ranks (real torchft 0.2.0, CPU, gloo) ----------------------------------------

GROUPS_JOB = os.path.join(ROOT, "tests", "procs", "torchft_groups_job.py")


def test_two_groups_train_together_and_the_lighthouse_is_restarted_when_killed(tmp_path):
    """One xrun runs both groups and the Lighthouse; a kill -9 of the Lighthouse mid-training (a step computes 1 s):
    xrun says so and starts it again, both groups finish every step, exit 0, and no Lighthouse is left. torchft
    0.2.0's Manager does not survive a Lighthouse lost in the middle of a quorum (that group's later quorums time
    out, docs/replica-groups.md; a loaded machine stretches a quorum enough to meet the kill now and then): such a
    group's rank gives up and the group restarts on its own budget (--max_restarts 1), and training goes on."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    argv = [sys.executable, "-m", "xrun", "--num_gpus", "4", "--no_local_rank", "--replica_groups", "2",
            "--max_restarts", "1", GROUPS_JOB, "6", "1"]
    with torchft_xrun(argv, tmp_path) as (xrun, out_path, err_path):
        assert eventually(lambda: len(steps(out_path.read_text(), 3)) == 4, within=60), out_path.read_text()
        keepers = [p for p in children(xrun.pid) if "xrun.launch.replicas.lighthouse" in cmdline(p)]
        (keeper,) = keepers
        (light,) = children(keeper)
        shown = cmdline(light)
        assert "replicas/torchft_main.py --min_replicas 1 --bind 127.0.0.1:" in shown
        os.kill(light, signal.SIGKILL)
        xrun.wait(90)
    out, err = out_path.read_text(), err_path.read_text()
    assert xrun.returncode == 0, err[-3000:]
    restarted = f"torchft's Lighthouse (pid {light}) was killed by SIGKILL; restarting it (--replica_groups)"
    assert restarted in err
    after = err[err.index(restarted):].splitlines()  # a quorum of both groups from the new Lighthouse
    assert [line for line in after if "got lighthouse quorum" in line and 'replica_id: "group_0:' in line
            and 'replica_id: "group_1:' in line], err[-3000:]
    said = sorted(line.split("] ", 1)[1].strip() for line in out.splitlines() if " done " in line)
    assert said == [f"TORCHFT group {g} rank {r} done 6" for g in (0, 1) for r in (0, 1)], out[-3000:]
    assert not os.path.exists(f"/proc/{keeper}")
    assert not [p for p in os.listdir("/proc") if p.isdigit() and cmdline(int(p)) == shown]


STEP_TIMEOUT_S = 5  # the groups job's gloo and Manager timeout (its make_manager's step_timeout_s)
STEPS, SLEEP_S = 8, 1.0


def test_a_killed_rank_restarts_its_group_alone_and_the_other_keeps_training(tmp_path):
    """Both groups with one restart each (--max_restarts 1); at group 1's step 3, a kill -9 of its rank 1 (the job's
    rank 3): group 1 alone stops and starts again (its new ranks started <= 0.5 s after xrun saw the death, by the
    kernel's start times against the record's ``at``), heals from group 0, and both groups finish every step; group 0
    keeps its pids and never waits between two steps longer than a step's time + its gloo timeout + 1 s; exit 0;
    summary.json and events.jsonl name the restart, the end line counts it, and ``xrun report`` draws it (in a real
    browser: its mark on rank 3's lane, its row in the table). (A job of its own: a Lighthouse killed in the middle
    of a quorum would restart a group too, above.)"""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "xrun", "--num_gpus", "4", "--no_local_rank", "--replica_groups", "2",
            "--max_restarts", "1", "--log_dir", str(logs), GROUPS_JOB, str(STEPS), str(SLEEP_S)]
    with torchft_xrun(argv, tmp_path) as (xrun, out_path, err_path):
        assert eventually(lambda: (1, 1) in steps(out_path.read_text(), 3), within=60), out_path.read_text()
        again = kill_a_rank_of_group_1(xrun, out_path, err_path, within=60)
        xrun.wait(120)
    out, err = out_path.read_text(), err_path.read_text()
    assert xrun.returncode == 0, err[-3000:]
    assert ("xrun[localhost]: replica group 1: rank 3 was killed by SIGKILL; restarting group 1 (restart 1 of 1), "
            "group 0 keeps running") in err
    said = sorted(line.split("] ", 1)[1].strip() for line in out.splitlines() if " done " in line)
    assert said == [f"TORCHFT group {g} rank {r} done {STEPS}" for g in (0, 1) for r in (0, 1)], out[-3000:]
    pids = started(out)
    assert [len(pids[(0, r)]) for r in (0, 1)] == [1, 1]  # group 0 never restarted: every pid kept
    records = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    (record,) = [line for line in records if line["event"] == "group_restarted"]
    assert json.loads((logs / "summary.json").read_text())["group_restarts"] == [
        {k: v for k, v in record.items() if k not in ("t", "event", "node")}]
    assert (record["group"], record["restart"], record["budget"], record["rank"], record["cause"],
            record["others"]) == (1, 1, 1, 3, "was killed by SIGKILL", [0])
    assert max(again) - record["at"] <= 0.5, (again, record["at"])  # death seen -> group 1 running again
    assert re.search(r"^xrun\[localhost\]: 4 ranks ok in .*; replica group 1 restarted once$", err, re.M), err[-3000:]
    drawn = open_report(Path(report(str(logs))), tmp_path, "group-restart")
    said = ("replica group 1 restarted (restart 1 of 1) on localhost: rank 3 was killed by SIGKILL; group 0 ran on")
    assert said in drawn.svg_text and said in drawn.text  # beside its mark on the timeline, and in the marks' table
    assert "rank 3 (localhost)" in drawn.lanes and "Replica group restarts" in drawn.text
    for r in (0, 1):  # group 0's longest wait between two committed steps, beyond the step's own time
        times = sorted(steps(out, n)[(0, r)] for n in range(1, STEPS + 1) if (0, r) in steps(out, n))
        assert max(b - a for a, b in zip(times, times[1:])) <= SLEEP_S + STEP_TIMEOUT_S + 1, times


@contextmanager
def torchft_xrun(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) \
        -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """xrun running a torchft job, its output in files (torchft's logs fill a pipe); killed if the test leaves it
    running."""
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    env = env or {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
        xrun = subprocess.Popen(argv, stdout=out_file, stderr=err_file, cwd=str(tmp_path), env=env)
    try:
        yield xrun, out_path, err_path
    finally:
        if xrun.poll() is None:
            xrun.kill()
            xrun.wait()


def kill_a_rank_of_group_1(xrun: subprocess.Popen[bytes], out_path: Path, err_path: Path, within: float) \
        -> list[float]:
    """kill -9 of group 1's rank 1; when each of group 1's new runs started (``group_1_started_again``)."""
    (victim,) = started(out_path.read_text())[(1, 1)]
    os.kill(victim, signal.SIGKILL)
    return group_1_started_again(xrun, out_path, err_path, within)


def group_1_started_again(xrun: subprocess.Popen[bytes], out_path: Path, err_path: Path, within: float) -> list[float]:
    """Once both of group 1's ranks started again (within ``within`` s, xrun still running), when each of their new
    runs started (read while they run)."""
    deadline = time.monotonic() + within
    while not all(len(started(out_path.read_text())[(1, r)]) == 2 for r in (0, 1)):
        assert time.monotonic() < deadline and xrun.poll() is None, err_path.read_text()[-3000:]
        time.sleep(0.05)
    return [started_at(started(out_path.read_text())[(1, r)][1]) for r in (0, 1)]


def started(out: str) -> dict[tuple[int, int], list[int]]:
    """(group, rank within it) -> the pids that printed their start, in order."""
    found: dict[tuple[int, int], list[int]] = {(g, r): [] for g in (0, 1) for r in (0, 1)}
    for g, r, pid in re.findall(r"TORCHFT group (\d) rank (\d) pid (\d+)", out):
        found[(int(g), int(r))].append(int(pid))
    return found


def steps(out: str, step: int) -> dict[tuple[int, int], float]:
    """(group, rank within it) -> when it said it committed ``step`` (its last run's time)."""
    return {(int(g), int(r)): float(t) for g, r, t in re.findall(rf"TORCHFT group (\d) rank (\d) step {step} at "
                                                                 r"([\d.]+)", out)}


def started_at(pid: int) -> float:
    """A live process's start on the wall clock, from the kernel's start time (clock ticks since boot)."""
    with open(f"/proc/{pid}/stat") as f:
        since_boot = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# -- supervision by group: the policy (pure) and its ends (real processes, no torch) ----------------------------


def test_a_groups_failure_restarts_that_group_until_its_budget_is_spent():
    policy = GroupPolicy({0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}, budget=1)
    assert policy.members(1) == [2, 3] and not policy.stopping(1)
    restart = policy.fail(3, "was killed by SIGKILL", running={0, 1, 2}, wall=100.0, deadline=50.0)
    assert restart == GroupRestart(group=1, restart=1, budget=1, rank=3, cause="was killed by SIGKILL", at=100.0,
                                   others=(0, 2))
    assert restart.line() == ("replica group 1: rank 3 was killed by SIGKILL; restarting group 1 (restart 1 of 1), "
                              "groups 0, 2 keep running")
    assert GroupRestart.from_json(restart.to_json()) == restart
    assert policy.stopping(1) and not policy.stopping(0)
    assert policy.fail(2, "exited with code 1", running={0, 1}, wall=100.1, deadline=50.1) is None  # already stopping
    assert policy.due() == 50.0 and policy.overdue(49.9) == []
    assert policy.overdue(50.0) == [1] and policy.overdue(60.0) == [] and policy.due() is None  # SIGKILL once
    assert policy.gone(1)  # a group of this node's alone starts again at once
    assert not policy.stopping(1) and policy.restarts(1) == 1
    assert policy.fail(2, "exited with code 1", running={0, 1}, wall=200.0, deadline=150.0) is None  # spent
    assert policy.fail(0, "exited with code 1", running={0}, wall=201.0, deadline=151.0).line().endswith(
        "restarting group 0 (restart 1 of 1), no other group runs on this node")
    assert policy.restarted() == ((0, 1), (1, 1))  # the node's end line says them (restarted_words, below)
    with pytest.raises(ValueError, match="a malformed group restart"):
        GroupRestart.from_json({**restart.to_json(), "group": "1"})


def test_a_group_across_nodes_waits_for_the_heads_start_and_counts_from_it():
    """Group 1 has 2 of its 4 ranks here (WORLD_SIZE 4): shared, so its stop here (a rank's failure, or the head's
    stop_group) ends held, not started again, and the head's start_group carries the restart count; group 0 lies
    here alone and restarts on its own."""
    env = {0: {"REPLICA_GROUP_ID": "0", "WORLD_SIZE": "2"}, 1: {"REPLICA_GROUP_ID": "1", "WORLD_SIZE": "4"}}
    policy = GroupPolicy.of([(0, env[0]), (1, env[0]), (4, env[1]), (5, env[1])], budget=2)
    assert policy.shared == {1}
    restart = policy.fail(4, "was killed by SIGKILL", running={0, 1}, wall=10.0, deadline=5.0)
    assert restart is not None and restart.restart == 1 and policy.stopping(1)
    assert restart.line(across_nodes=True) == (
        "replica group 1: rank 4 was killed by SIGKILL; stopping its ranks on this node, the head restarts group 1 "
        "on every node it spans (restart 1 of 2)")
    assert not policy.order_stop(1, deadline=6.0)  # the head's stop_group for the stop under way: nothing new
    assert not policy.gone(1) and policy.held() and policy.stopping(1)  # its ranks here gone: held for the head
    assert not policy.start(0, 1)  # group 0 is not held
    assert policy.start(1, 1) and not policy.held() and not policy.stopping(1) and policy.restarts(1) == 1
    assert not policy.order_stop(0, deadline=7.0)  # group 0 is this node's own: the head never stops it
    assert policy.order_stop(1, deadline=7.0) and policy.due() == 7.0  # a rank of it failed on another node
    assert not policy.gone(1) and policy.start(1, 2) and policy.restarts(1) == 2
    assert policy.fail(5, "exited with code 1", running={0}, wall=11.0, deadline=8.0) is None  # spent: the job fails


def test_the_end_line_says_which_groups_restarted_how_often_once():
    """The success line (the node's for a local run, the head's, from the nodes' group_restarted, for several) and a
    failed node's first line: each group restarted, counted, not a phrase per restart."""
    figures = [RankFigures("a", r, r, 12.0, 1.0, None, "exit code 0", True) for r in range(4)]
    assert restarted_words({}) == "" and restarted_words({0: 0}) == ""
    assert success_line(figures, (), {1: 2}) == "4 ranks ok in 12.0 s; replica group 1 restarted twice"
    assert restarted_words({3: 3, 0: 1}) == "replica group 0 restarted once, group 3 3 times"
    assert restarted_words({g: 1 for g in range(GROUPS_NAMED + 1)}) == (
        f"{GROUPS_NAMED + 1} replica groups restarted, {GROUPS_NAMED + 1} times in all")
    head = JobFigures()
    said = GroupRestart(group=1, restart=1, budget=2, rank=3, cause="was killed by SIGKILL", at=1.0, others=())
    for _ in range(2):
        head.reads()[Kind.GROUP_RESTARTED](1, message(Kind.GROUP_RESTARTED, **said.to_json()), 0.0)
    assert head.group_restarts == {1: 2}
    with pytest.raises(ValueError, match="a malformed group restart"):
        head.reads()[Kind.GROUP_RESTARTED](1, message(Kind.GROUP_RESTARTED, group=1), 0.0)


GROUP_RANK = os.path.join(ROOT, "tests", "procs", "group_rank.py")


def test_a_group_that_always_fails_spends_its_budget_and_the_job_fails(tmp_path):
    """Group 1's rank 1 exits 3 in every run, --max_restarts 1, --preload: group 1 is started again once (forked
    from the preload helper, TORCHELASTIC_RESTART_COUNT 1) while group 0 keeps its pids; its second failure fails the
    job with its code, said in the console and summary.json."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    done = run_xrun("--num_gpus", "4", "--no_local_rank", "--replica_groups", "2", "--max_restarts", "1",
                    "--preload", "preload_mark", "--log_dir", str(tmp_path), GROUP_RANK, "1.1", timeout=60)
    assert done.returncode == 3, done.stderr[-3000:]
    runs = [json.loads(line.split("] ", 1)[1]) for line in done.stdout.splitlines() if '] {"group"' in line]
    helper = int(re.search(r"forked from the helper \(pid (\d+)\)", done.stderr).group(1))
    assert sorted((r["group"], r["rank"], r["restart"]) for r in runs) == [
        (0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert {r["mark"] for r in runs} == {helper}  # every run forked from the one helper, the group's restart too
    assert ("xrun[localhost]: replica group 1: rank 3 exited with code 3; restarting group 1 (restart 1 of 1), group 0 "
            "keeps running") in done.stderr
    assert ("xrun[localhost]: replica group 1: rank 3 exited with code 3; its 1 restart(s) are spent (--max_restarts "
            "1): the job fails") in done.stderr
    assert re.search(r"^xrun: node localhost: rank 3 failed first: exit code 3 after [\d.]+ s; replica group 1 "
                     r"restarted once$", done.stderr, re.M), done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_code"] == 3 and summary["root_cause"]["rank"] == 3
    assert [(g["group"], g["restart"], g["rank"]) for g in summary["group_restarts"]] == [(1, 1, 3)]


def test_the_lighthouse_gone_for_good_fails_the_job(tmp_path):
    """Its keeper gone (here: killed) while the ranks run: every rank is stopped and the job fails, saying why."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out_path = tmp_path / "out"
    with open(out_path, "wb") as out_file:
        xrun = subprocess.Popen([sys.executable, "-m", "xrun", "--num_gpus", "2", "--no_local_rank",
                                 "--replica_groups", "2", GROUP_RANK, "none"], stdout=out_file,
                                stderr=subprocess.PIPE, text=True, cwd=str(tmp_path), env=env)
    try:
        assert eventually(lambda: out_path.read_text().count('] {"group"') == 2, within=30)  # the ranks run
        (keeper,) = [p for p in children(xrun.pid) if "replicas.lighthouse" in cmdline(p)]
        os.kill(keeper, signal.SIGKILL)
        _, err = xrun.communicate(timeout=60)
    finally:
        if xrun.poll() is None:
            xrun.kill()
            xrun.wait()
    assert xrun.returncode == 1, err[-3000:]
    assert (f"torchft's Lighthouse is gone for good (its keeper, pid {keeper}, exited with code -9): the replica groups "
            "cannot meet any more, so the job fails (--replica_groups); stopping 2 ranks") in err


def test_a_nodes_ranks_of_a_group_across_nodes_wait_held_for_the_heads_start(tmp_path):
    """Real processes, no torch: the node holds rank 3 of group 1 (WORLD_SIZE 2: the group spans nodes) beside rank
    0, group 0's alone (WORLD_SIZE 1), which ends at once. Rank 3 fails in its first run: the node tells the head
    (on_group_failed) and, once the rank is gone, that the group's ranks here are gone (on_group_stopped); the node
    waits held with no rank running, its loop alive, until the head's start (0.3 s later, here through a pipe
    another thread writes), which starts rank 3 again as restart 1; it ends 0, the node too."""
    from xrun.launch.ranks.processes import RankProcess
    from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions

    path = {"PATH": "/bin:/usr/bin"}
    procs = [RankProcess(0, 0, ("true",), {**path, "REPLICA_GROUP_ID": "0", "WORLD_SIZE": "1"}),
             RankProcess(3, 1, ("sh", "-c", 'exit $((3 - 3 * TORCHELASTIC_RESTART_COUNT))'),  # 3, then 0
                         {**path, "REPLICA_GROUP_ID": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"})]
    said: list[tuple[object, ...]] = []
    wake_r, wake_w = os.pipe()
    group: RankGroup

    def stopped(g: int) -> None:
        said.append(("stopped", g, time.monotonic()))
        threading.Timer(0.3, os.write, (wake_w, b"!")).start()  # the head's start_group, a round trip later

    def head_says_start() -> None:
        os.read(wake_r, 1)
        said.append(("start", 1, time.monotonic()))
        group.start_group(1, 1)

    group = RankGroup(procs, SuperviseOptions(host="h", quiet=True, shutdown_timeout=5, group_restarts=1),
                      on_group_failed=lambda r: said.append(("failed", r.group, r.rank, r.restart)),
                      on_group_stopped=stopped, on_group_restart=lambda r: said.append(("own", r)))
    group.add_reader(wake_r, head_says_start)
    try:
        result = group.run()
    finally:
        os.close(wake_r)
        os.close(wake_w)
    assert result.exit_code == 0 and [o.returncode for o in result.outcomes] == [0, 0], result
    assert [s[:4] if s[0] == "failed" else s[:2] for s in said] == [("failed", 1, 3, 1), ("stopped", 1), ("start", 1)]
    assert float(said[2][2]) - float(said[1][2]) >= 0.25  # held for the head's word, the loop still running
    assert result.group_restarts == ((1, 1),)
