"""Scenario 4: signal teardown. SIGINT (optionally SIGTERM) to the launcher's pid only, nothing else.

Each launcher runs in its own session, so the signal reaches only that pid, as with ``kill -INT PID`` from a
scheduler or a wrapper (not Ctrl-C, where the terminal signals the whole process group).
"""

from __future__ import annotations

import signal
from typing import Any

from bench import harness
from bench.scenarios.base import Context, finish, median, num, section
from bench.scenarios.failure import local_argv, teardown_trial

NAME = "signal"
TITLE = "4. Signal teardown: signal to the launcher's pid only, 4 sleeping ranks"
VARIANTS = ("xrun", "torchrun", "deepspeed")
TABLE = {
    "metrics": [["all_dead_s", "all ranks dead", "s"], ["exit_s", "launcher exit", "s"]],
    "ratio": "all_dead_s",
    "reference": "xrun",
    "extra_ratio": "exit_s",
}


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.option("nproc", 4, 4)
    cap = ctx.option("cap_s", 3.0, 8.0)
    sigs = ctx.option("signals", ("INT",), ("INT",))
    rounds = ctx.rounds(1, 3)
    variants, skipped = ctx.pick(VARIANTS)
    sec = section(
        NAME,
        TITLE,
        params={"nproc": n, "signals": list(sigs), "cap_s": cap, "rounds": rounds},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )
    for name in sigs:
        sig = signal.Signals["SIG" + name.upper().removeprefix("SIG")]

        def trial(variant: str, sig: signal.Signals = sig) -> harness.Trial:
            return teardown_trial(local_argv(variant, n), n, ("sleep=60",), cap_s=cap, trigger=sig)

        results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=f"{NAME} {sig.name}")
        group = {"label": sig.name, "params": {"signal": sig.name}, **harness.summarize_group(results, censor_at=cap)}
        sec["groups"].append(group)
        codes = group["variants"].get("xrun", {}).get("exit_codes", [])
        dead = median(group, "xrun", "all_dead_s")
        left = group["variants"].get("xrun", {}).get("metrics", {}).get("leftovers", {}).get("max")
        if "xrun" in group["variants"]:
            sec["targets"].append(
                {
                    "what": f"xrun on {sig.name}: all ranks dead, no leftovers, exit code {128 + sig}",
                    "value": dead,
                    "met": dead is not None and left == 0 and all(c == 128 + sig for c in codes),
                    "shown": f"dead after {'?' if dead is None else f'{dead:.4f}'} s, at most {num(left)} left, "
                    f"codes {','.join(map(str, codes))}",
                }
            )
    return finish(sec)
