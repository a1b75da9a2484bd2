"""A node's result as data, the one rule for its exit code, and the words for a rank's end.

``RankOutcome`` is how one rank ended (exit code or signal, runtime, the CPU time and peak RSS the kernel
accounted for it when it was reaped, stderr tail, the exception it recorded with torch's ``@record``
(xrun.common.result.errorfile), whether xrun stopped it);
``NodeResult`` is the node's ranks in rank order with the root cause, the first rank that failed on its own,
why the hang watchdog stopped it (``--hang_action stop``: exit code ``HANG_EXIT``) and the other ranks' stacks
and collective records taken before the stop.
The static supervisor (xrun.launch.ranks.supervise) and the elastic adapter (xrun.launch.elastic.run) both build their
result with ``node_result``, so a node's exit code is decided here and nowhere else. ``describe`` (a verb
phrase, for notices: "exited with code 7") and ``describe_status`` (a noun phrase, for the report's columns:
"exit code 7") are the only wording of an outcome on the node side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xrun.common.procs.posix import signal_name
from xrun.common.result.errorfile import RankError

if TYPE_CHECKING:
    from xrun.common.result.stacks import RankStack
    from xrun.common.telemetry.records import Reading

# --hang_action stop: no rank wrote output for --hang_timeout seconds (timeout(1)'s "timed out" code)
HANG_EXIT = 124
# a job's end with no rank's exit code to pass on: a lost node, a join timeout, an agent's error, a lost head;
# the head's verdict and every node's agent give the same code
NODE_FAILURE_EXIT = 1


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended, with the figures the kernel accounted for it (the module doc lists them)."""

    host: str
    rank: int
    local_rank: int
    pid: int  # 0 when the rank was never started
    returncode: int | None  # exit status when it exited normally (126/127 when it could not be started)
    signal: int | None  # signal number when it was killed by a signal
    runtime_s: float
    stderr_tail: tuple[str, ...]
    stopped_by_xrun: bool  # xrun signalled it (or never started it): a consequence, not the root cause
    leftovers: tuple[int, ...] = ()  # pids of its session that outlived it and had to be stopped
    error: RankError | None = None  # the exception it recorded in TORCHELASTIC_ERROR_FILE (torch's @record)
    cpu_s: float | None = None  # user + system CPU time from the kernel's accounting at reaping (wait4)
    peak_rss_bytes: int | None = None  # the largest resident set of the rank or a child it waited for (wait4)

    @property
    def failed(self) -> bool:
        """A non-zero exit code, a signal, or no status at all."""
        return self.returncode != 0

    @property
    def started(self) -> bool:
        return self.pid > 0


@dataclass(frozen=True)
class NodeResult:
    """The node's ranks in rank order, the root cause, and the exit code decided from them (``node_result``)."""

    host: str
    outcomes: tuple[RankOutcome, ...]  # in rank order
    root_cause: RankOutcome | None  # the first rank that failed on its own
    interrupted_by: int | None  # the signal that told the agent to stop (or request_stop's)
    exit_code: int
    hang: str | None = None  # --hang_action stop stopped the node: why (the silence), for the report
    lost: tuple[int, ...] = ()  # --on_rank_exit keep: ranks that failed while others ran on (not the exit code's)
    stacks: tuple[RankStack, ...] = ()  # the other ranks' stacks taken before the stop (failure or hang)
    collectives: Reading | None = None  # and their collective records (xrun.launch.telemetry; None: not read)
    group_restarts: tuple[tuple[int, int], ...] = ()  # --replica_groups: (group, its restarts) of each one restarted


def node_result(
    host: str,
    outcomes: Sequence[RankOutcome],
    root_cause: RankOutcome | None,
    interrupted_by: int | None,
    *,
    hang: str | None = None,
    lost: tuple[int, ...] = (),
    stacks: Sequence[RankStack] = (),
    collectives: Reading | None = None,
    group_restarts: tuple[tuple[int, int], ...] = (),
) -> NodeResult:
    """The node's result from its outcomes (any order; kept in rank order) with the exit code decided."""
    return NodeResult(
        host=host,
        outcomes=tuple(sorted(outcomes, key=lambda o: o.rank)),
        root_cause=root_cause,
        interrupted_by=interrupted_by,
        exit_code=node_exit_code([o for o in outcomes if o.rank not in lost], root_cause, interrupted_by, hang=hang),
        hang=hang,
        lost=lost,
        stacks=tuple(stacks),
        collectives=collectives,
        group_restarts=group_restarts,
    )


def node_exit_code(
    outcomes: Sequence[RankOutcome],
    root_cause: RankOutcome | None,
    interrupted_by: int | None,
    *,
    hang: str | None = None,
) -> int:
    """HANG_EXIT when the hang watchdog stopped the node; else the root cause's code; else 128 + the signal that
    stopped the node; else 1 if any rank failed; else 0. ``outcomes`` leaves out the ranks lost under
    ``--on_rank_exit keep``: the survivors decide."""
    if hang is not None:
        return HANG_EXIT
    if root_cause is not None:
        return exit_code_of(root_cause)
    if interrupted_by is not None:
        return 128 + interrupted_by
    if any(o.failed for o in outcomes):
        return 1
    return 0


def exit_code_of(outcome: RankOutcome) -> int:
    """The shell's convention: the exit code, or 128 + the signal number."""
    if outcome.signal is not None:
        return 128 + outcome.signal
    if outcome.returncode is None:
        return 1
    return outcome.returncode


def describe(outcome: RankOutcome) -> str:
    """``exited with code 7`` or ``was killed by SIGSEGV``: what follows "rank N" in a notice."""
    if outcome.signal is not None:
        return f"was killed by {signal_name(outcome.signal)}"
    return f"exited with code {outcome.returncode}"


def describe_status(outcome: RankOutcome) -> str:
    """``exit code 7``, ``signal SIGSEGV (11)``, ``not started`` or ``status unknown``."""
    if outcome.signal is not None:
        return f"signal {signal_name(outcome.signal)} ({outcome.signal})"
    if outcome.returncode is not None:
        return f"exit code {outcome.returncode}"
    return "not started" if outcome.pid == 0 else "status unknown"
