"""Pod mode's restarts across namespace hosts (issue 23): every node's xrun started by hand (``ip netns exec``) with
``--max_restarts``, as Kubernetes starts one pod per index. Real torch gloo ranks checkpoint every step to a file
(the nodes share the filesystem) and resume from it (tests/cluster/jobs.py's TRAIN): a rank crash restarts every
node in place through node 0's channel, on a fresh rendezvous port; a node killed outright (every process of its
namespace) whose xrun is started again with the same command comes back and the job finishes with 0; nothing is
left on any node.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.cluster.jobs import MARK, TRAIN
from tests.conftest import ROOT

HOLD_29500 = "import socket, time; s = socket.socket(); s.bind(('', 29500)); s.listen(); print('held', flush=True); " \
             "time.sleep(300)"


class PodRestartJob:
    """One pod-mode job with --max_restarts; ``start(k)`` runs (or runs again) node rank k's xrun on the k-th node."""

    def __init__(self, cluster, tmp_path: Path, *, env: dict, port: bool = True) -> None:
        self.cluster, self.tmp, self.mark = cluster, tmp_path, uuid.uuid4().hex
        (tmp_path / "train.py").write_text(TRAIN)
        hosts = cluster.hostfile(tmp_path / "hosts", slots=1)
        ports = ("--master_port", "29710") if port else ("--control_port", "29712")  # never 29500/29501
        self.argv = [sys.executable, "-m", "xrun", "-H", str(hosts), "--pod", *ports, "--max_restarts", "2",
                     "--join_timeout", "60", "--shutdown_timeout", "5"]
        self.env = {**os.environ, "PYTHONPATH": ROOT, MARK: self.mark, "CKPT": str(tmp_path / "ckpt"),
                    "GLOO_SOCKET_IFNAME": "xceth0", "TORCH_CPP_LOG_LEVEL": "ERROR", "XRUN_TOKEN": "a" * 32, **env}
        self.procs: dict[int, list[subprocess.Popen]] = {}

    def start(self, k: int) -> None:
        proc = self.cluster.popen_on(self.cluster.nodes[k].name, [*self.argv, "--node_rank", str(k), "train.py"],
                                     env=self.env, cwd=str(self.tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.procs.setdefault(k, []).append(proc)

    def finish(self, timeout: float = 150) -> dict[int, list[tuple[int, str, str]]]:
        out: dict[int, list[tuple[int, str, str]]] = {}
        for k, procs in self.procs.items():
            for proc in procs:
                stdout, stderr = proc.communicate(timeout=timeout)
                out.setdefault(k, []).append((proc.returncode, stdout, stderr))
        deadline = time.monotonic() + 15
        while self.cluster.processes_with_marker(f"{MARK}={self.mark}"):
            assert time.monotonic() < deadline, "processes of the job are left on the nodes"
            time.sleep(0.05)
        return out


def lines_of(out, word):
    """Each rank's ``word`` line (split), once, from every xrun's console (node 0's shows every node's)."""
    found = {tuple(line.split(f"] {word} ", 1)[1].split()) for runs in out.values() for _, stdout, _ in runs
             for line in stdout.splitlines() if f"] {word} " in line}
    return sorted(found)


def test_pod_rank_crash_restarts_every_node_in_place_on_a_fresh_port(cluster, tmp_path):
    # 29500, the default, held on node 0 for the test: every attempt's port is one node 0 picks, and no store of
    # this job lingers on 29500 for the tests after it (tests/cluster/test_console.py holds it too)
    holder = cluster.popen_on(cluster.nodes[0], [sys.executable, "-c", HOLD_29500], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        job = PodRestartJob(cluster, tmp_path, env={"CRASH_RANK": "1"}, port=False)
        for k in range(3):
            job.start(k)
        out = job.finish()
    finally:
        holder.kill()
        holder.wait()
    assert {k: [c for c, _, _ in runs] for k, runs in out.items()} == {0: [0], 1: [0], 2: [0]}, \
        {k: runs[0][2] for k, runs in out.items()}
    resumed = lines_of(out, "RESUME")
    assert [r[:3] for r in resumed] == [("0", "0", "0"), ("0", "1", "0"), ("0", "2", "0"), ("1", "0", "3"),
                                        ("1", "1", "3"), ("1", "2", "3")], resumed  # attempt 1 from the checkpoint
    ports = {attempt: port for attempt, _, _, port, _ in resumed}
    assert ports["0"] != ports["1"] and "29500" not in ports.values(), resumed  # each attempt's, agreed by node 0
    assert lines_of(out, "DONE") == [("1", "0", "6"), ("1", "1", "6"), ("1", "2", "6")]
    node0 = out[0][0][2]
    assert "restarting the job on every node: attempt 1 of 3 (after: rank 1 (local 0) on node2 exited with code 5)" \
        in node0, node0
    assert "node 0 restarts the job on every node: attempt 1" in out[2][0][2]


def test_pod_a_killed_node_started_again_comes_back_and_the_job_finishes(cluster, tmp_path):
    job = PodRestartJob(cluster, tmp_path, env={"STEPS": "30", "STEP_S": "0.3"})
    for k in range(3):
        job.start(k)
    deadline = time.monotonic() + 90
    while not (tmp_path / "ckpt").exists() or int((tmp_path / "ckpt").read_text() or 0) < 2:
        assert time.monotonic() < deadline, "the ranks never checkpointed"
        time.sleep(0.1)
    cluster.kill_node("node3")  # every process of the node: its xrun, its ranks
    time.sleep(2.0)
    job.start(2)  # the pod re-created with the same index and the same command
    out = job.finish()
    assert [c for c, _, _ in out[0]] == [0] and [c for c, _, _ in out[1]] == [0], out[0][0][2]
    assert out[2][0][0] == -signal.SIGKILL and out[2][1][0] == 0, out[2][1][2]
    assert [d[:2] for d in lines_of(out, "DONE")] == [("1", "0"), ("1", "1"), ("1", "2")]
    assert min(int(r[2]) for r in lines_of(out, "RESUME") if r[0] == "1") >= 2  # from the checkpoint
    node0 = out[0][0][2]
    assert re.search(r"restarting the job on every node: attempt 1 of 3 \(after: lost node node3", node0), node0
    assert "the job ran 2 attempts (1 restart(s))" in node0
