"""Scenario 5: memory. Peak RSS (VmHWM) of the launcher and of each node agent while 4 ranks sleep.

"Agent/helper" is every tagged process that is neither the launcher nor a rank (a node agent such as deepspeed's
``deepspeed.launcher.launch``, a forked watchdog, any middleman). VmHWM is a high-water mark, so sampling every
few ms until exit sees the peak unless it is reached in the last few ms of a process's life. A forked helper's
RSS counts pages it still shares with its parent, so the sum of RSS overstates the footprint; the last column
is the peak of the summed PSS (shared pages split among sharers), sampled every 20 ms.
"""

from __future__ import annotations

from typing import Any

from bench import harness
from bench.launchers import LAUNCHERS, LocalJob
from bench.scenarios.base import Context, finish, median, section, target

NAME = "memory"
TITLE = "5. Memory: peak RSS of the launcher and node agents, 4 sleeping ranks"
VARIANTS = ("floor", "xrun", "torchrun", "deepspeed")
TABLE = {
    "metrics": [
        ["launcher_mib", "launcher peak RSS", "MiB"],
        ["agent_mib", "largest agent/helper peak RSS", "MiB"],
        ["agents", "agents/helpers", ""],
        ["total_pss_mib", "launcher+helpers peak PSS", "MiB"],
    ],
    "ratio": "launcher_mib",
    "reference": "floor",
}


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.option("nproc", 4, 4)
    sleep = ctx.option("sleep_s", 1.0, 2.0)
    rounds = ctx.rounds(1, 3)
    variants, skipped = ctx.pick(VARIANTS)
    sec = section(
        NAME,
        TITLE,
        params={"nproc": n, "rank_sleep_s": sleep, "rounds": rounds},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )

    def trial(variant: str) -> harness.Trial:
        with harness.RunDir() as run:
            job = LocalJob(
                nproc=n,
                script=harness.rank_script("sleeper.py"),
                args=(f"sleep={sleep}",),
                master_port=harness.free_port(),
            )
            got = harness.run_local_job(LAUNCHERS[variant], job, run, deadline_s=90.0, sample_memory=True)
            console = run.tail(300)
        agents = {k: v for k, v in got.peak_kib.items() if k != "launcher"}
        trial = harness.Trial(
            metrics={
                "launcher_mib": got.peak_kib["launcher"] / 1024 if "launcher" in got.peak_kib else None,
                "agents": float(len(agents)),
                "leftovers": float(len(got.leftovers)),
                "total_pss_mib": got.peak_pss_kib / 1024 if got.peak_pss_kib else None,
                **({"agent_mib": max(agents.values()) / 1024} if agents else {}),
            },
            exit_code=got.exit_code,
            notes={"agents": {k: round(v / 1024, 1) for k, v in agents.items()}} if agents else {},
        )
        if got.exit_code != 0 or got.ranks_started != n:
            trial.error = f"exit {got.exit_code}, {got.ranks_started} of {n} ranks started | console: {console!r}"
        if "launcher" not in got.peak_kib:
            trial.error = "launcher exited before its memory was sampled"
        return trial

    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    group = {"label": f"N={n}", "params": {"nproc": n}, **harness.summarize_group(results)}
    sec["groups"].append(group)
    sec["targets"] += [
        target("xrun launcher peak RSS", median(group, "xrun", "launcher_mib"), 25.0, "MiB"),
        target("xrun helper (locally: its forked watchdog) peak RSS", median(group, "xrun", "agent_mib"), 25.0, "MiB"),
    ]
    return finish(sec)
