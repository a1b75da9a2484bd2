"""Time from the launcher's start to the first finished CUDA step: xrun, ``torchrun --standalone`` and a plain
``python``, paired (each round runs all three, in a rotated order), 3 rounds."""

from __future__ import annotations

import statistics
import sys
import time

from tests.gpu.runs import explain, job, records, run, xrun_argv

ROUNDS = 3


def launchers(script: str) -> dict[str, list[str]]:
    return {
        "xrun": xrun_argv(script=script),
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", script],
        "python": [sys.executable, script],
    }


def test_time_to_the_first_cuda_step(tmp_path, figures):
    argvs = launchers(job("cuda_rank.py"))
    names = list(argvs)
    first_step: dict[str, list[float]] = {name: [] for name in names}
    to_exit: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(ROUNDS):
        order = names[round_ % len(names):] + names[: round_ % len(names)]
        for name in order:
            started = time.time()
            done = run(argvs[name], cwd=str(tmp_path), env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=120)
            ended = time.time()
            assert done.returncode == 0, f"{name}: {explain(done)}"
            [rank] = records(done.stdout)
            assert rank["matmul_ok"]
            first_step[name].append(round(rank["first_step"] - started, 3))
            to_exit[name].append(round(ended - started, 3))
    figures.put("seconds to the first CUDA step, per round", first_step)
    figures.put("seconds to exit, per round", to_exit)
    medians = {name: round(statistics.median(values), 3) for name, values in first_step.items()}
    figures.put("median to the first CUDA step", medians)
    figures.put("xrun - python (median of paired differences)",
                round(statistics.median(x - p for x, p in zip(first_step["xrun"], first_step["python"])), 3))
    figures.put("xrun - torchrun (median of paired differences)",
                round(statistics.median(x - t for x, t in zip(first_step["xrun"], first_step["torchrun"])), 3))
