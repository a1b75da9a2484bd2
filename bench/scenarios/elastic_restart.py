"""Scenario: elastic restart latency, xrun --elastic against torchrun, on the same failure (issue 6).

N local ranks under each launcher's elastic agent (torch's LocalElasticAgent in both, c10d rendezvous,
``--max_restarts 1``, monitor interval 0.1 s); on the first attempt rank N-1 exits 7 after 1 s. Measured from
the failing rank's own exit timestamp (written right before ``os._exit``) to the moment the last rank of the
second attempt has started (each rank's first act is to write its start time): "failure -> all ranks running
again". Also the launcher's exit code and wall time to the end. The ranks import no torch, so what is timed is
the launchers (torch's monitor, stop, re-rendezvous, restart; for xrun also its per-rank supervisor).

Run it alone: ``python -m bench.scenarios.elastic_restart [--reps N] [--nproc N]`` prints the summary as JSON.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import harness, procs
from bench.launchers import xrun_supports
from bench.scenarios.base import Context, finish, median, section, target, unavailable

NAME = "elastic_restart"
TITLE = "Elastic restart latency: N ranks, one exits 7 after 1 s, one restart (xrun --elastic vs torchrun)"
VARIANTS = ("xrun", "torchrun")
TABLE = {
    "metrics": [["restart_s", "failure -> all ranks running again", "s"], ["wall_s", "launch -> exit", "s"]],
    "ratio": "restart_s",
    "reference": "xrun",
}
POLL_S = 0.002


def elastic_argv(variant: str, n: int, port: int, args: tuple[str, ...]) -> list[str]:
    script = harness.rank_script("elastic_rank.py")
    if variant == "xrun":
        head = ["xrun", "--elastic", "--max_restarts", "1", "--num_gpus", str(n), "--master_port", str(port)]
    else:
        head = ["torchrun", "--nnodes", "1", "--nproc_per_node", str(n), "--max_restarts", "1",
                "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]  # fmt: skip
    return [*head, script, *args]


def trial(variant: str, n: int, cap_s: float) -> harness.Trial:
    with harness.RunDir() as run:
        tag = procs.new_tag()
        args = harness.rank_args(tag, run, (f"fail_rank={n - 1}", "fail_after=1.0", "code=7", "sleep=60", "after=0.3"))
        started = time.time()
        proc = harness.start(
            elastic_argv(variant, n, harness.free_port(), args), env=harness.bench_env(tag), console=run.console
        )
        try:
            restarted_at = _wait_restarted(run, n, proc, cap_s + 60.0)
            try:
                code = proc.wait(timeout=cap_s + 30.0)
            except Exception:  # noqa: BLE001 - a hung launcher is a censored trial, not a crash of the bench
                code = None
            ended = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            procs.kill_all(procs.tagged_pids(tag))
        fail_ts = _read_float(os.path.join(run.path, "fail_ts"))
        if fail_ts is None or restarted_at is None:
            return harness.Trial(exit_code=code, error=f"no restart seen | console: {run.tail(400)!r}")
        return harness.Trial(
            metrics={"restart_s": restarted_at - fail_ts, "wall_s": ended - started if code is not None else None},
            exit_code=code,
        )


def _wait_restarted(run: harness.RunDir, n: int, proc: Any, timeout_s: float) -> float | None:
    """The start time of the last rank of attempt 1 once all ``n`` have started; None if never."""
    end = time.monotonic() + timeout_s
    ranks_dir = os.path.join(run.path, "ranks")
    while time.monotonic() < end:
        starts = []
        for name in os.listdir(ranks_dir):
            fields = (_read(os.path.join(ranks_dir, name)) or "").split()
            if len(fields) == 3 and fields[2] == "1":
                starts.append(float(fields[0]))
        if len(starts) >= n:
            return max(starts)
        if proc.poll() is not None:
            return None
        time.sleep(POLL_S)
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _read_float(path: str) -> float | None:
    text = _read(path)
    return float(text) if text else None


def run(ctx: Context) -> dict[str, Any]:
    if not xrun_supports("--elastic"):
        return unavailable(NAME, TITLE, "this xrun has no --elastic (see `xrun --help`)")
    n = ctx.option("nproc", 2, 4)
    cap = ctx.option("cap_s", 30.0, 60.0)
    rounds = ctx.rounds(1, 5)
    variants, skipped = ctx.pick(VARIANTS)
    sec = section(
        NAME,
        TITLE,
        params={"nproc": n, "fail_rank": n - 1, "fail_after_s": 1.0, "rounds": rounds},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )
    results = harness.run_rounds(variants, rounds, lambda v: trial(v, n, cap), rng=ctx.rng, label=NAME)
    group = {"label": f"N={n}", "params": {"nproc": n}, **harness.summarize_group(results, censor_at=cap)}
    sec["groups"].append(group)
    xrun, torchrun = median(group, "xrun", "restart_s"), median(group, "torchrun", "restart_s")
    if torchrun is not None:
        sec["targets"].append(target("xrun restart latency vs torchrun's (+20%)", xrun, torchrun * 1.2, "s"))
    return finish(sec)


def main() -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.elastic_restart")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    ns = parser.parse_args()
    sec = run(Context(reps=ns.reps, options={"nproc": ns.nproc}))
    for name, entry in sec["groups"][0]["variants"].items():
        stats = entry["metrics"].get("restart_s") or {}
        print(f"{name:<9} restart_s median {stats.get('median')} (n={stats.get('n')}) exit codes {entry['exit_codes']}")
    print(json.dumps(sec, default=str)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
