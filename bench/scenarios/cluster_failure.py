"""Scenario 8: cross-node failure propagation. 4 nodes, one rank each; the rank on node3 exits 7 after 3 s.

Measured from that rank's exit timestamp: when no rank runs on any node, when the launcher exits, its exit code,
what is left. The nodes share the PID space with this machine, so the same /proc polling as scenario 3 works.
deepspeed (pdsh launcher) runs for comparison where installed: it has no cross-node teardown, so its survivors
run until the cap.

``xrun:pod`` is pod mode (issue 11): no head node, each namespace node runs its own ``xrun --pod --node_rank K``
(started together by a small waiter process, whose exit code is node 0's xrun's); node 0's xrun hosts the
control channel, so the failure travels node3 -> node 0 -> every node.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from bench import cluster, harness
from bench.scenarios.base import Context, finish, median, num, section, unavailable
from bench.scenarios.failure import teardown_trial

NAME = "cluster_failure"
TITLE = "8. Cross-node failure: 4 nodes, the rank on node3 exits 7"
VARIANTS = ("xrun:ssh", "xrun:pdsh", "xrun:pod", "deepspeed:pdsh")
# Starts every node's xrun (argv lists as JSON), waits for all, exits with node 0's code.
POD_WAITER = ("import json, subprocess, sys; procs = [subprocess.Popen(a) for a in json.loads(sys.argv[1])]; "
              "codes = [p.wait() for p in procs]; sys.exit(codes[0])")
TABLE = {
    "metrics": [["all_dead_s", "no rank anywhere", "s"], ["exit_s", "launcher exit", "s"]],
    "ratio": "all_dead_s",
    "references": ["xrun:ssh"],
    "extra_ratio": "exit_s",
}


def run(ctx: Context) -> dict[str, Any]:
    k = ctx.option("nodes", 4, 4)
    cap = ctx.option("cap_s", 5.0, 10.0)
    rounds = ctx.rounds(1, 3)
    backends = cluster.xrun_backends()
    wanted = [v for v in VARIANTS if ctx.launchers is None or v.split(":")[0] in ctx.launchers]
    variants = [v for v in wanted if not v.startswith("xrun:") or v.split(":")[1] in {*backends, "pod"}]
    _, missing = ctx.pick(["deepspeed"])
    variants = [v for v in variants if not (v.startswith("deepspeed") and missing)]
    skipped = {v: missing.get("deepspeed", "xrun has no such --launcher backend yet") for v in VARIANTS
               if v not in variants}  # fmt: skip
    if not any(v.startswith("xrun:") for v in variants):
        return unavailable(NAME, TITLE, f"xrun has no ssh/pdsh backend yet (--launcher knows: {sorted(backends)})")
    params = {"nodes": k, "fail_host": "node3", "fail_after_s": 3.0, "code": 7, "cap_s": cap, "rounds": rounds}
    sec = section(NAME, TITLE, params=params, skipped=skipped, table=TABLE, groups=[], targets=[])
    args = ("fail_host=node3", "fail_after=3", "code=7", "sleep=60")
    try:
        with cluster.cluster(k, busy_timeout_s=ctx.option("busy_timeout_s", 20.0, 300.0),
                             state=ctx.options.get("cluster_state")) as c:  # fmt: skip
            with harness.RunDir() as files:
                hostfile = str(c.hostfile(os.path.join(files.path, "hostfile"), slots=1, nodes=cluster.node_names(k)))

                def trial(variant: str) -> harness.Trial:
                    launcher, _, backend = variant.partition(":")
                    script = harness.rank_script("sleeper.py")

                    def make(rank_args: tuple[str, ...]) -> list[str]:
                        port = harness.free_port()
                        if variant == "xrun:pod":
                            return pod_argv(c, hostfile, port, script, rank_args, k)
                        if launcher == "xrun":
                            config = str(c.ssh_config)
                            return cluster.xrun_cluster_argv(
                                backend, hostfile, port, script, rank_args, ssh_config=config
                            )
                        return cluster.deepspeed_cluster_argv(hostfile, port, script, rank_args)

                    return teardown_trial(make, k, args, cap_s=cap, trigger=None, start_timeout_s=120.0)

                results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=NAME)
    except cluster.Unavailable as why:
        return unavailable(NAME, TITLE, str(why))
    group = harness.summarize_group(results, references=TABLE["references"], censor_at=cap)
    sec["groups"].append({"label": f"{k} nodes", "params": {"nodes": k}, **group})
    for variant in ("xrun:ssh", "xrun:pdsh", "xrun:pod"):
        entry = group["variants"].get(variant)
        if entry:
            dead = median(sec["groups"][-1], variant, "all_dead_s")
            left = entry["metrics"].get("leftovers", {}).get("max")
            sec["targets"].append({
                "what": f"{variant}: every rank on every node dead, exit code 7, nothing left",
                "value": dead,
                "met": dead is not None and left == 0 and all(c == 7 for c in entry["exit_codes"]),
                "shown": f"dead after {'?' if dead is None else f'{dead:.3f}'} s, at most {num(left)} left, "
                f"codes {','.join(map(str, entry['exit_codes']))}",
            })  # fmt: skip
    return finish(sec)


def pod_argv(c: Any, hostfile: str, port: int, script: str, args: tuple[str, ...], k: int) -> list[str]:
    """The waiter that starts ``xrun --pod --node_rank K`` on each of the k namespace nodes (this checkout's xrun)."""
    sources = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    nodes = [
        c.node_argv(name, ["env", f"PYTHONPATH={sources}", sys.executable, "-m", "xrun", "-H", hostfile, "--pod",
                           "--node_rank", str(rank), "--master_port", str(port), "--control_port", str(port + 1),
                           script, *args])
        for rank, name in enumerate(cluster.node_names(k))
    ]
    return [sys.executable, "-c", POD_WAITER, json.dumps(nodes)]
