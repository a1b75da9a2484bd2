"""Scenario ``stacks`` (issue 14): SIGQUIT to xrun until the merged view of every rank's stack is printed.

N local sleeper ranks (default 8) run under xrun; once all run, SIGQUIT goes to xrun's pid and the clock runs
until the last line of the merged view (``ranks 0-7: sleeper.py:...``) reaches xrun's console. Then SIGINT ends
the trial and nothing tagged may be left. No other launcher has this feature, so there is no comparison; the
target is the issue's "a few seconds at most" for a node: the agent gives py-spy 5 s.

Opt-in (``python -m bench stacks``): not part of ``all``, whose nine scenarios tests/test_bench.py pins.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from typing import Any

from bench import harness, procs
from bench.launchers import LAUNCHERS, LocalJob
from bench.scenarios.base import Context, finish, median, num, section

NAME = "stacks"
TITLE = "10. Stacks on demand: SIGQUIT to xrun until the merged view of N ranks is printed"
TABLE = {"metrics": [["view_s", "SIGQUIT to merged view", "s"]], "ratio": None, "reference": "xrun"}
TARGET_S = 5.0


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.option("nproc", 8, 8)
    rounds = ctx.rounds(2, 7)
    cap = ctx.option("cap_s", 10.0, 10.0)
    variants, skipped = ctx.pick(("xrun",))
    sec = section(NAME, TITLE, params={"nproc": n, "rounds": rounds, "cap_s": cap}, skipped=skipped, table=TABLE,
                  groups=[], targets=[])
    if not variants:
        return finish(sec)
    results = harness.run_rounds(variants, rounds, lambda _: trial(n, cap), rng=ctx.rng, label=NAME)
    group = {"label": f"{n} ranks", "params": {"nproc": n}, **harness.summarize_group(results, censor_at=cap)}
    sec["groups"].append(group)
    value = median(group, "xrun", "view_s")
    sec["targets"].append({
        "what": f"xrun: SIGQUIT to the merged view of {n} ranks ≤ {TARGET_S:g} s",
        "value": value,
        "met": value is not None and value <= TARGET_S,
        "shown": f"{num(value)} s",
    })
    return finish(sec)


def trial(n: int, cap_s: float) -> harness.Trial:
    with harness.RunDir() as run:
        tag = procs.new_tag()
        job = LocalJob(nproc=n, script=harness.rank_script("sleeper.py"), master_port=harness.free_port(),
                       args=harness.rank_args(tag, run, ("sleep=60",)))
        proc = harness.start(LAUNCHERS["xrun"].argv(job), env=harness.bench_env(tag), console=subprocess.PIPE)
        with harness.leave_nothing(proc, tag):
            if not harness.wait_ranks(run, n, proc, timeout_s=60):
                return harness.Trial(exit_code=proc.poll(), error="ranks did not start")
            time.sleep(0.3)  # the agent's steady state, as scenario 4
            started = time.monotonic()
            harness.send(proc, signal.SIGQUIT)
            shown = _wait_for_view(proc, n, started + cap_s)
            view_s = None if shown is None else shown - started
            harness.send(proc, signal.SIGINT)
            proc.wait(timeout=60)
        left = procs.tagged_pids(tag)
        procs.kill_all(left)
    return harness.Trial(metrics={"view_s": view_s, "leftovers": float(len(left))}, exit_code=proc.returncode)


def _wait_for_view(proc: subprocess.Popen[bytes], n: int, deadline: float) -> float | None:
    """When the view's line for all ``n`` ranks (identical sleepers: one group) arrived; None past ``deadline``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    wanted = f"ranks 0-{n - 1}: ".encode()
    pending = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        if wanted in pending:
            return time.monotonic()
        pending = pending[-4096:]
    return None
