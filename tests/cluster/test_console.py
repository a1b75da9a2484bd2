"""Issue 17 on real hosts (3 network-namespace nodes x 2 ranks): a line every rank prints is shown once on the
head's console across nodes (on node 0's in pod mode), and a busy default rendezvous port on node 0 does not stop
the job, launched or in pod mode.
"""

from __future__ import annotations

import sys
import time

import pytest

from tests.cluster.test_multinode import job  # noqa: F401 - the fixture: xrun against the cluster
from tests.cluster.test_pod import PORT as POD_PORT
from tests.cluster.test_pod import PodJob, codes
from tests.labels import expand

pytestmark = pytest.mark.cluster

SHARED_SCRIPT = r"""
import os, sys
rank = os.environ["RANK"]
print("UserWarning: every rank says this", flush=True)
print(f"rank {rank} says its own", flush=True)
print("stderr from every rank", file=sys.stderr, flush=True)
print("port", os.environ["MASTER_PORT"], flush=True)
"""

HOLD_PORT = "import socket, time; s = socket.socket(); s.bind(('', 29500)); s.listen(); print('held', flush=True); time.sleep(120)"


def _shown(text: str, lines: list[str]) -> list[int]:
    """The ranks named by the lines that end in ``text`` (each label's rank set, expanded)."""
    ranks: list[int] = []
    for line in lines:
        label, _, body = line.partition("] ")
        if body == text:
            ranks.extend(expand(label.rsplit(" ", 1)[-1].rsplit(":", 1)[-1].lstrip("[")) or [])
    return ranks


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_a_line_every_rank_prints_is_shown_once_across_nodes(job, backend, python):  # noqa: F811
    script = job.tmp / "shared.py"
    script.write_text(SHARED_SCRIPT)
    code, out, err = job.run(backend, "--python", python, script_path=script)  # this tree's agent on the nodes
    assert code == 0, err
    assert_shown_once_across_nodes(out, err)
    job.assert_clean()


def assert_shown_once_across_nodes(out: str, err: str) -> None:
    """Six ranks on three nodes printed SHARED_SCRIPT: the shared lines once (or twice, when the nodes started
    far apart), every rank's own line once."""
    lines = out.splitlines()
    shown = [line for line in lines if line.endswith("] UserWarning: every rank says this")]
    assert sorted(_shown("UserWarning: every rank says this", lines)) == list(range(6)), out
    # once across nodes ("[ranks 0-5] ..."), or in two groups when the namespace nodes start far apart
    assert shown[0].startswith("[ranks ") and len(shown) <= 2, out
    assert sorted(_shown("stderr from every rank", err.splitlines())) == list(range(6)), err
    for rank in range(6):
        assert sum(1 for line in lines if line.endswith(f"] rank {rank} says its own")) == 1, out


@pytest.mark.parametrize("backend", ["ssh", "pdsh"])
def test_the_default_port_busy_on_node_0_still_runs(job, backend, python):  # noqa: F811
    node0 = job.cluster.nodes[0]
    holder = job.cluster.popen_on(node0, [sys.executable, "-c", HOLD_PORT], stdout=-1, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        script = job.tmp / "shared.py"
        script.write_text(SHARED_SCRIPT)
        started = time.monotonic()
        code, out, err = job.run(backend, "--python", python, script_path=script)  # this tree's agent
        assert code == 0, err
        ports = {line.rsplit(" ", 1)[-1] for line in out.splitlines() if "] port " in line}
        assert len(ports) == 1 and ports != {"29500"}, out  # one port for every rank, not the busy default
        assert time.monotonic() - started < 60
    finally:
        holder.kill()
        holder.wait()
    job.assert_clean()


def run_pod_job(cluster, tmp_path, *flags: str) -> dict[int, tuple[int, str, str]]:
    """SHARED_SCRIPT as a pod-mode job, 2 ranks on each of the 3 nodes, every node's xrun started by hand;
    every node exits 0."""
    hosts = cluster.hostfile(tmp_path / "hosts2", slots=2)
    pod = PodJob(cluster, tmp_path, args=("-H", str(hosts), "--pod", *flags))
    (tmp_path / "train.py").write_text(SHARED_SCRIPT)
    for k in range(3):
        pod.start(k)
    out = pod.finish()
    assert codes(out) == [0, 0, 0], {k: v[2] for k, v in out.items()}
    return out


def test_pod_mode_node_0_shows_a_line_every_rank_prints_once_across_nodes(cluster, tmp_path):
    """Pod mode: node 0's console is the job's, merged across nodes; every other node's own console still shows
    its ranks (its pod's log)."""
    out = run_pod_job(cluster, tmp_path, "--master_port", str(POD_PORT))
    assert_shown_once_across_nodes(out[0][1], out[0][2])
    for k in (1, 2):
        own = out[k][1].splitlines()
        assert sorted(_shown("UserWarning: every rank says this", own)) == [2 * k, 2 * k + 1], out[k][1]
        assert f"[node{k + 1}:{2 * k}-{2 * k + 1}] UserWarning: every rank says this" in own, out[k][1]


def test_pod_mode_the_default_port_busy_on_node_0_still_runs(cluster, tmp_path):
    holder = cluster.popen_on(cluster.nodes[0], [sys.executable, "-c", HOLD_PORT], stdout=-1, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        # no --master_port: 29500, busy on node 0; the control channel on another port (pod mode needs one)
        out = run_pod_job(cluster, tmp_path, "--control_port", str(POD_PORT))
        ports = {line.rsplit(" ", 1)[-1] for k in out for line in out[k][1].splitlines() if "] port " in line}
        assert len(ports) == 1 and ports != {"29500"}, out
    finally:
        holder.kill()
        holder.wait()
