"""``--on_rank_exit keep`` across real hosts (network-namespace nodes with sshd, the ssh backend; issue 39 §3): a
rank on node 1 dies and no rank anywhere is signalled; the head names it lost and the job ends 0 with the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from tests.conftest import ROOT

MARK = "XRUN_TEST_MARK"

SCRIPT = r"""
import os, signal, sys, time
rank, out = int(os.environ["RANK"]), sys.argv[-1]  # after xrun's --local_rank=N
def on_term(signum, frame):
    open(os.path.join(out, f"term.{rank}"), "w").close()
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_term)
if rank == 2:  # node 1's first rank
    open(os.path.join(out, "gone"), "w").close()
    sys.exit(1)
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(out, "gone")) and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(1.0)  # time for any stop to arrive: none must
print(f"rank {rank} finished", flush=True)
"""


def test_a_rank_lost_on_node_1_signals_no_rank_and_the_job_ends_0(cluster, tmp_path):
    (tmp_path / "home").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=2, nodes=[cluster.nodes[0].name, cluster.nodes[1].name])
    mark = uuid.uuid4().hex
    env = dict(os.environ, HOME=str(tmp_path / "home"), PYTHONPATH=ROOT, **{MARK: mark})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", "ssh", "--ssh_config", str(cluster.ssh_config),
         "--export", MARK, "--on_rank_exit", "keep", "--log_dir", "logs", str(script), str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "gone").exists() and "Traceback" not in done.stdout
    assert sorted(p.name for p in out.glob("term.*")) == []  # node 0's ranks and rank 3 were never signalled
    assert sorted(line.split("] ")[1] for line in done.stdout.splitlines() if "finished" in line) == [
        "rank 0 finished", "rank 1 finished", "rank 3 finished"]
    node1 = cluster.nodes[1].name
    assert f"rank 2 (local 0) on {node1} exited with code 1; the other ranks go on (--on_rank_exit keep)" in done.stderr
    assert "3 ranks ok in " in done.stderr and "rank 2 (exit code 1) lost on the way" in done.stderr
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["lost_ranks"] == [2]
    assert cluster.processes_with_marker(f"{MARK}={mark}") == []
