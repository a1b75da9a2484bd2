"""Third-party training stacks across real hosts: the ``clients`` tier (tests/test_clients.py) on two namespace nodes.

One rank per node over ssh, so every job's process group spans two hosts: MASTER_ADDR is node 0's address on the
cluster network, each stack finds its rank, world and node from xrun's variables alone, and DDP's all-reduce
crosses the hosts (the replicas' weights agree). Lightning is told ``num_nodes=2, devices=1``, as a user on such a
cluster would; it must join xrun's ranks through torchelastic's variables, not spawn its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.clients, pytest.mark.slow]
JOBS = os.path.join(ROOT, "tests", "clients")
EXPORTS = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "CLIENT_DEVICES": "1", "CLIENT_NODES": "2"}


def run_client(cluster, tmp_path, python, job, *flags, backend="ssh", said=None):
    tmp_path.mkdir(exist_ok=True)
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=1, nodes=cluster.nodes[:2])
    env = {**os.environ, **EXPORTS, "CLIENT_OUT": str(tmp_path / "out"), "PYTHONPATH": ROOT}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # CI builds DeepSpeed's op once into a cache of its own (.ci/run): the remote ranks must use that one too
    shared_cache = ["TORCH_EXTENSIONS_DIR"] if "TORCH_EXTENSIONS_DIR" in os.environ else []
    exports = [f"--export={name}" for name in (*EXPORTS, "CLIENT_OUT", *shared_cache)]
    argv = [sys.executable, "-m", "xrun", "-H", str(hostfile), "--launcher", backend, "--ssh_config",
            str(cluster.ssh_config), "--python", python, "--master_port", "0", *exports, *flags, os.path.join(JOBS, job)]
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert result.returncode == 0, result.stderr[-4000:]
    if said is not None:
        said.append(result.stderr)
    reports = [(line.split("]", 1)[0].lstrip("["), json.loads(line.split("] ", 1)[1]))
               for line in result.stdout.splitlines() if '] {"rank"' in line]
    assert sorted(r["rank"] for _, r in reports) == [0, 1], result.stdout  # one report per xrun rank, no more
    hosts = {prefix.split(":")[0] for prefix, _ in reports}
    assert hosts == {node.name for node in cluster.nodes[:2]}, reports  # one rank on each host
    assert all(r["world"] == 2 and r["ddp"] for _, r in reports)
    return [r for _, r in sorted(reports, key=lambda pr: pr[1]["rank"])]


def test_accelerate_across_two_hosts(cluster, tmp_path, python):
    pytest.importorskip("accelerate", reason="pip install '.[clients]'")
    reports = run_client(cluster, tmp_path, python, "accelerate_job.py")
    assert reports[0]["checksum"] == reports[1]["checksum"]  # DDP's all-reduce crossed the hosts


def test_transformers_trainer_across_two_hosts(cluster, tmp_path, python):
    pytest.importorskip("transformers", reason="pip install '.[clients]'")
    run_client(cluster, tmp_path, python, "transformers_job.py")


def test_lightning_across_two_hosts_joins_xruns_ranks(cluster, tmp_path, python):
    pytest.importorskip("lightning", reason="pip install '.[clients]'")
    reports = run_client(cluster, tmp_path, python, "lightning_job.py", backend="pdsh")
    assert {r["env"] for r in reports} == {"TorchElasticEnvironment"}


def test_deepspeed_across_two_hosts(cluster, tmp_path, python):
    pytest.importorskip("deepspeed", reason="DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")
    reports = run_client(cluster, tmp_path, python, "deepspeed_job.py")
    # one rank per host: local rank 0 on both, given as --local_rank and in LOCAL_RANK
    assert all(r["local_rank_arg"] == r["local_rank_env"] == 0 and r["steps"] == 2 for r in reports)
    assert reports[0]["checksum"] == reports[1]["checksum"]  # DeepSpeed's gradient all-reduce crossed the hosts


def test_preload_torch_on_two_hosts_over_pdsh_forks_every_rank_with_the_same_result(cluster, tmp_path, python):
    """--preload torch (issue 32) on a 2-node job over pdsh: each node's agent starts its own helper, says its
    import time, and forks its rank from it; the job trains to the same weights as with started ranks."""
    pytest.importorskip("accelerate", reason="pip install '.[clients]'")
    said: list[str] = []
    started = run_client(cluster, tmp_path / "started", python, "accelerate_job.py", backend="pdsh")
    forked = run_client(cluster, tmp_path / "forked", python, "accelerate_job.py", "--preload", "torch",
                        backend="pdsh", said=said)
    assert [r["preloaded"] for r in started + forked] == [False, False, True, True]
    assert [r["checksum"] for r in forked] == [r["checksum"] for r in started]
    for node in cluster.nodes[:2]:
        assert f"xrun[{node.name}]: preloaded torch in " in said[0], said[0][-3000:]
