"""--dry-run output: the plan and the exact commands, for humans (text) or for tools (one JSON object)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from xrun.common.spec import REPLICA_GROUP_ID, RankSpec
from xrun.runner.backends import Invocation, backend_traits
from xrun.runner.plan import Plan
from xrun.runner.pod.placement import dry_run_json, dry_run_lines
from xrun.shell import render


def plan_json(plan: Plan, invocation: Invocation) -> dict[str, Any]:
    """The documented, stable dry-run schema (keep these names)."""
    commands = {command.host: list(command.argv) for command in invocation.commands}
    return {
        "world_size": plan.world_size,
        "master_addr": plan.shown_master_addr,
        "master_port": plan.rendezvous.master_port,
        "master_port_choice": port_choice(plan),
        "backend": plan.backend,
        "world_info": plan.world_info,
        "run_id": plan.rendezvous.run_id,
        **dry_run_json(plan),  # "platform": what was detected, "pod": this node's pod-mode setup
        "restarts": {"max_restarts": plan.request.restart.max_restarts,
                     "min_attempt_s": plan.request.restart.min_attempt_s, "spares": len(plan.spares)},
        # --spares: hot spares outside the world, by agent id (after the world's nodes'); a spare runs a lost
        # node's slots, so it has none of its own here
        "spares": [{"host": host, "agent": agent, "command": commands.get(host)}
                   for agent, host in enumerate(plan.spares, start=len(plan.nodes))],
        "precheck": plan.request.remote.precheck,
        "preload": list(plan.request.options.preload),
        **replicas_json(plan),
        "nodes": [
            {
                "host": node.host,
                "node_rank": node.node_rank,
                "slots": list(plan.world[node.host]),
                "command": commands.get(node.host),
                # Names only: exported values may be secrets (HF_TOKEN) and travel only over the control channel.
                "exports": sorted(node.env),
                "ranks": [_rank_json(rank, invocation, plan.shown_master_addr) for rank in node.ranks],
            }
            for node in plan.nodes
        ],
    }


def _rank_json(rank: RankSpec, invocation: Invocation, master_addr: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "rank": rank.rank,
        "local_rank": rank.local_rank,
        "env": _shown_env(rank.env, master_addr),
        "argv": list(rank.argv),
    }
    if rank.rank in invocation.cpus:
        data["cpus"] = invocation.cpus[rank.rank]
    return data


def _shown_env(env: Mapping[str, str], master_addr: str) -> dict[str, str]:
    """A rank's env as the dry run shows it: a MASTER_ADDR that the start barrier decides shown as
    ``<node0 address>``, in its place before MASTER_PORT."""
    if "MASTER_ADDR" in env:
        return dict(env)
    shown: dict[str, str] = {}
    for name, value in env.items():
        if name == "MASTER_PORT":
            shown["MASTER_ADDR"] = master_addr
        shown[name] = value
    return shown


def port_choice(plan: Plan) -> str:
    """``given`` (used as is), ``free`` (drawn by each local run) or ``node0`` (chosen by node 0's agent)."""
    if plan.node0_picks_port:
        return "node0"
    if plan.nodes and plan.nodes[0].replicas is not None and not backend_traits(plan.backend).local:
        return "given"  # --replica_groups on several nodes: every group's port is counted up from the plan's
    return plan.request.master_port_choice.value


def port_note(plan: Plan) -> list[str]:
    """The dry run says when the port above is not the one every run will use (issue 17)."""
    choice = port_choice(plan)
    if choice == "free":
        return ["master port: a free one, drawn again by each run (no --master_port)"]
    if choice == "node0":
        first = plan.rendezvous.master_port
        tried = f"{first} if free on {plan.nodes[0].host}, else " if first else ""
        return [f"master port: {tried}a free one there, chosen by node 0's agent at the start barrier"]
    return []


def restart_note(plan: Plan) -> list[str]:
    """--max_restarts of a static job (issue 23): how the job keeps going after a failure."""
    policy = plan.request.restart
    if not policy.restarts:
        return []
    if plan.nodes and plan.nodes[0].replicas is not None:  # each group's budget, spent by its node
        return [f"restarts: up to {policy.max_restarts} of each replica group alone after a failure in it, the other "
                "groups running on; a group with none left fails the job"]
    stop = (f"; stop early when two attempts in a row fail the same way within {policy.min_attempt_s:g} s "
            f"(--min_attempt_s)" if policy.min_attempt_s > 0 else "")
    lines = [f"restarts: up to {policy.max_restarts} of the whole job on the same nodes after a failure{stop}"
             + ("; a lost node's place goes to a hot spare" if plan.spares else "")]
    if plan.request.remote.no_ssh:  # pod mode: node 0 waits at the next barrier for a lost node that comes back
        lines.append(f"restarts: a lost node other than node 0 may come back (the same command) within "
                     f"--join_timeout {plan.request.remote.join_timeout:g} s; node 0's loss ends the job")
    return lines


def spares_note(plan: Plan) -> list[str]:
    """--spares (issue 23): what the hot spares are for, which --max_restarts and --precheck decide (issue 33)."""
    if not plan.spares:
        return []
    if plan.request.replicas is not None and plan.request.restart.restarts:
        what = ("a lost node's replica groups start again on it, each restart of its budget; every other node keeps "
                "running")
    elif plan.request.restart.restarts:
        what = "a lost node's place goes to it at a restart"
    else:
        what = ("it takes the place of a node --precheck finds bad before any rank starts; a node lost after the start "
                "ends the job (no restart without --max_restarts)")
    return [f"spares: {', '.join(plan.spares)} (hot: its agent starts with the job and waits; {what})"]


def precheck_note(plan: Plan) -> list[str]:
    """--precheck (issue 24): the network check that runs before any rank starts, of every attempt."""
    if not plan.request.remote.precheck:
        return []
    bad = "is replaced by a spare that passed (not a restart), or, short of spares, ends the job (exit 1)" \
        if plan.spares else "ends the job (exit 1)"
    line = (f"precheck: once every agent is up, the network check (as xrun check --network) across the "
            f"{len(plan.nodes)} nodes{' and the spares' if plan.spares else ''} before any rank starts; a slow or "
            f"unreachable node {bad}")
    if plan.request.restart.restarts:  # --max_restarts: each restart's barrier checks again
        line += "; again before every restart"
    return [line]


def preload_note(plan: Plan) -> list[str]:
    """--preload (issue 32): what each node imports once, and that every attempt's ranks are forked from it."""
    modules = plan.request.options.preload
    if not modules:
        return []
    return [f"preload: each node's agent starts one helper that imports {','.join(modules)} before its ranks start "
            "(a module it cannot import ends the job, exit 2); every rank of every attempt is forked from it"]


def replicas_json(plan: Plan) -> dict[str, Any]:
    """--replica_groups (issue 39 §2): the groups' ports and the Lighthouse's; nothing without the flag."""
    replicas = plan.nodes[0].replicas if plan.nodes else None
    if replicas is None:
        return {}
    return {"replica_groups": {**replicas.to_json(), "lighthouse": f"{plan.shown_master_addr}:"
                                                                  f"{replicas.lighthouse_port}"}}


def replicas_note(plan: Plan) -> list[str]:
    """--replica_groups: each group's ranks, port and (on several nodes) node, and the Lighthouse node 0 runs."""
    replicas = plan.nodes[0].replicas if plan.nodes else None
    if replicas is None:
        return []
    size = plan.world_size // replicas.count
    hosts = [host for host, slots in plan.world.items() for _ in slots] if len(plan.nodes) > 1 else []
    groups = ", ".join(f"{g} ranks {g * size}-{(g + 1) * size - 1} port {port}"
                       + (f" on {hosts[g * size]}" if hosts else "")  # several nodes: each group on one
                       for g, port in enumerate(replicas.master_ports))
    return [f"replica groups: {replicas.count} of {size} rank{'s' * (size != 1)}, each its own world and store "
            f"({groups}); torchft_lighthouse on node 0 at port {replicas.lighthouse_port}"]


def plan_text(plan: Plan, invocation: Invocation) -> str:
    nodes = len(plan.nodes)
    lines = [
        f"xrun dry run: {nodes} node{'s' * (nodes != 1)}, {plan.world_size} rank{'s' * (plan.world_size != 1)}, "
        f"backend {plan.backend}",
        f"master {plan.shown_master_addr}:{plan.rendezvous.master_port}  run id {plan.rendezvous.run_id}",
        *port_note(plan),
        *restart_note(plan),
        *spares_note(plan),
        *precheck_note(plan),
        *preload_note(plan),
        *replicas_note(plan),
        f"world info {plan.world_info}",
        *dry_run_lines(plan),
    ]
    commands = {command.host: command.argv for command in invocation.commands}
    for node in plan.nodes:
        slots = ",".join(str(s) for s in plan.world[node.host])
        first, last = node.ranks[0].rank, node.ranks[-1].rank
        lines.append(f"node {node.node_rank} {node.host}: slots {slots}, ranks {first}-{last}")
        if node.host in commands:
            lines.append(f"  agent: {render(commands[node.host])}")
        if node.env:
            lines.append(f"  exports: {' '.join(sorted(node.env))}")
        for rank in node.ranks:
            cpus = f" [cpus {invocation.cpus[rank.rank]}]" if rank.rank in invocation.cpus else ""
            group = (f", group {rank.env[REPLICA_GROUP_ID]} rank {rank.env['RANK']}"
                     if REPLICA_GROUP_ID in rank.env else "")
            lines.append(f"  rank {rank.rank} (local {rank.local_rank}{group}){cpus}: {render(rank.argv)}")
    for agent, host in enumerate(plan.spares, start=len(plan.nodes)):
        lines.append(f"spare {host}: agent {agent}, standing by outside the world")
        if host in commands:
            lines.append(f"  agent: {render(commands[host])}")
    if invocation.note:
        lines.append(f"({invocation.note})")
    return "\n".join(lines)


def print_plan(plan: Plan, invocation: Invocation, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(plan_json(plan, invocation)))
    else:
        print(plan_text(plan, invocation))
