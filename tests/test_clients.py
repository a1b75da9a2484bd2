"""The ``clients`` tier (issue 13): third-party training stacks under xrun, 2 CPU ranks over gloo, unchanged.

CI installs them (``pip install '.[clients]'`` in .ci/run); elsewhere each test skips with what to install.
Each job reports its world size, whether the model is DDP-wrapped and its pid: two ranks, two pids, no
process of its own spawned (Lightning must join xrun's ranks through torchelastic's variables). Each runs twice, as
started and forked from ``--preload torch``'s helper (issue 32): the same report, the same trained weights (the
jobs are seeded), and only the second's ranks found torch imported before their first line.
"""

import json
import os

import pytest

from tests.conftest import ROOT, run_xrun

pytestmark = [pytest.mark.clients, pytest.mark.slow]
JOBS = os.path.join(ROOT, "tests", "clients")


def run_client(job, tmp_path, *flags):
    out = tmp_path / ("preloaded" if flags else "started")
    out.mkdir()
    env = {"CLIENT_OUT": str(out), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    result = run_xrun("--num_gpus", "2", "--master_port", "0", *flags, os.path.join(JOBS, job), env=env,
                      timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads(line.split("] ", 1)[1]) for line in result.stdout.splitlines() if '] {"rank"' in line]
    assert sorted(r["rank"] for r in reports) == [0, 1], result.stdout  # one report per xrun rank, no more
    assert len({r["pid"] for r in reports}) == 2
    assert all(r["world"] == 2 and r["ddp"] for r in reports)
    return sorted(reports, key=lambda r: r["rank"])


def run_unchanged_under_preload(job, tmp_path):
    """The job started, then forked from ``--preload torch``: the same reports but for their pids."""
    started = run_client(job, tmp_path)
    forked = run_client(job, tmp_path, "--preload", "torch")
    assert [r["preloaded"] for r in started + forked] == [False, False, True, True]

    def same(reports):
        return [{k: v for k, v in r.items() if k not in ("pid", "preloaded")} for r in reports]

    assert same(forked) == same(started)
    return started


def test_accelerate(tmp_path):
    pytest.importorskip("accelerate", reason="pip install '.[clients]'")
    reports = run_unchanged_under_preload("accelerate_job.py", tmp_path)
    assert reports[0]["checksum"] == reports[1]["checksum"]  # DDP kept the replicas identical


def test_transformers_trainer(tmp_path):
    pytest.importorskip("transformers", reason="pip install '.[clients]'")
    reports = run_unchanged_under_preload("transformers_job.py", tmp_path)
    assert reports[0]["checksum"] == reports[1]["checksum"]


def test_lightning_joins_xruns_ranks(tmp_path):
    pytest.importorskip("lightning", reason="pip install '.[clients]'")
    reports = run_unchanged_under_preload("lightning_job.py", tmp_path)
    assert {r["env"] for r in reports} == {"TorchElasticEnvironment"}
    assert reports[0]["checksum"] == reports[1]["checksum"]


def test_deepspeed_script_with_local_rank_argument(tmp_path):
    pytest.importorskip("deepspeed", reason="DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")
    reports = run_unchanged_under_preload("deepspeed_job.py", tmp_path)
    assert all(r["local_rank_arg"] == r["local_rank_env"] == r["rank"] and r["steps"] == 2 for r in reports)
    assert reports[0]["checksum"] == reports[1]["checksum"]  # DeepSpeed's gradient all-reduce ran over xrun's world
