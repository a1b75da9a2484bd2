"""A rank under xrun sees exactly its device (CUDA_VISIBLE_DEVICES by index, by UUID, --device_per_rank), torch
agrees, a CUDA matmul runs; NCCL under xrun."""

from __future__ import annotations

from tests.gpu.runs import explain, job, records, run, xrun_argv
from tests.gpu.smi import parse_list, smi


def gpus():
    return parse_list(smi("-L"))


def bare(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def test_each_rank_sees_its_devices_by_index(tmp_path, figures):
    listed = gpus()
    done = run(xrun_argv("--num_gpus", str(len(listed)), script=job("cuda_rank.py")), cwd=str(tmp_path))
    assert done.returncode == 0, explain(done)
    ranks = records(done.stdout)
    figures.put("ranks", [{k: r[k] for k in ("rank", "visible", "device_count", "device", "name", "uuid",
                                              "matmul_ok")} for r in ranks])
    assert len(ranks) == len(listed)
    for r in ranks:
        assert r["visible"] == ",".join(str(g.index) for g in listed)
        assert r["device_count"] == len(listed) and r["device"] == r["local_rank"] and r["matmul_ok"]
        assert bare(r["uuid"]) == bare(listed[r["local_rank"]].uuid)


def test_a_uuid_list_reaches_the_rank_as_names(tmp_path, figures):
    first = gpus()[0]
    done = run(xrun_argv(script=job("cuda_rank.py")), cwd=str(tmp_path), env={"CUDA_VISIBLE_DEVICES": first.uuid})
    assert done.returncode == 0, explain(done)
    [rank] = records(done.stdout)
    figures.put("rank", {k: rank[k] for k in ("visible", "device_count", "uuid", "matmul_ok")})
    assert rank["visible"] == first.uuid and rank["device_count"] == 1 and rank["matmul_ok"]
    assert bare(rank["uuid"]) == bare(first.uuid)


def test_device_per_rank_shows_each_rank_only_its_own(tmp_path, figures):
    listed = gpus()
    flags = ("--num_gpus", str(len(listed)), "--device_per_rank")
    done = run(xrun_argv(*flags, script=job("cuda_rank.py")), cwd=str(tmp_path))
    assert done.returncode == 0, explain(done)
    ranks = records(done.stdout)
    figures.put("ranks", [{k: r[k] for k in ("rank", "local_rank", "visible", "device_count", "uuid")} for r in ranks])
    assert [r["visible"] for r in ranks] == [str(g.index) for g in listed]
    assert all(r["local_rank"] == 0 and r["device_count"] == 1 and r["matmul_ok"] for r in ranks)
    assert [bare(r["uuid"]) for r in ranks] == [bare(g.uuid) for g in listed]


def test_nccl_all_reduce_under_xrun(tmp_path, figures):
    world = len(gpus())
    if world == 1:
        figures.note("world size 1: this node has one GPU, and NCCL refuses two ranks on one device (it reports a "
                     "duplicate GPU); the all-reduce still goes through NCCL's communicator on the GPU")
    done = run(xrun_argv("--num_gpus", str(world), script=job("nccl_rank.py")), cwd=str(tmp_path), timeout=120)
    assert done.returncode == 0, explain(done)
    ranks = records(done.stdout)
    figures.put("ranks", ranks)
    assert len(ranks) == world
    assert all(r["sum"] == r["expected"] == world * (world + 1) / 2 for r in ranks)
    assert "ok in" in done.stderr or "ok in" in done.stdout, explain(done)
