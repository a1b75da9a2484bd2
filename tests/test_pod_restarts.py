"""Pod mode's restarts on this machine (issue 23): three xrun processes, one per "node" (127.0.0.1-3), each started
by hand with its own --node_rank and --max_restarts, as Kubernetes starts one pod per index.

The ranks checkpoint every step to a file and resume from it: a rank failure restarts every node in place; a node
whose xrun is killed and started again with the same command comes back into the job, which finishes with 0; a
node that never comes back ends the job after --join_timeout, named. Nothing of any job may be left running.
"""

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import ROOT
from tests.test_pod_run import HOSTS, _free_port, _gone, _ranks

pytestmark = pytest.mark.slow

# Each rank resumes from its own checkpoint file, counts to STEPS, one step per STEP_S; CRASH_RANK exits 5 at step
# 3 of attempt 0.
SCRIPT = r"""
import os, sys, time
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ["RANK"]
ckpt = os.path.join(os.environ["CKPT_DIR"], "ckpt-" + rank)
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("RESUME", attempt, rank, step, os.environ["TORCHELASTIC_MAX_RESTARTS"], flush=True)
while step < int(os.environ.get("STEPS", "6")):
    step += 1
    with open(ckpt + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
    if attempt == 0 and step == 3 and rank == os.environ.get("CRASH_RANK"):
        sys.exit(5)
    time.sleep(float(os.environ.get("STEP_S", "0.3")))
print("DONE", attempt, rank, step, flush=True)
"""


class PodJob:
    """Three nodes' xrun processes with --max_restarts; ``start`` may start a node again (a re-created pod)."""

    def __init__(self, tmp_path, *, restarts=2, join_timeout=20, env=None):
        self.tmp = tmp_path
        (tmp_path / "hosts").write_text("".join(f"{h} slots=1\n" for h in HOSTS))
        (tmp_path / "train.py").write_text(SCRIPT)
        (tmp_path / "ckpt").mkdir()
        self.ports = (_free_port(), _free_port())
        self.restarts, self.join_timeout = restarts, join_timeout
        self.marker = f"XRUN_POD_TEST={uuid.uuid4().hex}"
        self.env = {**os.environ, "PYTHONPATH": ROOT, "CKPT_DIR": str(tmp_path / "ckpt"),
                    "XRUN_TOKEN": "pod-restart-secret-0123", self.marker.split("=")[0]: self.marker.split("=")[1],
                    **(env or {})}
        self.procs = {}  # node -> every xrun started for it, in order
        self.out = {}

    def start(self, node, script="train.py", env=None):
        argv = [sys.executable, "-m", "xrun", "-H", str(self.tmp / "hosts"), "--pod", "--node_rank", str(node),
                "--master_port", str(self.ports[0]), "--control_port", str(self.ports[1]), "--join_timeout",
                str(self.join_timeout), "--max_restarts", str(self.restarts), "--shutdown_timeout", "3", script]
        proc = subprocess.Popen(argv, env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="surrogateescape", cwd=str(self.tmp))
        self.procs.setdefault(node, []).append(proc)
        return proc

    def wait_ranks(self, count, timeout=30.0):
        deadline = time.monotonic() + timeout
        while len(_ranks(self.marker)) < count:
            assert time.monotonic() < deadline, "the job's ranks did not start"
            time.sleep(0.05)

    def finish(self, timeout=90):
        """Every xrun's (code, stdout, stderr), by node, the last one started last."""
        out = {node: [] for node in self.procs}
        for node, procs in self.procs.items():
            for proc in procs:
                stdout, stderr = proc.communicate(timeout=timeout)
                out[node].append((proc.returncode, stdout, stderr))
        assert _gone(self.marker), "processes of the job are left"
        return out


def said(out, word):
    """(attempt, rank, step) of every rank's ``word`` line, from every node's console (node 0 shows them all)."""
    found = set()
    for runs in out.values():
        for _, stdout, _ in runs:
            for line in stdout.splitlines():
                match = re.search(rf"\] {word} (\d+) (\d+) (\d+)", line)
                if match:
                    found.add(tuple(int(g) for g in match.groups()))
    return sorted(found)


def codes(out):
    return {node: [code for code, _, _ in runs] for node, runs in out.items()}


def test_a_rank_failure_restarts_every_node_in_place_from_the_checkpoint(tmp_path):
    job = PodJob(tmp_path, env={"CRASH_RANK": "1"})
    for node in (0, 1, 2):
        job.start(node)
    out = job.finish()
    assert codes(out) == {0: [0], 1: [0], 2: [0]}, out
    resumed = said(out, "RESUME")
    assert [r for r in resumed if r[0] == 0] == [(0, 0, 0), (0, 1, 0), (0, 2, 0)], out
    again = {rank: step for attempt, rank, step in resumed if attempt == 1}
    assert sorted(again) == [0, 1, 2] and again[1] == 3 and min(again.values()) >= 1, resumed  # from the checkpoint
    assert said(out, "DONE") == [(1, 0, 6), (1, 1, 6), (1, 2, 6)]
    node0 = out[0][0][2]
    assert "xrun: restarting the job on every node: attempt 1 of 3 (after: rank 1 (local 0) on 127.0.0.2 exited " \
           "with code 5)" in node0
    assert "the job ran 2 attempts (1 restart(s))" in node0
    assert any("] RESUME 1 1 3 2" in line for line in out[1][0][1].splitlines())  # TORCHELASTIC_MAX_RESTARTS=2


def test_a_killed_nodes_xrun_started_again_comes_back_and_the_job_finishes(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "12"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    time.sleep(0.5)
    job.procs[2][0].kill()  # the pod is gone (its ranks go with it: the watchdog)
    time.sleep(1.0)
    job.start(2)  # re-created with the same index and the same command
    out = job.finish()
    assert codes(out) == {0: [0], 1: [0], 2: [-signal.SIGKILL, 0]}, out
    assert said(out, "DONE") == [(1, 0, 12), (1, 1, 12), (1, 2, 12)]
    assert min(step for attempt, _, step in said(out, "RESUME") if attempt == 1) >= 1  # from the checkpoint
    node0 = out[0][0][2]
    assert "lost node 127.0.0.3" in node0 and "restarting the job on every node: attempt 1 of 3" in node0, node0
    assert "the job ran 2 attempts (1 restart(s))" in node0


def test_an_evicted_node_leaves_with_143_and_its_new_pod_comes_back(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "12"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[1][0].send_signal(signal.SIGTERM)  # eviction: SIGTERM first
    time.sleep(1.0)
    job.start(1)
    out = job.finish()
    assert codes(out) == {0: [0], 1: [143, 0], 2: [0]}, out
    assert "got SIGTERM: this node leaves the job" in out[1][0][2]
    assert said(out, "DONE") == [(1, 0, 12), (1, 1, 12), (1, 2, 12)]


def test_a_node_that_never_comes_back_ends_the_job_named_after_join_timeout(tmp_path):
    job = PodJob(tmp_path, join_timeout=8, env={"STEPS": "40"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[2][0].kill()
    lost_at = time.monotonic()
    out = job.finish()
    assert time.monotonic() - lost_at < 8 + 15
    assert codes(out) == {0: [1], 1: [1], 2: [-signal.SIGKILL]}, out
    for node in (0, 1):
        assert "not ready within --join_timeout 8 s: 127.0.0.3" in out[node][0][2], out[node][0][2]
    assert "stopped restarting after 1 restart(s): 1 node(s) lost" in out[0][0][2]


def test_sigterm_to_node_0_stops_the_job_everywhere_and_is_not_restarted(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "40"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[0][0].send_signal(signal.SIGTERM)
    out = job.finish(timeout=30)
    assert codes(out) == {0: [143], 1: [143], 2: [143]}, out
    assert "stopped by SIGTERM (exit code 143)" in out[0][0][2]
    assert "restarting" not in out[0][0][2]


def test_node_0_killed_ends_the_job_on_every_node_even_with_restarts_left(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "40"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[0][0].kill()
    out = job.finish(timeout=30)
    assert codes(out) == {0: [-signal.SIGKILL], 1: [1], 2: [1]}, out
    for node in (1, 2):
        assert "lost node 0 (127.0.0.1), which hosts the job's control channel" in out[node][0][2]


def test_ctrl_c_to_node_0_while_the_next_attempt_waits_stops_every_node_with_130(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "40"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[2][0].kill()  # the next attempt waits for node 2 ...
    deadline = time.monotonic() + 20
    while _ranks(job.marker):  # the attempt is over once every rank is gone: the restart follows at once
        assert time.monotonic() < deadline, "the attempt did not end"
        time.sleep(0.05)
    time.sleep(0.5)
    job.procs[0][0].send_signal(signal.SIGINT)  # ... when node 0 gets Ctrl-C
    out = job.finish(timeout=30)
    assert codes(out) == {0: [130], 1: [130], 2: [-signal.SIGKILL]}, out
    assert "restarting the job on every node: attempt 1 of 3" in out[0][0][2]
    assert "stopped by SIGINT (exit code 130)" in out[0][0][2] and "attempt 2" not in out[0][0][2]


def test_a_second_xrun_for_a_live_node_cannot_take_its_place_until_the_first_one_is_gone(tmp_path):
    job = PodJob(tmp_path, env={"STEPS": "12"})
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.start(2)  # another xrun for node 2 while the first is connected: one live agent per place
    time.sleep(2.5)
    assert job.procs[2][1].poll() is None  # node 0 cannot prove a taken place: it tries again, quietly
    job.procs[2][0].kill()  # the first one gone, its place reopens: the second takes it at the next attempt
    out = job.finish()
    assert codes(out) == {0: [0], 1: [0], 2: [-signal.SIGKILL, 0]}, out
    assert said(out, "DONE") == [(1, 0, 12), (1, 1, 12), (1, 2, 12)]
    assert re.search(r"closed \d+ connection\(s\) that did not prove this run's key", out[0][0][2]), out[0][0][2]


def test_a_node_back_with_another_command_is_turned_away_and_the_job_ends_naming_it(tmp_path):
    job = PodJob(tmp_path, join_timeout=8, env={"STEPS": "40"})
    (tmp_path / "other.py").write_text(SCRIPT)
    for node in (0, 1, 2):
        job.start(node)
    job.wait_ranks(3)
    job.procs[2][0].kill()
    time.sleep(0.5)
    job.start(2, script="other.py")
    out = job.finish()
    assert codes(out) == {0: [1], 1: [1], 2: [-signal.SIGKILL, 1]}, out
    assert "node 2 (127.0.0.3) runs another job: 127.0.0.3 runs other.py; node 0 runs train.py: turned away" \
        in out[0][0][2]
    assert "not ready within --join_timeout 8 s: 127.0.0.3" in out[0][0][2]
    assert "node 0 turned this node away without a word" in out[2][1][2]


@pytest.mark.parametrize("restarts, said_", [(2, "got SIGTERM: this node leaves the job"),
                                              (0, "got SIGTERM after this node's part was over; exit code 143")])
def test_sigterm_after_a_nodes_part_is_over_is_an_exit_143_not_a_death_by_signal(tmp_path, restarts, said_):
    job = PodJob(tmp_path, restarts=restarts, env={"STEPS": "15"})
    job.start(0)
    job.start(1, env={"STEPS": "1"})  # node 1's rank is done at once; the others go on
    job.start(2)
    job.wait_ranks(3)
    deadline = time.monotonic() + 20
    while len(_ranks(job.marker)) > 2:
        assert time.monotonic() < deadline, "node 1's rank did not end"
        time.sleep(0.05)
    time.sleep(0.5)  # node 1 waits for the job's verdict: no signal handler of a rank group is in place
    job.procs[1][0].send_signal(signal.SIGTERM)
    out = job.finish()
    assert codes(out) == {0: [0], 1: [143], 2: [0]}, out  # translated, never the default action (-15)
    assert said_ in out[1][0][2]
