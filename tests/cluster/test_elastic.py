"""Elastic jobs and start-up skew on the network-namespace cluster (issue 6).

The elastic walk-through of torch's ``train_elastic.py`` toy under xrun: a rank crashes and the group resumes
from the checkpoint; a node dies and the survivors carry on at the smaller world size; a node starts late and
the job scales up; restarts run out and the job fails cleanly with the real exit code. And the skew of spot
nodes that start minutes apart: one node's agent starts 60+ s after the others (a wrapper interpreter sleeps
before exec'ing python, only for the agent command), with a static and an elastic job; too long a delay ends
the job naming the late node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.jobs import TRAIN
from tests.conftest import ROOT

from .slurm import slurm  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.torch]

EXAMPLE = os.path.join(ROOT, "examples", "train_elastic.py")
MARK = "XRUN_TEST_MARK"
SKEW = 62.0  # the issue asks for 60+ s; do not shorten


def delayed_python(path: Path, late: str, delay: float) -> Path:
    """An interpreter wrapper: on host ``late`` the *agent* (argv has --connect=) starts ``delay`` s late."""
    path.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --connect="*) [ "$(hostname)" = "{late}" ] && sleep {delay} ;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def job(cluster, tmp_path):
    """Start xrun on the cluster from a scratch directory (shared by every node, like an NFS home)."""
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=1)
    mark = uuid.uuid4().hex

    def start(*args, python=sys.executable, script=EXAMPLE, script_args=(), checkpoint="ckpt.pt", extra_env=None):
        env = dict(os.environ, PYTHONPATH=ROOT, TORCH_CPP_LOG_LEVEL="ERROR", **{MARK: mark}, **(extra_env or {}))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--ssh_config", str(cluster.ssh_config),
                "--python", str(python), "--export", MARK, *args, script,
                "--checkpoint", str(tmp_path / checkpoint), *script_args]
        return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)

    def finish(proc, timeout):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"xrun did not finish in {timeout} s:\n{out[-6000:]}") from None
        return proc.returncode, out

    def ranks_left():
        return cluster.processes_with_marker(f"{MARK}={mark}")

    job = type("Job", (), {})()
    job.start, job.finish, job.ranks_left, job.tmp, job.cluster = start, finish, ranks_left, tmp_path, cluster
    return job


def done_line(out: str) -> dict:
    for line in reversed(out.splitlines()):
        body = line.partition("] ")[2]
        if body.startswith('{"done"'):
            return json.loads(body)
    raise AssertionError(f"no done line in:\n{out[-6000:]}")


def wait_for_line(proc, pattern: str, timeout: float, seen: list[str]) -> None:
    """Read xrun's merged output until a line matches (keeping every line read in ``seen``)."""
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if regex.search(line):
            return
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{''.join(seen)[-6000:]}")


def assert_no_ranks_left(job, timeout=15.0):
    deadline = time.monotonic() + timeout
    while job.ranks_left():
        assert time.monotonic() < deadline, f"ranks left behind: {job.ranks_left()}"
        time.sleep(0.1)


# -- the elastic walk-through ------------------------------------------------------------------------------------


def test_rank_crash_restarts_the_group_and_it_resumes_from_the_checkpoint(job):
    proc = job.start("--launcher", "pdsh", "--elastic", "--max_restarts", "2",
                     script_args=("--steps", "8", "--step_time", "0.1", "--crash_rank", "1", "--crash_at_step", "4"))
    code, out = job.finish(proc, 240)
    assert code == 0, out[-6000:]
    assert "rank 1 crashing at step 4 (restart 0)" in out
    assert re.search(r"rank 1 \(local 0\) exited with code 7; restarting the worker group \(restart 1 of 2\)", out)
    assert re.search(r"\] resume rank \d from step 3", out)
    # (The restart count is each agent's own: the nodes whose ranks only lost a peer may restart by membership.)
    done = done_line(out)
    assert (done["resumed_from"], done["world"]) == (4, 3)
    assert_no_ranks_left(job)


def test_a_restarted_round_meets_in_a_new_store_that_holds_nothing_of_the_last(job):
    """Issue 39 §1 under --elastic (ssh, 3 nodes): the ranks open the store at MASTER_ADDR:MASTER_PORT as clients
    (tests/cluster/jobs.py's TRAIN); rank 1 leaves a key there and crashes at step 3; the next round's ranks, on
    every node, find a store without it (a rank that finds it exits 9) and finish from the checkpoint."""
    script = job.tmp / "train.py"
    script.write_text(TRAIN)
    env = {"CKPT": str(job.tmp / "ckpt"), "CRASH_RANK": "1", "GLOO_SOCKET_IFNAME": "xceth0"}
    # not 29500: the rendezvous store's connections linger on node1 after the job (tests/cluster/test_pod_restarts.py)
    proc = job.start("--launcher", "ssh", "--elastic", "--master_port", "29531", "--max_restarts", "1", "--export", "CKPT",
                     "--export", "CRASH_RANK", script=str(script), extra_env=env)
    code, out = job.finish(proc, 180)
    assert code == 0 and "LEFTOVER" not in out, out[-6000:]
    assert re.search(r"\] CRASH 1 node\d", out), out[-6000:]
    assert sorted(line.split("] DONE ", 1)[1].split()[1:] for line in out.splitlines() if "] DONE " in line) == [
        ["0", "6"], ["1", "6"], ["2", "6"]], out[-6000:]
    assert_no_ranks_left(job)


def test_killed_node_survivors_rerendezvous_at_the_smaller_world_size(job):
    proc = job.start("--launcher", "ssh", "--elastic", "--min_nodes", "2", "--max_restarts", "3",
                     "--rdzv_conf", "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2",
                     script_args=("--steps", "30", "--step_time", "0.3"))
    seen: list[str] = []
    wait_for_line(proc, r"\] step 3 rank \d/3", 120, seen)
    # node2, not node1: c10d's store lives with the rendezvous endpoint (node1), as under torchrun.
    job.cluster.kill_node("node2")
    code, rest = job.finish(proc, 240)
    out = "".join(seen) + rest
    assert code == 0, out[-6000:]
    assert "lost node node2" in out and "they re-rendezvous without it" in out
    assert re.search(r"rendezvous complete: node \d of 2, ranks \d of 2", out)
    done = done_line(out)
    assert done["world"] == 2 and done["resumed_from"] >= 3
    assert_no_ranks_left(job)


def test_late_node_joins_at_the_next_rendezvous(job):
    python = delayed_python(job.tmp / "python", "node3", 15)
    proc = job.start("--launcher", "pdsh", "--elastic", "--min_nodes", "2", "--max_restarts", "1",
                     "--rdzv_conf", "last_call_timeout=1", python=python,
                     script_args=("--steps", "60", "--step_time", "0.3"))
    code, out = job.finish(proc, 300)
    assert code == 0, out[-6000:]
    assert re.search(r"\] step \d+ rank \d/2 restart 0", out)  # started without node3
    assert "node(s) waiting to join: re-rendezvous (membership changes use no restart)" in out
    assert re.search(r"\[node3:\d\] step \d+ rank \d/3 restart 0", out)  # scaled up, no restart used
    done = done_line(out)
    assert (done["world"], done["restart"]) == (3, 0) and done["resumed_from"] > 0


def test_exhausted_restarts_fail_cleanly_with_the_report_and_real_exit_code(job):
    proc = job.start("--launcher", "ssh", "--elastic", "--max_restarts", "1",
                     script_args=("--steps", "5", "--step_time", "0.05", "--crash_rank", "2", "--crash_at_step", "1",
                                  "--crash_always", "--crash_code", "9"))
    code, out = job.finish(proc, 240)
    assert code == 9, out[-6000:]
    assert "restarting the worker group (restart 1 of 1)" in out
    assert re.search(r"node node3: rank 2 failed: exit code 9", out)
    assert re.search(r"job failed: rank 2 \(local 0\) on node3 exited with code 9", out)
    assert_no_ranks_left(job)


# -- start-up skew -----------------------------------------------------------------------------------------------


def test_static_and_elastic_jobs_survive_an_agent_that_starts_60s_late(job):
    """Both at once (they mostly wait): a static job whose node3 agent is late, and an elastic one whose node1
    (the c10d store host) is late: its peers wait on the store longer than torch's 60 s read_timeout default,
    which xrun raises to --join_timeout."""
    started = time.monotonic()
    static = job.start("--launcher", "pdsh", "--master_port", "29510",
                       python=delayed_python(job.tmp / "python3", "node3", SKEW),
                       script_args=("--steps", "3", "--step_time", "0"), checkpoint="static.pt")
    elastic = job.start("--launcher", "ssh", "--elastic", "--master_port", "29520",
                        python=delayed_python(job.tmp / "python1", "node1", SKEW),
                        script_args=("--steps", "3", "--step_time", "0"), checkpoint="elastic.pt")
    code, out = job.finish(static, SKEW + 150)
    assert code == 0, out[-6000:]
    assert time.monotonic() - started >= SKEW
    assert re.search(r"2/3 nodes ready; waiting for node3 \(\d+ s\)", out)  # the live status names the straggler
    assert done_line(out)["world"] == 3
    code, out = job.finish(elastic, 60)
    assert code == 0, out[-6000:]
    assert "read_timeout=1800 s" in out and "join_timeout=1800 s" in out
    assert re.search(r"node1 up after (6\d|[7-9]\d|1\d\d)\.\d s", out)
    assert done_line(out)["world"] == 3


def test_overlong_delay_ends_the_job_cleanly_naming_the_late_node(job):
    python = delayed_python(job.tmp / "python", "node3", SKEW)
    started = time.monotonic()
    proc = job.start("--launcher", "ssh", "--join_timeout", "8", python=python, script_args=("--steps", "3",))
    code, out = job.finish(proc, 60)
    assert code != 0
    assert time.monotonic() - started < 40
    assert "not ready within --join_timeout 8 s: node3" in out, out[-4000:]
    assert_no_ranks_left(job)


# -- every backend -------------------------------------------------------------------------------------------------


# The agent side is the same whatever started it; these show the engines start elastic agents and the runner
# treats them as elastic (no barrier, rendezvous by torch). mpich renders like openmpi (passed by hand too).
@pytest.mark.parametrize("engine", ["openmpi", "slurm"])
def test_engine_backends_start_elastic_agents(job, slurm, engine):  # noqa: F811 - slurm is the fixture
    from .test_engine_jobs import ENGINE_ARGS, need_engine

    need_engine(engine)
    args = [f"--launcher_args={shlex.join(ENGINE_ARGS[engine])}"] if ENGINE_ARGS[engine] else []
    proc = job.start("--launcher", engine, *args, "--elastic", extra_env=slurm.env,
                     script_args=("--steps", "2", "--step_time", "0"))
    code, out = job.finish(proc, 180)
    assert code == 0, out[-6000:]
    assert "its elastic agent joins the rendezvous" in out
    assert done_line(out)["world"] == 3
    assert_no_ranks_left(job)


def test_no_ssh_nodes_started_by_hand_run_elastic(job, cluster):
    """Kubernetes style: xrun started on every node by someone else, each running its own elastic agent."""
    hostfile = job.tmp / "hosts"
    env = dict(os.environ, PYTHONPATH=ROOT, TORCH_CPP_LOG_LEVEL="ERROR")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    logs = [job.tmp / f"node{k + 1}.out" for k in range(3)]
    procs = []
    for k, log in enumerate(logs):
        with open(log, "w") as out:  # files, not pipes: no node may block on a full pipe nobody reads yet
            procs.append(cluster.popen_on(
                f"node{k + 1}",
                [sys.executable, "-m", "xrun", "-H", str(hostfile), "--no_ssh", "--node_rank", str(k), "--elastic",
                 EXAMPLE, "--checkpoint", str(job.tmp / "ckpt.pt"), "--steps", "2", "--step_time", "0"],
                cwd=job.tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
            ))
    deadline = time.monotonic() + 180
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(None)
    outs = [log.read_text() for log in logs]
    assert codes == [0, 0, 0], "\n".join(f"--- node{k + 1}:\n{out[-3000:]}" for k, out in enumerate(outs))
    assert done_line(outs[0])["world"] == 3
