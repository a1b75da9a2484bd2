"""The node agent: one NodeSpec in, supervised rank processes, one exit code out.

Pipeline: spec -> ranks (xrun.launch.ranks.processes: environment, core binding, a per-run directory of
``TORCHELASTIC_ERROR_FILE``s; on rank 0's node the attempt's store, xrun.launch.store) -> RankGroup
(xrun.launch.ranks.supervise: own sessions, event loop; xrun.launch.doctor.node_doctor: stacks, the hang watch)
or, with ``--elastic``, torch's agent (xrun.launch.elastic.run) -> NodeResult -> the GPUs released
(xrun.launch.ranks.gpu_release) -> report (xrun.common.result.failure_report.conclude) -> exit code. Imports no
torch; the elastic path loads only when asked for.

With ``--preload`` (docs/preload.md) every attempt's ranks are forked from the helper the driver started at its
preflight (xrun.launch.session.preloading). Every agent runs under a driver (xrun.launch.session.driver: connected,
pod, or a one-node job's: the local run and the stand-alone agent, xrun.joined): ``AgentHooks`` is its side.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from xrun.common.output.streams import notice
from xrun.common.result.errorfile import ErrorFiles
from xrun.common.result.failure_report import conclude
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.common.spec import NodeSpec
from xrun.launch.doctor.node_doctor import NodeDoctor
from xrun.launch.procs.watchdog import removed_if_the_agent_dies
from xrun.launch.ranks.gpu_release import wait_for_gpu_release
from xrun.launch.ranks.processes import rank_processes
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions
from xrun.launch.store.agent_store import AgentStores, agent_stores
from xrun.launch.telemetry.endpoints import Endpoints

if TYPE_CHECKING:
    from xrun.launch.preload.client import PreloadHelper


class AgentHooks(Protocol):
    """What a control channel plugs into the agent (xrun.launch.session.driver.Driver)."""

    alone: bool  # this node is the whole job (a one-node job): it prints its ranks' report and success line

    def attach(self, group: RankGroup, doctor: NodeDoctor | None = None) -> None:
        """Register readers on the group's event loop; keep the group to call request_stop(); become the
        doctor's link (stacks, silences) to the head."""

    def on_rank_exit(self, outcome: RankOutcome) -> None:
        """Called in the event loop as each rank's main process exits."""

    def on_result(self, result: NodeResult) -> None:
        """Called once with the node's result, after every rank is gone."""

    def on_group_restart(self, restart: GroupRestart) -> None:
        """--replica_groups: a group stops and starts again; its ranks' ends are not told one by one."""

    def on_group_failed(self, restart: GroupRestart) -> None:
        """--replica_groups: a rank of a group across nodes failed here; its ranks here are stopping (the head
        restarts the group on every node it spans)."""

    def on_group_stopped(self, group: int) -> None:
        """--replica_groups: the ranks here of a group across nodes are gone; it waits for the head's start."""


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
        duplicate_filters=(options.duplicate_stdout_filters, options.duplicate_stderr_filters),
        local_echo=options.local_echo,
        on_rank_exit=options.on_rank_exit,
        group_restarts=group_restarts(spec),
    )


def group_restarts(spec: NodeSpec) -> int | None:
    """--replica_groups: each group's budget, ``--max_restarts``, as its ranks are told it (torch's contract:
    ``TORCHELASTIC_MAX_RESTARTS``; the head restarts no whole job then, xrun.runner.job.config); None without."""
    if spec.replicas is None or not spec.ranks:
        return None
    return int(spec.ranks[0].env.get("TORCHELASTIC_MAX_RESTARTS") or 0)


def run_node(spec: NodeSpec, *, hooks: AgentHooks, preload: PreloadHelper | None = None) -> int:
    """Run this node's ranks to the end (forked from ``preload``, if given); print the failure report; return the
    node's exit code."""
    if spec.elastic is not None:  # torch's elastic agent supervises; the adapter keeps xrun's contract
        # Lazy: torch's agent adapter is the heaviest module of the node layer (python -X importtime), --elastic only.
        from xrun.launch.elastic.run import run_elastic

        result = run_elastic(spec, hooks=hooks)
    else:
        result = _run_group(spec, hooks, preload)
    # before the node reports: xrun's exit and the next attempt's barrier both wait for its GPUs (issue 29)
    wait_for_gpu_release(result)
    # a node of several reports its failure, the head sums up the job; the whole job's node says its success too
    code = conclude(result, spec.options.log_dir, announce=hooks.alone)
    hooks.on_result(result)
    return code


def _run_group(spec: NodeSpec, hooks: AgentHooks, preload: PreloadHelper | None) -> NodeResult:
    error_files = ErrorFiles()  # each rank's TORCHELASTIC_ERROR_FILE, for this run only
    endpoints = _endpoints(spec)
    doctor = NodeDoctor(spec.host, spec.options, endpoints=endpoints, world_size=spec.world_size)
    try:
        # a kill -9 of this agent leaves no directory
        with removed_if_the_agent_dies(error_files.directory, *([endpoints.directory] if endpoints else [])), \
                agent_stores(spec) as stores:  # rank 0's node (of each replica group): the attempt's own store
            group = RankGroup(
                rank_processes(spec, os.environ, error_files, endpoints),
                supervise_options(spec),
                on_rank_exit=hooks.on_rank_exit,
                preload=preload,
                on_group_restart=hooks.on_group_restart,
                on_group_start=stores.renew,  # a replica group's restart reads nothing of its run before
                on_group_failed=hooks.on_group_failed,
                on_group_stopped=_group_stopped(stores, hooks),
            )
            doctor.attach(group)
            hooks.attach(group, doctor)
            return group.run()
    finally:
        doctor.close()
        error_files.close()
        if endpoints is not None:
            endpoints.close()


def _group_stopped(stores: AgentStores, hooks: AgentHooks) -> Callable[[int], None]:
    """A group across nodes whose ranks here are gone: its store (if hosted here) closes before the head hears it,
    so no rank of it started again elsewhere reads the old one."""

    def stopped(group: int) -> None:
        stores.close_group(group)
        hooks.on_group_stopped(group)

    return stopped


def _endpoints(spec: NodeSpec) -> Endpoints | None:
    """The ranks' sockets for their collective records (xrun.launch.telemetry), unless ``--no_telemetry``; a node
    where no socket directory can be made runs without them, and says so."""
    if not spec.options.telemetry:
        return None
    try:
        return Endpoints()
    except OSError as err:
        notice(spec.host, f"no collective records from this node's ranks: cannot make their socket directory "
                          f"({err.strerror or err}; set TMPDIR to a writable directory)")
        return None
