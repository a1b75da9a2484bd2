"""The local run's job-level part: its whole-job restarts (``--max_restarts`` on a static job, issue 23) and the
job's ``summary.json``. The agent runs in xrun's own process, so the attempts are a loop around it. The rules
(restart? exhausted? no progress?), the verdict's words and the summary are the head's (``xrun.runner.job``):
a local job's ``{log_dir}/summary.json`` has the sections a connected job's has (how it ended, its attempts, its
ranks' straggler scores). Each attempt's ranks see ``TORCHELASTIC_RESTART_COUNT`` and a fresh port.

Ctrl-C during an attempt stops its ranks and ends the loop (130); between attempts no rank runs, and the
``KeyboardInterrupt`` ends xrun the same way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from xrun.common.output.status import say
from xrun.common.result.outcome import HANG_EXIT, NodeResult
from xrun.common.result.summary import RankFigures
from xrun.common.spec import HangAction, NodeSpec, with_rendezvous
from xrun.launch.agent import check_helper, run_node_result
from xrun.net import free_port
from xrun.runner.job.attempts import Attempts, Ending
from xrun.runner.job.events import Failure, RankExited, Verdict
from xrun.runner.job.figures import write_job_summary
from xrun.runner.job.verdict import RootCause, rank_failure
from xrun.runner.plan import Plan, PortChoice

if TYPE_CHECKING:
    from xrun.launch.preload.client import PreloadHelper


def node_failure(result: NodeResult, spec: NodeSpec) -> Failure | None:
    """The attempt's root cause as the head's rules read it (None: it succeeded, or a signal stopped it)."""
    root = result.root_cause
    if root is not None:
        ended = RankExited(0, root.rank, root.local_rank, root.returncode, root.signal, tail=root.stderr_tail)
        return rank_failure(ended, spec.host)  # the head's words for it, an abort in teardown included
    if result.hang is not None:
        return Failure(spec.host, result.hang, HANG_EXIT, final=spec.options.hang_action is not HangAction.RESTART)
    if result.exit_code != 0 and result.interrupted_by is None:
        return Failure(spec.host, f"the node's ranks ended with code {result.exit_code}", result.exit_code)
    return None


def attempt_cause(result: NodeResult, spec: NodeSpec, began: float) -> RootCause:
    """One attempt's root cause and the signal that stopped it, as the head records them."""
    cause = RootCause(elastic=spec.elastic is not None)
    if result.interrupted_by is not None:
        cause.interrupted(result.interrupted_by)
    failure = node_failure(result, spec)
    if failure is not None:
        runtime = result.root_cause.runtime_s if result.root_cause is not None else time.monotonic() - began
        cause.failed(failure, began + runtime)
    return cause


def sum_up(plan: Plan, code: int, result: NodeResult, cause: RootCause) -> None:
    """The job's ``summary.json`` under ``--log_dir`` (the node's own is written beside it, in its folder)."""
    log_dir = plan.request.options.log_dir
    if log_dir is None:
        return
    verdict = Verdict(code, cause.failure, cause.interrupted_by, attempts=cause.attempts,
                      restart_lines=cause.restart_lines, lost_ranks=result.lost)
    write_job_summary(log_dir, [RankFigures.of(o) for o in result.outcomes], verdict, result.stragglers)


def run_once(plan: Plan, code: int, result: NodeResult, began: float) -> int:
    """A local run without restarts is over: its summary; its exit code."""
    sum_up(plan, code, result, attempt_cause(result, plan.nodes[0], began))
    return code


def run_attempts(plan: Plan, *, preload: PreloadHelper | None = None) -> int:
    """Run the one node's ranks, again after each failure while the restart rules allow; the last exit code. With
    ``preload`` every attempt's ranks are forked from it; one that died meanwhile ends the job (``check_helper``)."""
    node, policy = plan.nodes[0], plan.request.restart
    attempts = Attempts(policy, t0=time.monotonic())
    spec = node
    while True:
        began = time.monotonic()
        code, result = run_node_result(spec, preload=preload)
        cause = attempt_cause(result, spec, began)
        ending = attempts.over(cause, began, time.monotonic())
        if ending is not Ending.RESTART:
            for line in cause.restart_lines:
                say(line)
            sum_up(plan, code, result, cause)
            return code
        if preload is not None:
            check_helper(preload)
        attempt = attempts.begin_next(time.monotonic())
        say(f"restarting the job: attempt {attempt} of {policy.max_restarts + 1} "
            f"(after: {cause.failure and cause.failure.reason})")
        spec = with_rendezvous(node, plan.rendezvous.known_master_addr, _port(plan), attempt)


def _port(plan: Plan) -> int:
    """Rank 0's port for the next attempt: a fresh free one, unless the user gave one."""
    if plan.request.master_port_choice is PortChoice.GIVEN and plan.rendezvous.master_port:
        return plan.rendezvous.master_port
    return free_port(plan.rendezvous.known_master_addr)
