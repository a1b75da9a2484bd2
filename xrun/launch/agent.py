"""The node agent: one NodeSpec in, supervised rank processes, one exit code out.

Pipeline: spec -> per-rank environment -> core binding -> RankGroup (own sessions, event loop) -> report.
Imports no torch; the elastic path lives in its own module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from xrun.launch import binding
from xrun.launch.binding import RankBinding
from xrun.launch.spec import NodeSpec, RankSpec
from xrun.launch.supervise import NodeResult, RankGroup, RankOutcome, RankProcess, SuperviseOptions


class AgentHooks(Protocol):
    """What a control channel plugs into the agent (see xrun.launch.connect)."""

    def attach(self, group: RankGroup) -> None:
        """Register readers on the group's event loop; keep the group to call request_stop()."""

    def on_rank_exit(self, outcome: RankOutcome) -> None:
        """Called in the event loop as each rank's main process exits."""

    def on_result(self, result: NodeResult) -> None:
        """Called once with the node's result, after every rank is gone."""


@dataclass(frozen=True)
class BoundRank:
    """A rank after binding: the argv may gain a numactl prefix, or the cpus travel as an affinity mask."""

    argv: tuple[str, ...]
    cpus: frozenset[int] | None
    extra_env: Mapping[str, str]


def rank_environment(base: Mapping[str, str], spec: NodeSpec, rank: RankSpec) -> dict[str, str]:
    """The user's environment, then the runner's exports, then the rank contract (which always wins)."""
    env = dict(base)
    env.update(spec.env)
    env.update(rank.env)
    return env


def plan_bindings(spec: NodeSpec, env: Mapping[str, str]) -> tuple[RankBinding, ...] | None:
    """This node's per-rank CPU sets for --bind_cores_to_rank (None without it); reads /sys, starts nothing."""
    if not spec.options.bind_cores:
        return None
    binding.check_binding_env(env)
    allowed = frozenset(os.sched_getaffinity(0))
    return binding.plan_binding(binding.read_topology(), len(spec.ranks), allowed, spec.options.bind_core_list)


def bind_ranks(spec: NodeSpec, env: Mapping[str, str]) -> tuple[BoundRank, ...]:
    """Apply --bind_cores_to_rank: numactl when installed, else an inherited affinity mask (memory not bound)."""
    bindings = plan_bindings(spec, env)
    if bindings is None:
        return tuple(BoundRank(argv=r.argv, cpus=None, extra_env={}) for r in spec.ranks)
    pool = binding.binding_pool(frozenset(os.sched_getaffinity(0)), spec.options.bind_core_list)
    note = binding.binding_note(bindings, pool)
    if note:
        print(f"xrun: {spec.host}: {note}", file=sys.stderr)
    numactl = binding.find_numactl()
    if numactl is None:
        print(
            f"xrun: {spec.host}: numactl not found; binding CPUs by affinity only, memory is not bound "
            "(apt-get install numactl)",
            file=sys.stderr,
        )
    return tuple(
        BoundRank(
            argv=binding.numactl_argv(b, r.argv, numactl) if numactl else r.argv,
            cpus=None if numactl else frozenset(b.cpus),
            extra_env=binding.binding_env(b, env),
        )
        for r, b in zip(spec.ranks, bindings)
    )


def rank_processes(spec: NodeSpec, base_env: Mapping[str, str]) -> tuple[RankProcess, ...]:
    envs = [rank_environment(base_env, spec, rank) for rank in spec.ranks]
    bound = bind_ranks(spec, envs[0] if envs else base_env)
    return tuple(
        RankProcess(
            rank=rank.rank,
            local_rank=rank.local_rank,
            argv=b.argv,
            env={**env, **b.extra_env},
            cpus=b.cpus,
            cwd=spec.cwd,
        )
        for rank, env, b in zip(spec.ranks, envs, bound)
    )


def supervise_options(spec: NodeSpec) -> SuperviseOptions:
    options = spec.options
    return SuperviseOptions(
        host=spec.host,
        prefix=options.prefix,
        quiet=options.quiet,
        log_dir=options.log_dir,
        shutdown_timeout=options.shutdown_timeout,
    )


def run_node(spec: NodeSpec, *, hooks: AgentHooks | None = None) -> int:
    """Run this node's ranks to the end; print the failure report; return the node's exit code."""
    if spec.elastic is not None:  # torch's elastic agent supervises; the adapter keeps xrun's contract
        from xrun.launch.elastic import run_elastic

        return run_elastic(spec, hooks=hooks)
    from xrun.launch.report import format_failure_report, write_failure_json

    group = RankGroup(
        rank_processes(spec, os.environ),
        supervise_options(spec),
        on_rank_exit=hooks.on_rank_exit if hooks else None,
    )
    if hooks:
        hooks.attach(group)
    result = group.run()
    if result.root_cause is not None or result.interrupted_by is not None:
        sys.stderr.write(format_failure_report(result) + "\n")
        if spec.options.log_dir is not None:
            write_failure_json(os.path.join(spec.options.log_dir, spec.host, "failure.json"), result)
    if hooks:
        hooks.on_result(result)
    return result.exit_code
