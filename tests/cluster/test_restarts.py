"""Whole-job restarts across real hosts (issue 23): ``--max_restarts`` on a static job over ssh and pdsh.

Real torch gloo ranks that checkpoint every step to a file (the nodes share the filesystem) and resume from it
(tests/cluster/jobs.py's TRAIN): a rank crash restarts every node over the same agents and the job finishes from the
checkpoint; a node killed with no spare ends the job naming it; nothing is left on any node. Under ``--preload``
(issue 32) a restart forks every node's ranks from the helper that imported torch once, and a helper killed on one
node ends the job at the restart, naming it. The remote interpreter
is a wrapper that puts this tree first on PYTHONPATH (over ssh nothing else would: the ``python`` fixture).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest

from tests.cluster.jobs import MARK, TRAIN, started
from tests.conftest import ROOT


def start(cluster, tmp_path, python, backend, *args, env=None, nodes=None, program=()):
    """``xrun`` over ``backend`` running TRAIN, or ``program`` (a script and its arguments)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=1, nodes=nodes)
    mark = uuid.uuid4().hex
    full = dict(os.environ, PYTHONPATH=ROOT, CKPT=str(tmp_path / "ckpt"), TORCH_CPP_LOG_LEVEL="ERROR",
                GLOO_SOCKET_IFNAME="xceth0", **{MARK: mark}, **(env or {}))
    exports = [f"--export={name}" for name in ("CKPT", MARK, *(env or {}))]
    argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", backend, "--python", python,
            "--ssh_config", str(cluster.ssh_config), *exports, "--shutdown_timeout", "5",
            # not the default 29500: a killed node leaves rank 0's store connections lingering on node1, and
            # tests/cluster/test_multinode.py's `xrun check` then finds 29500 taken there
            "--master_port", "0", *args, *(program or [str(script)])]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, mark


def assert_nothing_left(cluster, mark, timeout=15.0):
    deadline = time.monotonic() + timeout
    while cluster.processes_with_marker(f"{MARK}={mark}"):
        assert time.monotonic() < deadline, "ranks left behind"
        time.sleep(0.05)


def lines_of(out, word):
    return [line.split(f"{word} ", 1)[1].split() for line in out.splitlines() if f"] {word} " in line]


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_a_rank_crash_restarts_every_node_and_resumes_from_the_checkpoint(cluster, tmp_path, python, backend):
    logs = tmp_path / "logs"
    proc, mark = start(cluster, tmp_path, python, backend, "--max_restarts", "2", "--log_dir", str(logs),
                       env={"CRASH_RANK": "1"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert_recorded_a_restart(logs, [n.name for n in cluster.nodes[:3]])
    resumed = sorted(tuple(words[:3]) for words in lines_of(out, "RESUME"))
    assert resumed == [("0", "0", "0"), ("0", "1", "0"), ("0", "2", "0"), ("1", "0", "3"), ("1", "1", "3"),
                       ("1", "2", "3")], out  # attempt 1 resumed from step 3 on every node
    ports = {words[0]: words[3] for words in lines_of(out, "RESUME")}
    assert ports["0"] != ports["1"]  # a fresh rendezvous port
    assert {words[4] for words in lines_of(out, "RESUME")} == {"2"}  # TORCHELASTIC_MAX_RESTARTS
    assert sorted(tuple(words) for words in lines_of(out, "DONE")) == [("1", "0", "6"), ("1", "1", "6"),
                                                                       ("1", "2", "6")]
    assert "xrun: restarting the job on every node: attempt 1 of 3" in err
    assert "the job ran 2 attempts (1 restart(s))" in err
    assert re.search(r"attempt 0 \([\d.]+ s\): rank 1 \(local 0\) on node2 exited with code 5", err), err
    crashed = float(lines_of(out, "CRASH")[0][2])
    restarted = max(float(words[2]) for words in lines_of(out, "STARTED") if words[0] == "1")
    print(f"{backend}: first failure -> every rank of attempt 1 started: {restarted - crashed:.2f} s")
    assert restarted - crashed < 10.0
    assert_nothing_left(cluster, mark)


def assert_recorded_a_restart(logs, hosts):
    """events.jsonl (docs/events.md) of a 3-node job whose rank 1 (node2) exits 5 in attempt 0: in order, with
    its content, and the goodput in summary.json the same as its last line's."""
    events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    main = [k for k in kinds if k in ("job_started", "attempt_started", "failure", "stop_requested", "attempt_ended",
                                      "job_ended")]
    assert main == ["job_started", "attempt_started", "failure", "stop_requested", "attempt_ended",
                    "attempt_started", "attempt_ended", "job_ended"], kinds
    first, restart = kinds.index("attempt_started"), kinds.index("attempt_started", kinds.index("failure"))
    assert sorted(e["host"] for e in events[:first] if e["event"] == "node_joined") == hosts
    assert sorted(e["host"] for e in events[:first] if e["event"] == "node_ready") == hosts
    assert sorted(e["host"] for e in events[restart:] if e["event"] == "node_started") == hosts
    failure = events[kinds.index("failure")]
    assert (failure["attempt"], failure["rank"], failure["host"], failure["exit_code"]) == (0, 1, hosts[1], 5)
    crashed = [e for e in events if e["event"] == "rank_exited" and e["code"] == 5]
    assert [(e["attempt"], e["rank"], e["host"], e["stopped"]) for e in crashed] == [(0, 1, hosts[1], False)]
    assert crashed[0]["cpu_s"] > 0 and crashed[0]["peak_rss_bytes"] > 0
    stop = events[kinds.index("stop_requested")]
    assert (stop["by"], stop["reason"], stop["nodes"]) == ("failure", failure["reason"], 3)
    assert [(e["attempt"], e["ending"]) for e in events if e["event"] == "attempt_ended"] == [(0, "restart"),
                                                                                             (1, "final")]
    finished = [e for e in events[restart:] if e["event"] == "rank_exited"]
    assert sorted((e["rank"], e["code"]) for e in finished) == [(0, 0), (1, 0), (2, 0)]
    end = events[-1]
    assert (end["event"], end["exit_code"], end["attempts"]) == ("job_ended", 0, 2)
    goodput = json.loads((logs / "summary.json").read_text())["goodput"]
    assert goodput == end["goodput"]
    lost = goodput["lost_s"]
    assert goodput["wall_s"] == end["t"] and 0 < goodput["share"] < 1
    assert abs(goodput["training_s"] + sum(lost.values()) - goodput["wall_s"]) < 0.01
    assert lost["startup"] == events[first]["t"]
    assert abs(lost["restarts"] - (events[restart]["t"] - crashed[0]["t"])) < 0.002  # the crash ended the training
    assert lost["hang"] == 0


def test_a_rank_that_always_fails_stops_after_n_restarts_with_its_code(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "2", "--min_attempt_s", "0",
                       env={"ALWAYS_FAIL": "2"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 6, err
    assert "xrun: 2 restart(s) exhausted (--max_restarts 2)" in err
    assert len(re.findall(r"attempt \d \([\d.]+ s\): rank 2 \(local 0\) on node3 exited with code 6", err)) == 3, err
    assert_nothing_left(cluster, mark)


def test_a_killed_node_without_a_spare_ends_the_job_naming_it(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "3", env={"STEP_S": "2"})
    started(proc, 3)
    cluster.kill_node("node3")
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert "lost node node3" in err
    assert "stopped restarting after 0 restart(s): 1 node(s) lost (node3)\n" in err
    assert_nothing_left(cluster, mark)


# -- --preload (issue 32): each node's helper lives across the attempts -----------------------------------------


def test_under_preload_a_restart_forks_every_node_from_the_helper_that_imported_torch_once(cluster, tmp_path, python):
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "2", "--preload", "torch",
                       env={"CRASH_RANK": "1"})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert sorted(tuple(words[:3]) for words in lines_of(out, "RESUME"))[3:] == [("1", "0", "3"), ("1", "1", "3"),
                                                                               ("1", "2", "3")], out
    for node in ("node1", "node2", "node3"):  # one import per node, for both attempts
        assert len(re.findall(rf"xrun\[{node}\]: preloaded torch in [\d.]+ s; the ranks are forked", err)) == 1, err
    assert "the job ran 2 attempts (1 restart(s))" in err
    assert_nothing_left(cluster, mark)


def test_a_preload_helper_killed_on_one_node_ends_the_job_at_the_restart_naming_it(cluster, tmp_path, python):
    """Rank 1 (node2) kills its node's helper and fails: the restart cannot fork node2's ranks, so its preflight
    fails in one line and the job ends there (no spare), nothing left on any node, no second attempt."""
    rank = os.path.join(ROOT, "tests", "procs", "preload_rank.py")
    proc, mark = start(cluster, tmp_path, python, "ssh", "--max_restarts", "2", "--preload", "preload_mark",
                       program=[rank, "kill_helper=1", "fail=1", f"dir={tmp_path}"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    pid = re.search(r"xrun\[node2\]: the preload helper \(pid (\d+)\) was killed by SIGKILL; the running ranks go on",
                    err)
    assert pid, err
    assert (f"xrun: job failed: agent on node2: --preload: the helper (pid {pid.group(1)}) was killed by SIGKILL "
            "during the last attempt, so the next attempt's ranks cannot be forked on this node: the job ends here") \
        in err
    assert "xrun: stopped restarting after 1 restart(s): 1 node(s) lost (node2)\n" in err
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("up-")) == ["up-0-0", "up-1-0", "up-2-0"]
    assert_nothing_left(cluster, mark)
