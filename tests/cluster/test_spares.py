"""Hot spares across real hosts (issue 23): ``--spares N`` over ssh and pdsh.

The last host of the hostfile stands by outside the world; real torch gloo ranks checkpoint every step to a file
(the nodes share the filesystem) and resume from it. A node killed mid-run is replaced by the spare (same node rank,
same slots) and the job finishes at the same world size with exit 0; two nodes lost with one spare end the job
naming both. Nothing is left on any node after either. The helpers are tests/cluster/test_restarts.py's and
tests/cluster/jobs.py's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.jobs import python_wrapper, started
from tests.cluster.test_network import MARKED_SCRIPT, agents_left, heal_ingress, refuse_inbound, run_job, slow_ingress
from tests.cluster.test_restarts import assert_nothing_left, lines_of, start
from tests.conftest import ROOT
from tests.report_browser import open_report


def assert_idle(cluster, node, timeout=15.0):
    """Nothing but the node's sshd is left in its namespace: the spare's agent, told the end, exited."""
    deadline = time.monotonic() + timeout
    while left := [p for p in cluster.pids(node) if p != cluster.sshd_pid(node)]:
        assert time.monotonic() < deadline, f"left on {node}: {left}"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_a_killed_node_is_replaced_by_the_hot_spare_and_the_job_finishes(cluster, tmp_path, python, backend):
    logs = tmp_path / "logs"
    proc, mark = start(cluster, tmp_path, python, backend, "--max_restarts", "2", "--spares", "1",
                       "--log_dir", str(logs), env={"STEP_S": "1"})
    lines = started(proc, 2)
    killed = time.time()
    cluster.kill_node("node2")  # node rank 1: its agent, its ranks, its sshd
    rest, err = proc.communicate(timeout=120)
    out = "".join(lines) + rest  # the reader thread and communicate() share the pipe
    assert proc.returncode == 0, err
    assert "xrun: spare node3 is standing by" in err
    assert "node 1 (node2) is lost: the hot spare node3 takes its place (node rank 1, same slots); node2 is not " \
           "used again" in err
    assert re.search(r"attempt 0 \([\d.]+ s\): lost node node2", err), err
    assert re.search(r"attempt 1 \([\d.]+ s\): succeeded \(on node3 in place of node2 \(node 1\)\)", err), err
    resumed = re.findall(r"\[(node\d):(\d)\] RESUME 1 (\d) (\d+)", out)
    assert sorted((host, rank) for host, rank, _, _ in resumed) == [("node1", "0"), ("node3", "1")], out
    assert len({step for *_, step in resumed}) == 1 and int(resumed[0][3]) > 0  # both resumed the checkpoint
    assert sorted(tuple(words) for words in lines_of(out, "DONE")) == [("1", "0", "6"), ("1", "1", "6")]
    restarted = max(float(words[2]) for words in lines_of(out, "STARTED") if words[0] == "1")
    print(f"{backend}: node killed -> every rank of attempt 1 started on the spare: {restarted - killed:.2f} s")
    assert restarted - killed < 10.0
    summary = json.loads((logs / "summary.json").read_text())
    assert [a["replaced"] for a in summary["attempts"]] == [
        [], [{"node_rank": 1, "lost_host": "node2", "spare_host": "node3", "attempt": 1}]]
    # the record (docs/events.md): the spare joined, node2 lost, the spare swapped in before attempt 1 started
    events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert [e["host"] for e in events if e["event"] == "spare_joined"] == ["node3"]
    lost = [(e["attempt"], e["host"]) for e in events if e["event"] == "node_lost"]
    assert lost == [(0, "node2")], lost
    swap = events[kinds.index("spare_swapped")]
    assert (swap["attempt"], swap["node"], swap["lost_host"], swap["spare_host"]) == (1, 1, "node2", "node3")
    assert kinds.index("node_lost") < kinds.index("spare_swapped") < kinds.index("attempt_started", kinds.index(
        "spare_swapped"))
    assert sorted(e["host"] for e in events if e["event"] == "node_started" and e["attempt"] == 1) == ["node1",
                                                                                                      "node3"]
    assert summary["goodput"]["lost_s"]["restarts"] > 0
    # report.html (issue 40 §2) in a real browser: node 1's lane names both its hosts, the swap and the restart are
    # marked with their causes, a lane per rank
    drawn = open_report(logs / "report.html", tmp_path, f"spare-swap-{backend}")
    assert sorted(drawn.lanes) == ["job", "node 0 (node1)", "node 1 (node2 → node3)", "rank 0 (node1)",
                                   "rank 1 (node2 → node3)"], drawn.lanes
    assert "attempt 0 on node2: no exit in the record (its node was lost)" in drawn.text  # rank 1's first span
    assert "spare node3 takes node 1's place from node2 (attempt 1 on)" in drawn.svg_text
    assert "restart after attempt 0: lost node node2" in drawn.svg_text and "node 1 (node2) lost" in drawn.text
    assert_nothing_left(cluster, mark)


def test_two_lost_nodes_with_one_spare_end_the_job_naming_both(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "3", "--spares", "1",
                       env={"STEP_S": "2"})
    started(proc, 2)
    cluster.cut("node1")  # both silent from the same moment: the keepalive loses them in the same round
    cluster.cut("node2")
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert "stopped restarting after 0 restart(s): 2 node(s) lost (node1, node2) and 1 spare(s) on standby to " \
           "take their places" in err
    assert_nothing_left(cluster, mark, timeout=30.0)  # the cut nodes' agents stop their ranks once the head is silent
    assert_idle(cluster, "node3")


def test_ctrl_c_stops_the_job_and_the_standing_spare(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "2", "--spares", "1",
                       env={"STEP_S": "2"})
    started(proc, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "xrun: spare node3 is standing by" in err and "spare node3 is lost" not in err
    assert_nothing_left(cluster, mark)
    assert_idle(cluster, "node3")


def test_precheck_replaces_a_node_it_finds_bad_by_the_spare_before_any_rank(cluster, tmp_path, python):
    refuse_inbound(cluster, "node2")  # its agent still reaches the head; its probe server is refused: unreachable
    try:
        done, _ = run_job(cluster, tmp_path, python, "--precheck", "--max_restarts", "1", "--spares", "1",
                          script_text=MARKED_SCRIPT)
    finally:
        refuse_inbound(cluster, "node2", on=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-node1", "started-node3"]
    assert "precheck: 1 node(s) bad: node2 unreachable" in done.stderr
    assert "node 1 (node2) is lost: the hot spare node3 takes its place" in done.stderr
    assert "restarting" not in done.stderr  # replaced before the start: not a restart


# -- --precheck --spares without --max_restarts (issue 33): the spare replaces only a node the check finds bad --------

def test_without_restarts_the_precheck_seats_the_spare_in_a_slow_nodes_place_before_any_rank(cluster, tmp_path, python):
    logs = tmp_path / "logs"
    slow_ingress(cluster, "node2")  # before the job: the first check finds it (3 checked: node1, node2, spare node3)
    try:
        done, _ = run_job(cluster, tmp_path, python, "--precheck", "--spares", "1", "--log_dir", str(logs),
                          script_text=MARKED_SCRIPT)
    finally:
        heal_ingress(cluster, "node2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-node1", "started-node3"]  # never node2
    err = done.stderr
    assert "spare node3 is standing by (hot: it takes the place of a node --precheck finds bad before the start)" in err
    (why,) = [line for line in err.splitlines() if "precheck: 1 node(s) bad: node2 slow: throughput" in line]
    assert "hot spares take their places (checked in " in why, why
    assert "node 1 (node2) is lost: the hot spare node3 takes its place (node rank 1, same slots)" in err
    assert "restart" not in err, err  # no restart: none was asked for, none happened
    (attempt,) = json.loads((logs / "summary.json").read_text())["attempts"]
    assert attempt["replaced"] == [{"node_rank": 1, "lost_host": "node2", "spare_host": "node3", "attempt": 0}]
    assert attempt["root_cause"] is None
    deadline = time.monotonic() + 10
    while agents_left(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert agents_left(cluster) == []


def test_without_restarts_a_node_lost_after_the_start_ends_the_job_and_the_spare_exits(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--precheck", "--spares", "1", env={"STEP_S": "2"})
    started(proc, 2)
    cluster.kill_node("node2")  # node rank 1, after the start: no restart, so the standing spare cannot help
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert re.search(r"precheck passed: 3 node\(s\) ok in", err), err
    assert "xrun: job failed: lost node node2: " in err
    assert "xrun: 1 node(s) lost (node2) and 1 spare(s) on standby: without --max_restarts a spare takes only the " \
           "place of a node --precheck finds bad before the start; give --max_restarts N to let one take a lost " \
           "node's place at a restart" in err
    assert "hot spare node3 takes its place" not in err and "spare node3 is lost" not in err
    assert_nothing_left(cluster, mark)
    assert_idle(cluster, "node3")  # told the verdict, the spare's agent exited


# Attempt 0's ranks wait for the test's word (a file), then rank 0 fails; attempt 1's end at once. Each rank leaves
# a file named after its attempt and host the moment it starts.
ATTEMPT_SCRIPT = """import os, socket, sys, time
here = os.path.dirname(os.path.abspath(sys.argv[0]))
attempt, host = os.environ["TORCHELASTIC_RESTART_COUNT"], socket.gethostname()
open(os.path.join(here, f"started-{attempt}-{host}"), "w").close()
if attempt == "0":
    while not os.path.exists(os.path.join(here, "fail")):
        time.sleep(0.05)
    if os.environ["RANK"] == "0":
        sys.exit(3)
    time.sleep(60)
print("DONE", attempt, host, flush=True)
"""


def test_a_link_gone_bad_during_an_attempt_is_found_by_the_restarts_precheck_and_the_spare_runs_instead(
        make_cluster, tmp_path, python):
    cluster = make_cluster(4)  # node1-node3 the world, node4 the spare
    script = tmp_path / "attempts.py"
    script.write_text(ATTEMPT_SCRIPT)
    argv = [sys.executable, "-m", "xrun", "-H", str(cluster.hostfile(tmp_path / "hosts", slots=1)), "--launcher", "ssh",
            "--python", python, "--ssh_config", str(cluster.ssh_config), "--shutdown_timeout", "5", "--master_port",
            "0", "--precheck", "--max_restarts", "1", "--spares", "1", str(script)]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started-0-*"))) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        slow_ingress(cluster, "node2")  # while attempt 0 runs: its link goes bad
        failed = time.monotonic()
        (tmp_path / "fail").touch()  # rank 0 fails: the restart follows
        out, err = proc.communicate(timeout=120)
    finally:
        heal_ingress(cluster, "node2")
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert sorted(p.name for p in tmp_path.glob("started-0-*")) == [f"started-0-node{i}" for i in (1, 2, 3)]
    assert sorted(p.name for p in tmp_path.glob("started-1-*")) == [f"started-1-node{i}" for i in (1, 3, 4)]
    assert len(re.findall(r"precheck passed: 4 node\(s\) ok in", err)) == 1, err  # attempt 0's: no node slow yet
    (why,) = [line for line in err.splitlines() if "precheck: 1 node(s) bad: node2 slow: throughput" in line]
    assert why.endswith(" s)") and "hot spares take their places (checked in " in why, why
    assert "node 1 (node2) is lost: the hot spare node4 takes its place" in err
    assert re.search(r"attempt 0 \([\d.]+ s\): rank 0 \(local 0\) on node1 exited with code 3", err), err
    assert re.search(r"attempt 1 \([\d.]+ s\): succeeded \(on node4 in place of node2 \(node 1\)\)", err), err
    assert sorted(line.split("DONE ", 1)[1] for line in out.splitlines() if "] DONE " in line) == [
        "1 node1", "1 node3", "1 node4"], out
    print(f"rank failed -> attempt 1 over on the spare: {time.monotonic() - failed:.1f} s; {why.rsplit('(', 1)[1]}")


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_a_spare_that_cannot_be_reached_is_dropped_and_the_job_runs(cluster, tmp_path, python, backend):
    cluster.kill_node("node3")  # its sshd too: the spare's session cannot start
    proc, mark = start(cluster, tmp_path, python, backend, "--max_restarts", "1", "--spares", "1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert re.search(r"spare node3 is lost: its session ended before its agent joined.*; 0 spare\(s\) left", err), err
    assert sorted(tuple(words) for words in lines_of(out, "DONE")) == [("0", "0", "6"), ("0", "1", "6")]
    assert_nothing_left(cluster, mark)


def test_a_node_whose_agent_cannot_start_is_replaced_before_any_rank_ran(cluster, tmp_path, python):
    # node2's interpreter refuses to start there: its agent never joins, its session ends; the other node, stopped at
    # the first barrier, waits for the restart instead of leaving, and the spare runs node 1 from attempt 1
    python_wrapper(tmp_path / "python", prelude='[ "$(hostname)" = node2 ] && exit 7\n')  # the fixture's, rewritten
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "1", "--spares", "1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "node 1 (node2) is lost: the hot spare node3 takes its place" in err
    assert re.findall(r"\[(node\d):(\d)\] DONE 1 \d 6", out) == [("node1", "0"), ("node3", "1")] or \
        sorted(re.findall(r"\[(node\d):(\d)\] DONE 1 \d 6", out)) == [("node1", "0"), ("node3", "1")], out
    assert_nothing_left(cluster, mark)
