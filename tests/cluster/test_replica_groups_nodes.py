"""``--replica_groups`` across real hosts (network-namespace nodes with sshd; issue 39 §2): torchft 0.2.0's Manager,
2 groups of 2 ranks, each group on a node of its own, the Lighthouse on node 0. A ``kill -9`` of a rank of group 1
(node 1) restarts group 1 alone, on its node (its ranks running again <= 0.5 s after node2's agent saw the death):
group 0 keeps every pid and trains on, group 1 heals from it (the
Managers meet across nodes: the quorum's store is one group's, at its node's address), both groups finish, exit 0,
and nothing is left on either node; the head's end line counts the restart. The job is tests/test_replica_groups.py's.
Started from node1 over ssh and pdsh, and in pod mode: each node's own xrun (``--pod --node_rank K``), node 0's
console and record showing both nodes. A group across nodes (node2 and node3), restarted by the head on both while
node1's group trains on, is the last test."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.cluster.jobs import MARK
from tests.cluster.test_restarts import assert_nothing_left
from tests.conftest import ROOT, torchft_missing
from tests.test_replica_groups import (
    GROUPS_JOB,
    STEP_TIMEOUT_S,
    group_1_started_again,
    kill_a_rank_of_group_1,
    started,
    steps,
    torchft_xrun,
)

STEPS, SLEEP_S, KILL_AT = 6, 1.0, 2
PORT = 29650  # group 0's store on node1, group 1's on node2 at +1, the Lighthouse on node1 at +2


@pytest.mark.parametrize("backend", ["ssh", "pdsh", "pod"])
def test_a_killed_rank_restarts_its_group_on_its_node_and_the_other_node_keeps_training(cluster, tmp_path, python,
                                                                                       backend):
    why = torchft_missing()
    if why:
        pytest.skip(why)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=2, nodes=["node1", "node2"])
    mark, logs = uuid.uuid4().hex, tmp_path / "logs"
    env = dict(os.environ, PYTHONPATH=ROOT, TORCH_CPP_LOG_LEVEL="ERROR", GLOO_SOCKET_IFNAME="xceth0", **{MARK: mark})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    common = [sys.executable, "-m", "xrun", "-H", str(hostfile), f"--export={MARK}", "--export=GLOO_SOCKET_IFNAME",
              "--export=TORCH_CPP_LOG_LEVEL", "--shutdown_timeout", "5", "--master_port", str(PORT), "--no_local_rank",
              "--replica_groups", "2", "--max_restarts", "1"]
    job = [GROUPS_JOB, str(STEPS), str(SLEEP_S)]
    if backend == "pod":  # each node's own xrun; node 0's (node1) hosts the channel, the Lighthouse and the record
        argv = cluster.node_argv("node1", [*common, "--pod", "--node_rank", "0", "--log_dir", str(logs), *job])
        others = [cluster.node_argv("node2", [*common, "--pod", "--node_rank", "1", *job])]
    else:
        argv = [*common, "--launcher", backend, "--python", python, "--ssh_config", str(cluster.ssh_config),
                "--log_dir", str(logs), *job]
        others = []
    t0 = time.monotonic()
    with ExitStack() as stack:
        nodes = [stack.enter_context(torchft_xrun(other, mkdir(tmp_path / f"node{k + 2}"), env))
                 for k, other in enumerate(others)]
        xrun, out_path, err_path = stack.enter_context(torchft_xrun(argv, tmp_path, env))
        wait_for_group_1_at_the_kills_step(xrun, out_path, err_path)
        again = kill_a_rank_of_group_1(xrun, out_path, err_path, within=30)  # one PID space: node2's rank 3
        xrun.wait(120)
        for other, _, other_err in nodes:  # every node's xrun exits with the job's code
            assert other.wait(30) == 0, other_err.read_text()[-3000:]
    out, err = out_path.read_text(), err_path.read_text()
    print(f"{backend}: the job took {time.monotonic() - t0:.1f} s")
    assert xrun.returncode == 0, err[-3000:]
    assert ("xrun[node2]: replica group 1: rank 3 was killed by SIGKILL; restarting group 1 (restart 1 of 1), no other "
            "group runs on this node") in err, err[-3000:]
    # the head's end line counts it, from node2's word (a local run's is its node's: tests/test_replica_groups.py)
    assert re.search(r"^xrun: 4 ranks ok in .*; replica group 1 restarted once$", err, re.M), err[-3000:]
    pids = assert_both_finished_and_group_1_alone_restarted(out, group_1_on=("node2", "node2"))
    (record,) = json.loads((logs / "summary.json").read_text())["group_restarts"]
    assert (record["host"], record["group"], record["rank"], record["cause"], record["others"]) == (
        "node2", 1, 3, "was killed by SIGKILL", [])
    print(f"{backend}: group 1's death seen -> its ranks running again: {max(again) - record['at']:.3f} s")
    assert max(again) - record["at"] <= 0.5, (again, record["at"])  # the namespaces share this machine's clock
    assert_group_1_healed_and_group_0_never_stalled(out, pids)
    assert_nothing_left(cluster, mark)


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_a_lost_nodes_group_moves_to_the_hot_spare_and_the_other_node_keeps_training(cluster, tmp_path, python,
                                                                                    backend):
    """node2 (group 1's) killed whole at group 1's step 2, node3 standing by: group 1 starts again on node3 (its
    store and MASTER_ADDR there, its restart counted), node1's group 0 keeps every pid, both finish, exit 0."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=2, nodes=["node1", "node2", "node3"])
    logs = tmp_path / "logs"
    argv, env, mark = ssh_job(cluster, python, hostfile, logs, "--spares", "1", backend=backend)
    with torchft_xrun(argv, tmp_path, env) as (xrun, out_path, err_path):
        wait_for_group_1_at_the_kills_step(xrun, out_path, err_path)
        killed, again = kill_node2(cluster, xrun, out_path, err_path)
    out, err = out_path.read_text(), err_path.read_text()
    assert_node2_moved_to(xrun, err, "node3")
    said = sorted(line.split("] ", 1)[1].strip() for line in out.splitlines() if " done " in line)
    assert said == [f"TORCHFT group {g} rank {r} done {STEPS}" for g in (0, 1) for r in (0, 1)], out[-3000:]
    done_on = {(g, r): h for h, g, r in re.findall(r"\[(node\d):\d+\] TORCHFT group (\d) rank (\d) done", out)}
    assert done_on == {("0", "0"): "node1", ("0", "1"): "node1", ("1", "0"): "node3", ("1", "1"): "node3"}, out
    pids = started(out)
    assert [len(pids[(0, r)]) for r in (0, 1)] == [1, 1]  # group 0 never signalled: every pid kept
    assert [len(pids[(1, r)]) for r in (0, 1)] == [2, 2]  # group 1 started again, on node3
    assert_group_1_healed_and_group_0_never_stalled(out, pids)
    summary = json.loads((logs / "summary.json").read_text())
    (record,) = summary["group_restarts"]
    assert (record["host"], record["group"], record["restart"], record["rank"], record["others"]) == (
        "node3", 1, 1, 2, []), record
    assert record["cause"].startswith("was lost with its node node2 (lost node node2: "), record
    print(f"{backend}: node2 killed -> the head moved group 1 to node3: {record['at'] - killed:.3f} s, its ranks "
          f"running again there {max(again) - record['at']:.3f} s later")
    assert max(again) - record["at"] <= 0.5, (again, record["at"])  # the namespaces share this machine's clock
    assert [a["replaced"] for a in summary["attempts"]] == [
        [{"node_rank": 1, "lost_host": "node2", "spare_host": "node3", "attempt": 0}]], summary["attempts"]
    assert_nothing_left(cluster, mark)


def test_a_killed_rank_of_a_group_across_nodes_restarts_it_on_both_and_the_other_group_keeps_training(
        cluster, tmp_path, python):
    """Group 0 on node1 (2 slots: its node's own), group 1 across node2 and node3 (1 slot each: the head's, its
    store on node2, its rank 0's node). A kill -9 of group 1's rank 1 on node3 at its step 2: node3 stops its rank
    of it and tells the head, which stops node2's, waits for both to be gone, then starts both again; node1 hears
    nothing and group 0 keeps every pid; group 1 heals from group 0; both finish, exit 0, nothing left; the record
    has one entry for the restart, from the head, naming both hosts."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=1\nnode3 slots=1\n")
    logs = tmp_path / "logs"
    argv, env, mark = ssh_job(cluster, python, hostfile, logs)
    t0 = time.monotonic()
    with torchft_xrun(argv, tmp_path, env) as (xrun, out_path, err_path):
        wait_for_group_1_at_the_kills_step(xrun, out_path, err_path)
        again = kill_a_rank_of_group_1(xrun, out_path, err_path, within=30)  # one PID space: node3's rank 3
        xrun.wait(120)
    out, err = out_path.read_text(), err_path.read_text()
    print(f"across nodes: the job took {time.monotonic() - t0:.1f} s")
    assert xrun.returncode == 0, err[-3000:]
    assert ("xrun[node3]: replica group 1: rank 3 was killed by SIGKILL; stopping its ranks on this node, the head "
            "restarts group 1 on every node it spans (restart 1 of 1)") in err, err[-3000:]
    assert ("xrun: replica group 1: rank 3 was killed by SIGKILL on node3; restarting group 1 on node2, node3 "
            "(restart 1 of 1), every other group keeps running") in err, err[-3000:]
    assert "xrun[node2]: replica group 1: stopping its ranks on this node, as it lost a rank or a node elsewhere" in err
    assert "xrun[node1]: replica group" not in err  # node1 holds no rank of group 1: it hears nothing
    assert re.search(r"^xrun: 4 ranks ok in .*; replica group 1 restarted once$", err, re.M), err[-3000:]
    pids = assert_both_finished_and_group_1_alone_restarted(out, group_1_on=("node2", "node3"))
    (record,) = json.loads((logs / "summary.json").read_text())["group_restarts"]
    assert (record["host"], record["hosts"], record["group"], record["restart"], record["rank"], record["cause"]) == (
        "node3", ["node2", "node3"], 1, 1, 3, "was killed by SIGKILL"), record
    print(f"across nodes: group 1's death seen -> its ranks running again on both nodes: "
          f"{max(again) - record['at']:.3f} s")
    assert max(again) - record["at"] <= 0.5, (again, record["at"])  # the namespaces share this machine's clock
    assert_group_1_healed_and_group_0_never_stalled(out, pids)
    assert_nothing_left(cluster, mark)


def wait_for_group_1_at_the_kills_step(xrun, out_path: Path, err_path: Path) -> None:
    deadline = time.monotonic() + 60
    while (1, 1) not in steps(out_path.read_text(), KILL_AT):
        assert time.monotonic() < deadline and xrun.poll() is None, (out_path.read_text()[-3000:],
                                                                      err_path.read_text()[-3000:])
        time.sleep(0.05)


def assert_group_1_healed_and_group_0_never_stalled(out: str, pids: dict[tuple[int, int], list[int]]) -> None:
    """Group 1's new run healed from group 0 (its first step is past the kill's, not step 0); group 0's longest
    wait between two committed steps stayed within a step + its gloo timeout + 1 s."""
    for r in (0, 1):
        rerun = out[out.index(f"TORCHFT group 1 rank {r} pid {pids[(1, r)][1]}"):]
        first = re.search(rf"TORCHFT group 1 rank {r} step (\d+) at", rerun)
        assert first is not None and int(first.group(1)) > KILL_AT, rerun[:2000]
    for r in (0, 1):
        times = sorted(steps(out, n)[(0, r)] for n in range(1, STEPS + 1) if (0, r) in steps(out, n))
        assert max(b - a for a, b in zip(times, times[1:])) <= SLEEP_S + STEP_TIMEOUT_S + 1, times


def assert_both_finished_and_group_1_alone_restarted(out: str, group_1_on: tuple[str, str]
                                                     ) -> dict[tuple[int, int], list[int]]:
    """Every rank finished every step; group 0 ran on node1 and kept every pid, group 1's two ranks (on
    ``group_1_on``) started twice each. The pids, by (group, rank within it)."""
    said = sorted(line.split("] ", 1)[1].strip() for line in out.splitlines() if " done " in line)
    assert said == [f"TORCHFT group {g} rank {r} done {STEPS}" for g in (0, 1) for r in (0, 1)], out[-3000:]
    hosts = {(int(g), int(r)): h for h, g, r in re.findall(r"\[(node\d):\d+\] TORCHFT group (\d) rank (\d) pid", out)}
    assert hosts == {(0, 0): "node1", (0, 1): "node1", (1, 0): group_1_on[0], (1, 1): group_1_on[1]}, out[-3000:]
    pids = started(out)
    assert [len(pids[(0, r)]) for r in (0, 1)] == [1, 1]  # group 0 never signalled: every pid kept
    assert [len(pids[(1, r)]) for r in (0, 1)] == [2, 2]  # group 1 started again
    return pids


def ssh_job(cluster, python: str, hostfile: Path, logs: Path, *flags: str, backend: str = "ssh"
            ) -> tuple[list[str], dict[str, str], str]:
    """The torchft job over ssh (or pdsh), 2 groups with a restart each (and ``flags``): its argv, its environment,
    its mark."""
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=ROOT, TORCH_CPP_LOG_LEVEL="ERROR", GLOO_SOCKET_IFNAME="xceth0", **{MARK: mark})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", backend, "--python", python,
            "--ssh_config", str(cluster.ssh_config), f"--export={MARK}", "--export=GLOO_SOCKET_IFNAME",
            "--export=TORCH_CPP_LOG_LEVEL", "--shutdown_timeout", "5", "--master_port", str(PORT), "--no_local_rank",
            "--replica_groups", "2", "--max_restarts", "1", *flags, "--log_dir", str(logs), GROUPS_JOB, str(STEPS),
            str(SLEEP_S)]
    return argv, env, mark


def test_a_lost_node_of_a_group_across_nodes_hands_its_ranks_to_the_spare_and_the_group_restarts_there(
        make_cluster, tmp_path, python):
    """The issue's 2 groups and a spare: group 0 on node1, group 1 across node2 (its leader: rank 0, the store) and
    node3, node4 standing by (a cluster of 4 of this test's own). node2 killed whole at group 1's step 2: node4 takes
    its place, node3 stops its rank of group 1 and, once it is gone and node4 is ready, both start it again, node3's
    meeting at node4 now; node1's group 0 keeps every pid; both finish, exit 0, nothing left."""
    why = torchft_missing()
    if why:
        pytest.skip(why)
    cluster = make_cluster(4)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=1\nnode3 slots=1\nnode4 slots=1\n")
    logs = tmp_path / "logs"
    argv, env, mark = ssh_job(cluster, python, hostfile, logs, "--spares", "1")
    with torchft_xrun(argv, tmp_path, env) as (xrun, out_path, err_path):
        wait_for_group_1_at_the_kills_step(xrun, out_path, err_path)
        killed, again = kill_node2(cluster, xrun, out_path, err_path)  # group 1's rank 0 and its store with it
    out, err = out_path.read_text(), err_path.read_text()
    assert_node2_moved_to(xrun, err, "node4")
    assert "xrun[node3]: replica group 1: stopping its ranks on this node, as it lost a rank or a node elsewhere" in err
    assert "xrun[node1]: replica group" not in err  # node1 holds no rank of group 1: it hears nothing
    pids = assert_both_finished_and_group_1_alone_restarted(out, group_1_on=("node4", "node3"))
    assert_group_1_healed_and_group_0_never_stalled(out, pids)
    assert re.search(r"\[node3:\d+\] TORCHFT group 1 rank 1 pid \d+ meets at node4", out) is not None, out[-3000:]
    (record,) = json.loads((logs / "summary.json").read_text())["group_restarts"]
    assert (record["host"], record["group"], record["restart"], record["rank"]) == ("node4", 1, 1, 2), record
    print(f"node2 (group 1's leader) killed -> the head moved it to node4: {record['at'] - killed:.3f} s, group 1's "
          f"ranks running again on node4 and node3 {max(again) - record['at']:.3f} s later")
    assert max(again) - record["at"] <= 0.5, (again, record["at"])
    assert_nothing_left(cluster, mark)


def kill_node2(cluster, xrun, out_path: Path, err_path: Path) -> tuple[float, list[float]]:
    """node2 killed whole (its agent, its ranks, its sshd), then the job waited to its end: when it was killed, and
    when each of group 1's new runs started (read while they ran)."""
    killed = time.time()
    cluster.kill_node("node2")
    again = group_1_started_again(xrun, out_path, err_path, within=30)
    xrun.wait(120)
    return killed, again


def assert_node2_moved_to(xrun, err: str, spare: str) -> None:
    """The job ended 0, and said that the hot spare took node2's place and its groups."""
    assert xrun.returncode == 0, err[-3000:]
    assert f"xrun: node 1 (node2) is lost: the hot spare {spare} takes its place (node rank 1, same slots)" in err, err
    assert (f"xrun: the replica groups of node2 start again on {spare} (group 1 restart 1 of 1); every other node's "
            "groups keep running") in err, err[-3000:]
