"""Scenario 7: fan-out on the namespace cluster. 4, 32, 64, 128 nodes, one no-op rank per node.

xrun (ssh and pdsh backends) runs the no-op rank on every node: launch to every rank running (the last rank's
own start timestamp; the nodes share the filesystem and the clock) and to a clean exit. The baselines only
connect: ``pdsh -S -f 32 -w node1,... true`` and a shell doing ``ssh nodeI true`` one node after another.
Target: xrun's launch→exit ≤ 1.5× pdsh's. A third baseline, ``pdsh:ranks``, has pdsh start the no-op rank
itself (``python noop.py`` on every node, no agent): the multi-node floor, what any launcher that starts a
Python rank on every node must at least pay.

Head CPU per node: user + system CPU of the launcher and every process it started and reaped on the head (pdsh,
its ssh clients; paramiko's threads are xrun's own), divided by the nodes. The nodes' sshd and agents are not
the head's children, so they are not counted. Targets (issue 15, at 128 nodes): xrun's launch→exit ≤ 1.5×
``pdsh:ranks``, the pdsh backend's head CPU per node ≤ 1.2× ``pdsh:ranks``'s, the ssh backend's launcher
≤ 40 MiB.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from bench import cluster, harness, procs
from bench.scenarios.base import Context, finish, median, section, target, unavailable

NAME = "fanout"
TITLE = "7. Fan-out on the namespace cluster: N nodes, one no-op rank each"
VARIANTS = ("pdsh", "pdsh:ranks", "ssh:seq", "xrun:ssh", "xrun:pdsh")
TABLE = {
    "metrics": [
        ["wall_s", "launch→exit", "s"],
        ["last_rank_s", "all ranks running", "s"],
        ["launcher_mib", "launcher peak RSS", "MiB"],
        ["agent_mib", "largest node agent peak RSS", "MiB"],
        ["head_cpu_ms", "head CPU per node", "ms"],
    ],
    "ratio": "wall_s",
    "extra_ratio": "head_cpu_ms",
    "references": ["pdsh", "pdsh:ranks", "xrun:ssh"],
}
PDSH_ENV = {"PDSH_RCMD_TYPE": "ssh"}  # pdsh's default rcmd module may be rsh


def run(ctx: Context) -> dict[str, Any]:
    sizes = ctx.option("nodes", (4,), (4, 32, 64, 128))
    rounds = ctx.rounds(1, 3)
    backends = cluster.xrun_backends()
    variants = [v for v in VARIANTS if not v.startswith("xrun:") or v.split(":")[1] in backends]
    skipped = {v: "xrun has no such --launcher backend yet" for v in VARIANTS if v not in variants}
    if ctx.launchers is not None and "xrun" not in ctx.launchers:
        variants = [v for v in variants if not v.startswith("xrun")]
    if not any(v.startswith("xrun:") for v in variants):
        return unavailable(NAME, TITLE, f"xrun has no ssh/pdsh backend yet (--launcher knows: {sorted(backends)})")
    sec = section(NAME, TITLE, params={"nodes": list(sizes), "rounds": rounds}, skipped=skipped, table=TABLE,
                  groups=[], targets=[])  # fmt: skip
    try:
        with cluster.cluster(max(sizes), busy_timeout_s=ctx.option("busy_timeout_s", 20.0, 300.0),
                             state=ctx.options.get("cluster_state")) as c:  # fmt: skip
            for k in sizes:
                hosts = cluster.node_names(k)
                with harness.RunDir() as files:
                    hostfile = str(c.hostfile(os.path.join(files.path, "hostfile"), slots=1, nodes=hosts))

                    def trial(variant: str, hosts: list[str] = hosts, hostfile: str = hostfile) -> harness.Trial:
                        return fanout_trial(variant, hosts, hostfile, ssh_config=str(c.ssh_config))

                    results = harness.run_rounds(variants, rounds, trial, rng=ctx.rng, label=f"{NAME} {k} nodes")
                group = harness.summarize_group(results, references=TABLE["references"])
                sec["groups"].append({"label": f"{k} nodes", "params": {"nodes": k}, **group})
                sec["targets"] += scale_targets(sec["groups"][-1], k)
                for backend in ("ssh", "pdsh"):
                    value = median(sec["groups"][-1], f"xrun:{backend}", "wall_s", "pdsh")
                    sec["targets"].append(target(f"xrun ({backend}) / pdsh, {k} nodes", value, 1.5, "×"))
                    launcher_mib = median(sec["groups"][-1], f"xrun:{backend}", "launcher_mib")
                    if launcher_mib is not None:
                        what = f"xrun ({backend}) launcher peak RSS, {k} nodes"
                        sec["targets"].append(target(what, launcher_mib, 25.0, "MiB"))
                    agent = median(sec["groups"][-1], f"xrun:{backend}", "agent_mib")
                    if agent is not None:
                        sec["targets"].append(
                            target(f"xrun ({backend}) node agent peak RSS, {k} nodes", agent, 25.0, "MiB")
                        )
    except cluster.Unavailable as why:
        return unavailable(NAME, TITLE, str(why))
    return finish(sec)


def scale_targets(group: dict[str, Any], nodes: int) -> list[dict[str, Any]]:
    """Issue 15's targets, against pdsh starting the ranks itself (the multi-node floor)."""
    out = []
    for backend in ("ssh", "pdsh"):
        value = median(group, f"xrun:{backend}", "wall_s", "pdsh:ranks")
        out.append(target(f"xrun ({backend}) / pdsh:ranks, {nodes} nodes", value, 1.5, "×"))
    cpu = median(group, "xrun:pdsh", "head_cpu_ms", "pdsh:ranks")
    out.append(target(f"xrun (pdsh) head CPU per node / pdsh:ranks, {nodes} nodes", cpu, 1.2, "×"))
    ssh_mib = median(group, "xrun:ssh", "launcher_mib")
    if ssh_mib is not None:
        out.append(target(f"xrun (ssh) launcher peak RSS, {nodes} nodes (issue 15)", ssh_mib, 40.0, "MiB"))
    return out


def fanout_trial(variant: str, hosts: list[str], hostfile: str, *, ssh_config: str) -> harness.Trial:
    launcher, _, flavour = variant.partition(":")
    with harness.RunDir() as run:
        tag = procs.new_tag()
        if launcher == "xrun":
            args = harness.rank_args(tag, run, ())
            script = harness.rank_script("noop.py")
            port = harness.free_port()
            argv = cluster.xrun_cluster_argv(flavour, hostfile, port, script, args, ssh_config=ssh_config)
        elif flavour == "ranks":  # the multi-node floor: pdsh starts the rank itself, no agent in between
            argv = cluster.pdsh_argv(
                hosts, [sys.executable, harness.rank_script("noop.py"), *harness.rank_args(tag, run, ())]
            )
        elif launcher == "pdsh":
            argv = cluster.pdsh_argv(hosts, ["true", tag])
        else:
            argv = cluster.sequential_ssh_argv(hosts, ["true", tag])
        got = harness.run_command(
            argv,
            tag,
            run,
            deadline_s=120.0,
            env_extra=PDSH_ENV,
            sample_memory=launcher == "xrun",
            sample_every_s=0.02,
            more_helpers=lambda: procs.in_other_netns("xrun.launch"),
        )
        tail = run.tail(300)
    cpu_ms = got.cpu_s * 1000 / len(hosts) if got.cpu_s is not None else None
    trial = harness.Trial(
        metrics={"wall_s": got.wall_s, "leftovers": float(len(got.leftovers)), "head_cpu_ms": cpu_ms},
        exit_code=got.exit_code,
        notes={"leftovers": got.leftovers} if got.leftovers else {},
    )
    if launcher == "xrun" or flavour == "ranks":
        trial.metrics["last_rank_s"] = got.last_rank_s
    agents = [kib for name, kib in got.peak_kib.items() if "xrun.launch" in name]
    if agents:  # the node agents (python -m xrun.launch --connect ...), one per node
        trial.metrics["launcher_mib"] = got.peak_kib.get("launcher", 0) / 1024 or None
        trial.metrics["agent_mib"] = max(agents) / 1024
    problems = []
    if got.exit_code != 0:
        problems.append(f"exit {got.exit_code} | console: {tail!r}")
    if (launcher == "xrun" or flavour == "ranks") and got.ranks_started != len(hosts):
        problems.append(f"{got.ranks_started} of {len(hosts)} ranks started")
    trial.error = "; ".join(problems) or None
    return trial
