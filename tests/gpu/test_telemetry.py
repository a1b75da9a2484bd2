"""Telemetry with NCCL (issue 31): the same code reads NCCL's Flight Recorder records, with their start and
completion times, at a hang (--hang_action stop)."""

from __future__ import annotations

import json

from tests.gpu.runs import explain, job, run, xrun_argv
from tests.gpu.smi import parse_list, smi


def test_a_hang_reads_each_nccl_ranks_collectives(tmp_path, figures):
    count = len(parse_list(smi("-L")))  # one rank per GPU
    logs = tmp_path / "logs"
    argv = xrun_argv("--log_dir", str(logs), "--num_gpus", str(count), "--hang_timeout", "8", "--hang_action",
                     "stop", script=job("nccl_hang.py"))
    done = run(argv, cwd=str(tmp_path), env={"TORCH_NCCL_ENABLE_TIMING": "1"}, timeout=120)
    assert done.returncode == 124, explain(done)
    assert "WorkerServer" not in done.stderr
    failure = json.loads((logs / "localhost" / "failure.json").read_text())
    ranks = failure["collectives"]["ranks"]
    figures.put("records", ranks)
    assert len(ranks) == count and all(r["problem"] is None for r in ranks), ranks
    for record in ranks:
        [group] = record["groups"]
        last = group["recent"][-1]
        assert last["op"] == "all_reduce" and last["seq"] == 5 and last["in_sizes"] == [[1024]], last
        assert (last["state"] == "completed" or last["retired"]) and last["completed_ns"], last  # NCCL times it
        assert record["where"] == "nccl_hang.py:11 evaluate"
