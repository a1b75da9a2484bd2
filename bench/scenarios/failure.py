"""Scenario 3: failure propagation. 4 ranks; one exits 7 after 1 s, the others sleep.

Measured from the failing rank's own exit timestamp (CLOCK_REALTIME, written right before ``os._exit``): when
the last rank is gone (zombies count as gone), when the launcher exits, its exit code, and what is left alive.
The bench polls /proc every ~0.5 ms here; that is the point of the benchmark, and costs the launcher a little CPU.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from bench import harness, procs
from bench.launchers import LAUNCHERS, LocalJob
from bench.scenarios.base import Context, finish, median, section, target

NAME = "failure"
TITLE = "3. Failure propagation: 4 ranks, one exits 7 after 1 s"
VARIANTS = ("xrun", "xrun:no_stacks", "torchrun", "deepspeed")
# xrun takes the survivors' stacks before it stops them (issue 14, on by default): the stop waits for py-spy.
# ``xrun:no_stacks`` is the same run with --no_failure_stacks, the teardown alone.
VARIANT_FLAGS = {"xrun:no_stacks": ("--no_failure_stacks",)}
TABLE = {
    "metrics": [["all_dead_s", "all ranks dead", "s"], ["exit_s", "launcher exit", "s"]],
    "ratio": "all_dead_s",
    "reference": "xrun",
    "extra_ratio": "exit_s",
}
POLL_S = 0.0005


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.option("nproc", 4, 4)
    cap = ctx.option("cap_s", 5.0, 10.0)
    rounds = ctx.rounds(1, 5)
    variants, skipped = ctx.pick(VARIANTS)
    sec = section(
        NAME,
        TITLE,
        params={"nproc": n, "fail_rank": n - 1, "fail_after_s": 1.0, "code": 7, "cap_s": cap, "rounds": rounds},
        skipped=skipped,
        table=TABLE,
        groups=[],
        targets=[],
    )

    def trial(variant: str) -> harness.Trial:
        args = (f"fail_rank={n - 1}", "fail_after=1.0", "code=7", "sleep=60")
        return teardown_trial(local_argv(variant, n), n, args, cap_s=cap, trigger=None)

    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    group = {"label": f"N={n}", "params": {"nproc": n}, **harness.summarize_group(results, censor_at=cap)}
    sec["groups"].append(group)
    sec["targets"] += [
        target("xrun --no_failure_stacks: all ranks dead after the failure",
               median(group, "xrun:no_stacks", "all_dead_s"), 0.020, "s"),
        target("xrun --no_failure_stacks: launcher exit after the failure",
               median(group, "xrun:no_stacks", "exit_s"), 0.050, "s"),
        target("xrun (stacks at failure): all ranks dead after the failure", median(group, "xrun", "all_dead_s"),
               0.100, "s"),
    ]
    codes = group["variants"].get("xrun", {}).get("exit_codes", [])
    if codes:
        sec["targets"].append(
            {
                "what": "xrun exits with the failing rank's code, 7",
                "value": None,
                "met": all(c == 7 for c in codes),
                "shown": "codes " + ",".join(map(str, codes)),
            }
        )
    return finish(sec)


def local_argv(variant: str, n: int) -> Callable[[tuple[str, ...]], list[str]]:
    """How ``variant`` starts N local sleeper ranks with the given script arguments."""

    def make(args: tuple[str, ...]) -> list[str]:
        script = harness.rank_script("sleeper.py")
        job = LocalJob(nproc=n, script=script, args=args, master_port=harness.free_port(),
                       xrun_flags=VARIANT_FLAGS.get(variant, ()))
        return LAUNCHERS[variant.split(":")[0]].argv(job)

    return make


def teardown_trial(
    make_argv: Callable[[tuple[str, ...]], list[str]],
    n: int,
    args: tuple[str, ...],
    *,
    cap_s: float,
    trigger: signal.Signals | None,
    settle_s: float = 0.3,
    env_extra: dict[str, str] | None = None,
    start_timeout_s: float = 60.0,
) -> harness.Trial:
    """Start N sleeper ranks; either wait for one to fail (trigger None) or send ``trigger`` to the launcher's
    pid once all ranks run. Time everything from that moment."""
    with harness.RunDir() as run:
        tag = procs.new_tag()
        argv = make_argv(harness.rank_args(tag, run, args))
        env = {**harness.bench_env(tag), **(env_extra or {})}
        proc = harness.start(argv, env=env, console=run.console)
        with harness.leave_nothing(proc, tag):
            if not harness.wait_ranks(run, n, proc, timeout_s=start_timeout_s):
                return harness.Trial(exit_code=proc.poll(), error=f"ranks did not start | console: {run.tail(300)!r}")
            ranks = list(procs.rank_pids(run.path))
            t_ref: float | None = None
            if trigger is not None:
                time.sleep(settle_s)  # let the launcher reach its steady state (handlers, monitor loop)
                t_ref = time.time()
                harness.send(proc, trigger)
            dead_at, exit_at, t_ref = _watch(proc, ranks, run, cap_s, t_ref)
        if exit_at is not None:
            time.sleep(max(0.0, exit_at + 0.1 - time.time()))  # leftovers: alive 100 ms after the launcher exited
        left = procs.tagged_pids(tag)
        leftovers = [procs.cmdline(p) for p in left]
        procs.kill_all(left)
    if t_ref is None:
        return harness.Trial(exit_code=proc.returncode, error="the failing rank never reported its exit")
    return harness.Trial(
        metrics={
            "all_dead_s": None if dead_at is None else dead_at - t_ref,
            "exit_s": None if exit_at is None else exit_at - t_ref,
            "leftovers": float(len(leftovers)),
        },
        exit_code=proc.returncode if exit_at is not None else None,
        notes={"leftovers": leftovers} if leftovers else {},
    )


def _watch(
    proc: Any, ranks: list[int], run: harness.RunDir, cap_s: float, t_ref: float | None
) -> tuple[float | None, float | None, float | None]:
    """Poll until every rank is dead and the launcher exited, or ``cap_s`` after the reference moment.

    Each event is stamped with the wall clock read at the start of the poll that first saw it, so the error
    is at most one poll period (~0.5 ms plus scheduling delay on a loaded machine).
    """
    fail_file = os.path.join(run.path, "fail_ts")
    dead_at = exit_at = None
    start = time.time()
    while True:
        now = time.time()
        if exit_at is None and proc.poll() is not None:
            exit_at = now
        if dead_at is None and not any(procs.is_alive(p) for p in ranks):
            dead_at = now
        if t_ref is None and os.path.exists(fail_file):
            with open(fail_file) as f:
                t_ref = float(f.read())
        if dead_at is not None and exit_at is not None and t_ref is not None:
            return dead_at, exit_at, t_ref
        if (t_ref is not None and now - t_ref > cap_s) or (t_ref is None and now - start > 30.0):
            return dead_at, exit_at, t_ref
        time.sleep(POLL_S)
