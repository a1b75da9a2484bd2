"""The node agent: one NodeSpec in, supervised rank processes, one exit code out.

Pipeline: spec -> ranks (xrun.launch.ranks.processes: environment, core binding, a per-run directory of
``TORCHELASTIC_ERROR_FILE``s; on rank 0's node the attempt's store, xrun.launch.store) -> RankGroup
(xrun.launch.ranks.supervise: own sessions, event loop; xrun.launch.doctor.node_doctor: stacks, the hang watch)
or, with ``--elastic``, torch's agent (xrun.launch.elastic.run) -> NodeResult -> the GPUs released
(xrun.launch.ranks.gpu_release) -> report (xrun.common.result.failure_report.conclude) -> exit code. Imports no
torch; the elastic path loads only when asked for.

With ``--preload`` (docs/preload.md) the agent starts one helper that imports the modules (``start_preload``: the
ranks' interpreter and options, their shared environment, working directory and sys.path[0]), waits for it
(``helper_ready``: at most ``PRELOAD_TIMEOUT``, its import time said in one line), forks every attempt's ranks from
it and stops it when the agent ends. ``preloaded`` is that life for the stand-alone agent, which has no control
channel; every other agent's driver (xrun.launch.session.driver: connected, pod, the local run's one-node job)
starts it at its preflight.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from xrun.common.output.streams import notice
from xrun.common.result.errorfile import ErrorFiles
from xrun.common.result.failure_report import conclude
from xrun.common.result.group_restart import GroupRestart
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.common.spec import NodeSpec
from xrun.errors import PreloadHelperLost
from xrun.launch.doctor.node_doctor import NodeDoctor
from xrun.launch.procs.watchdog import removed_if_the_agent_dies
from xrun.launch.ranks.gpu_release import wait_for_gpu_release
from xrun.launch.ranks.processes import rank_processes, shared_environment
from xrun.launch.ranks.supervise import RankGroup, SuperviseOptions
from xrun.launch.store.agent_store import AgentStores, agent_stores
from xrun.launch.telemetry.endpoints import Endpoints, require_rank_site

if TYPE_CHECKING:
    from xrun.launch.preload.client import PreloadHelper


class AgentHooks(Protocol):
    """What a control channel plugs into the agent (xrun.launch.session.driver.Driver)."""

    alone: bool  # this node is the whole job (the local run): it prints its ranks' report and success line

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


def run_node(spec: NodeSpec, *, hooks: AgentHooks | None = None, preload: PreloadHelper | None = None) -> int:
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
    code = conclude(result, spec.options.log_dir, announce=hooks is None or hooks.alone)
    if hooks:
        hooks.on_result(result)
    return code


def _run_group(spec: NodeSpec, hooks: AgentHooks | None, preload: PreloadHelper | None) -> NodeResult:
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
                on_rank_exit=hooks.on_rank_exit if hooks else None,
                preload=preload,
                on_group_restart=hooks.on_group_restart if hooks else None,
                on_group_start=stores.renew,  # a replica group's restart reads nothing of its run before
                on_group_failed=hooks.on_group_failed if hooks else None,
                on_group_stopped=_group_stopped(stores, hooks),
            )
            doctor.attach(group)
            if hooks:
                hooks.attach(group, doctor)
            if hooks is None:
                # The stand-alone agent has no head: it shows its ranks' stacks and acts on its hang itself. Lazy:
                # the view loads the readers (collectiveview: ~12 ms of an agent's start, python -X importtime).
                from xrun.launch.doctor.local_view import LocalView

                doctor.link = LocalView(doctor)
            return group.run()
    finally:
        doctor.close()
        error_files.close()
        if endpoints is not None:
            endpoints.close()


def _group_stopped(stores: AgentStores, hooks: AgentHooks | None) -> Callable[[int], None]:
    """A group across nodes whose ranks here are gone: its store (if hosted here) closes before the head hears it,
    so no rank of it started again elsewhere reads the old one."""

    def stopped(group: int) -> None:
        stores.close_group(group)
        if hooks:
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


# -- the preload helper's life (docs/preload.md) ------------------------------------------------------------------

PRELOAD_TIMEOUT = 600.0  # s for the helper's imports: torch and its kin on a cold shared filesystem, with room


def start_preload(spec: NodeSpec, base_env: Mapping[str, str]) -> PreloadHelper | None:
    """Start the helper that imports ``spec``'s ``--preload`` modules for its ranks (None without it, or without
    ranks); it imports while the caller goes on. ``PreloadError`` (exit code 2) when it cannot start."""
    if not spec.options.preload or not spec.ranks or spec.elastic is not None:
        return None
    require_rank_site()  # every forked rank does the rank-side sitecustomize's work (preload/become.py)
    # lazy: the helper's client and its wire load only in a job that preloads (about 5 ms of every agent's start)
    from xrun.launch.preload.client import PreloadHelper

    return PreloadHelper.start_for(spec.options.preload, spec.ranks[0].argv, env=shared_environment(spec, base_env),
                                   cwd=spec.cwd or os.getcwd())


def helper_ready(helper: PreloadHelper, host: str, timeout: float = PRELOAD_TIMEOUT) -> None:
    """Wait for the helper's imports (``PreloadError``: the line that says what went wrong), then ``announce``."""
    helper.wait_ready(timeout)
    announce(helper, host)


def announce(helper: PreloadHelper, host: str) -> None:
    """Say how long the ready helper's imports took and, when ``ps`` cannot show a forked rank's own command line,
    why."""
    ready = helper.ready
    assert ready is not None
    notice(host, f"preloaded {','.join(helper.modules)} in {ready.seconds:.2f} s; the ranks are forked from the "
                 f"helper (pid {helper.pid})")
    if ready.titles is not None:
        notice(host, f"ps shows the preload helper's command line for every forked rank, not the rank's own: "
                     f"{ready.titles}")


def check_helper(helper: PreloadHelper) -> None:
    """Before an attempt after the first: a helper that died since (killed, the OOM killer) ends the job on this
    node, in one line (``PreloadHelperLost``): the attempt's ranks cannot be forked (docs/preload.md)."""
    how = helper.gone()
    if how is not None:
        raise PreloadHelperLost(f"--preload: the helper (pid {helper.pid}) {how} during the last attempt, so the "
                                "next attempt's ranks cannot be forked on this node: the job ends here (if the OOM "
                                "killer took it, preload fewer modules or give the node more memory)")


@contextmanager
def preloaded(spec: NodeSpec) -> Iterator[PreloadHelper | None]:
    """The helper for an agent's whole life, ready (None without ``--preload``), stopped when it ends."""
    helper = start_preload(spec, os.environ)
    try:
        if helper is not None:
            helper_ready(helper, spec.host)
        yield helper
    finally:
        if helper is not None:
            helper.close()
