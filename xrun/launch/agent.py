"""The node agent: one NodeSpec in, supervised rank processes, one exit code out.

Pipeline: spec -> ranks (xrun.launch.ranks.processes: environment, core binding, a per-run directory of
``TORCHELASTIC_ERROR_FILE``s) -> RankGroup (xrun.launch.ranks.supervise: own
sessions, event loop; xrun.launch.doctor.node_doctor: stacks, the hang watch) or, with ``--elastic``, torch's agent
(xrun.launch.elastic.run) -> NodeResult -> the GPUs released (xrun.launch.ranks.gpu_release) -> report
(xrun.launch.result.failure_report.conclude) -> exit code. Imports no torch; the elastic path loads only when asked for.
"""

from __future__ import annotations

import os
from typing import Protocol

from xrun.launch.doctor.node_doctor import NodeDoctor
from xrun.launch.procs.watchdog import removed_if_the_agent_dies
from xrun.launch.ranks.gpu_release import wait_for_gpu_release
from xrun.launch.ranks.processes import rank_processes
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions
from xrun.launch.result.errorfile import ErrorFiles
from xrun.launch.result.failure_report import conclude
from xrun.launch.result.outcome import NodeResult, RankOutcome
from xrun.launch.spec import NodeSpec


class AgentHooks(Protocol):
    """What a control channel plugs into the agent (xrun.launch.session.driver.Driver)."""

    def attach(self, group: RankGroup, doctor: NodeDoctor | None = None) -> None:
        """Register readers on the group's event loop; keep the group to call request_stop(); become the
        doctor's link (stacks, silences) to the head."""

    def on_rank_exit(self, outcome: RankOutcome) -> None:
        """Called in the event loop as each rank's main process exits."""

    def on_result(self, result: NodeResult) -> None:
        """Called once with the node's result, after every rank is gone."""


def supervise_options(spec: NodeSpec) -> SuperviseOptions:
    options = spec.options
    return SuperviseOptions(
        host=spec.host,
        prefix=options.prefix,
        quiet=options.quiet,
        dedupe=options.dedupe,
        log_dir=options.log_dir,
        shutdown_timeout=options.shutdown_timeout,
        console_ranks=frozenset(options.console_ranks) if options.console_ranks is not None else None,
        forward_signals=frozenset(options.forward_signals),
    )


def run_node(spec: NodeSpec, *, hooks: AgentHooks | None = None) -> int:
    """Run this node's ranks to the end; print the failure report; return the node's exit code."""
    return run_node_result(spec, hooks=hooks)[0]


def run_node_result(spec: NodeSpec, *, hooks: AgentHooks | None = None) -> tuple[int, NodeResult]:
    """``run_node``, with the node's result beside its exit code (the local backend's restarts read it)."""
    if spec.elastic is not None:  # torch's elastic agent supervises; the adapter keeps xrun's contract
        # Lazy: torch's agent adapter is the heaviest module of the node layer (python -X importtime), --elastic only.
        from xrun.launch.elastic.run import run_elastic

        result = run_elastic(spec, hooks=hooks)
    else:
        result = _run_group(spec, hooks)
    # before the node reports: xrun's exit and the next attempt's barrier both wait for its GPUs (issue 29)
    wait_for_gpu_release(result)
    code = conclude(result, spec.options.log_dir, announce=hooks is None)  # with a head, the head sums up
    if hooks:
        hooks.on_result(result)
    return code, result


def _run_group(spec: NodeSpec, hooks: AgentHooks | None) -> NodeResult:
    error_files = ErrorFiles()  # each rank's TORCHELASTIC_ERROR_FILE, for this run only
    doctor = NodeDoctor(spec.host, spec.options)
    try:
        with removed_if_the_agent_dies(error_files.directory):  # a kill -9 of this agent leaves no directory
            group = RankGroup(
                rank_processes(spec, os.environ, error_files),
                supervise_options(spec),
                on_rank_exit=hooks.on_rank_exit if hooks else None,
            )
            doctor.attach(group)
            if hooks:
                hooks.attach(group, doctor)
            return group.run()
    finally:
        doctor.close()
        error_files.close()
