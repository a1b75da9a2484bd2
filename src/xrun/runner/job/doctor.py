"""The hang doctor at the head: job-wide stack dumps and the job's hang watch (issue 14).

``HeadDoctor`` sits beside the job state machine; its head half (xrun.runner.job.doctor_head) feeds it what concerns
stacks and silence and carries out what it returns (``Send``: a message to nodes; ``Show``: lines for the user;
``Hang``: ``--hang_action stop`` fires, the machine's ``Hung`` event). It holds no socket and reads no clock: ``now`` is
passed in, so it is tested with literal sequences; its only I/O is the file of full dumps a shown view names.

* A dump (SIGQUIT to xrun, or ``want_stacks`` from an agent whose xrun got it: pod mode) sends ``dump`` to every
  running node and collects their ``stacks`` until all have answered or ``COLLECT_FOR`` seconds have passed
  (a node that has not answered by then is named); the merged view (xrun.common.result.stackview) is shown, outliers
  first, and the full dumps go to a file. One dump at a time.
* The hang watch: each agent says ``quiet`` once its own ranks have been silent for ``--hang_timeout`` and
  ``spoke`` at their next output. That is two messages per silence per node, rather than a periodic report
  from every node whether or not anything is wrong; the head needs nothing more, because a node only reports
  quiet after a full timeout of its own silence. When every running node is quiet the job is hung: one dump,
  then (``stop``) the stop; with ``dump`` the next dump waits until some node has spoken and gone quiet again.
* After a failure every node sends the stacks its ranks had before they were stopped (``stacks`` with id
  ``stop``): ``stop_stacks`` holds them for the job's failure report (``stop_stack_lines``: merged, outliers first).
* With telemetry (issue 31) each node's ``collectives`` comes just before its ``stacks`` of the same id: every
  rank's collective records, compared across the job (xrun.common.result.collectiveview) into the collective the
  ranks wait in, the ranks that never entered it and the mismatches; shown after the stacks, and kept
  (``findings``: the last dump's, or those from before the stop) for the job's report and ``failure.json``.

What reads and shows the stacks and the collectives (xrun.common.telemetry.records' ``read_collectives``;
xrun.common.result: ``stacks``, ``stackview``, ``dumpfile``, ``collectiveview``; ~17 ms of imports) loads at the
first stacks or collectives a node sends, as the node's readers load at its first dump
(xrun.launch.doctor.node_doctor): a job that never dumps, most local runs, never loads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from xrun.channel import STOP_STACKS, Kind, Message, message
from xrun.common.spec import ON_DEMAND_BUDGET, HangAction

if TYPE_CHECKING:
    from xrun.common.result.collectiveview import HangFindings
    from xrun.common.result.stacks import RankStack
    from xrun.common.telemetry.records import RankCollectives

COLLECT_FOR = ON_DEMAND_BUDGET + 2.0  # the agents' own budget, plus the way there and back


@dataclass(frozen=True)
class Send:
    nodes: tuple[int, ...]
    message: Message


@dataclass(frozen=True)
class Show:
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Hang:
    """--hang_action stop|restart: stop the job as hung, for ``reason`` (``restart``: a failure to retry)."""

    reason: str
    restart: bool = False
    root_cause: str | None = None  # the collectives' finding, when the ranks' records came with the stacks


Step = Union[Send, Show, Hang]


@dataclass
class _Collection:
    serial: int
    reason: str
    hang: bool  # taken because the job is hung: the stop (if asked for) follows the view
    waiting: set[int]  # node ranks not yet answered
    deadline: float
    stacks: list[RankStack] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    collectives: list[RankCollectives] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # "host:path" of each node's full records


class HeadDoctor:
    def __init__(
        self,
        host_of: Callable[[int], str],  # a node rank's name now (pod mode: the host name it reported)
        *,
        hang_timeout: float | None,
        hang_action: HangAction,
        log_dir: str | None,
        world_size: int | None = None,
    ) -> None:
        self._host_of = host_of
        self._world_size = world_size
        self._hang_timeout = hang_timeout
        self._hang_action = hang_action
        self._log_dir = log_dir
        self._serial = 0
        self._collection: _Collection | None = None
        self._quiet: set[int] = set()
        self._hang_shown = False  # this silence was dumped already: wait for some node to speak
        self.stop_stacks: list[RankStack] = []  # what the nodes took before their ranks were stopped
        self._stop_collectives: list[RankCollectives] = []  # and their collective records
        self._stop_files: list[str] = []
        self.findings: HangFindings | None = None  # the last dump's collective findings (a hang's root cause)
        self.findings_files: list[str] = []  # and where each node's full records are ("host:path")

    def want(self, reason: str, running: Iterable[int], now: float, *, hang: bool = False) -> list[Step]:
        """Start a job-wide dump of the ``running`` nodes (a dump already collecting absorbs the request)."""
        nodes = tuple(sorted(running))
        if self._collection is not None:
            return [Show((f"{reason}: a stack dump is already being collected",))]
        if not nodes:
            return [Show((f"{reason}: no node is running, no stacks to take",))]
        self._serial += 1
        self._collection = _Collection(self._serial, reason, hang, set(nodes), now + COLLECT_FOR)
        return [Send(nodes, message(Kind.DUMP, id=self._serial, reason=reason))]

    def stacks(self, node: int, msg: Message, now: float) -> list[Step]:
        """A node's ``stacks``; a malformed one raises ValueError (a protocol error)."""
        from xrun.common.result.stacks import RankStack  # lazy: see the module's doc; the views below load after it

        found = [RankStack.from_json(item) for item in msg.get("stacks") or []]
        if msg.get("id") == STOP_STACKS:
            self.stop_stacks.extend(found)
            return []
        problem = msg.get("problem")
        collection = self._collection
        if collection is None or msg.get("id") != collection.serial or node not in collection.waiting:
            return []  # late: that dump was shown without it
        collection.waiting.discard(node)
        collection.stacks.extend(found)
        if problem:
            collection.problems.append(str(problem))
        return self.check(now, ()) if not collection.waiting else []

    def collectives(self, node: int, msg: Message) -> None:
        """A node's ``collectives`` (before its ``stacks`` of the same id); malformed: ValueError (a protocol
        error)."""
        from xrun.common.telemetry.records import read_collectives  # lazy: see the module's doc

        report = read_collectives(msg)
        file = [f"{self._host_of(node)}:{report.file}"] if report.file else []
        if report.dump_id == STOP_STACKS:
            self._stop_collectives.extend(report.ranks)
            self._stop_files.extend(file)
            return
        collection = self._collection
        if collection is not None and report.dump_id == collection.serial and node in collection.waiting:
            collection.collectives.extend(report.ranks)
            collection.files.extend(file)

    def quiet(self, node: int, running: Iterable[int], now: float) -> list[Step]:
        self._quiet.add(node)
        return self._hung(running, now)

    def spoke(self, node: int) -> None:
        self._quiet.discard(node)
        self._hang_shown = False

    def check(self, now: float, running: Iterable[int]) -> list[Step]:
        """Time passed (or the last answer came): show a complete or overdue dump; a node that left the
        running set may complete a hang."""
        collection = self._collection
        if collection is not None and (not collection.waiting or now >= collection.deadline):
            return self._finish(collection)
        return self._hung(running, now) if running else []

    def stop_stack_lines(self) -> list[str]:
        """Every node's stacks from before the stop, merged into one view, outliers first, and the collective
        findings (those from before the stop, else the last dump's: a hang stopped without stacks)."""
        from xrun.common.result.collectiveview import find_hang, view_lines  # lazy: see the module's doc
        from xrun.common.result.stackview import merge, render

        lines = []
        if self.stop_stacks:
            view = [f"  {line}" for line in render(merge(self.stop_stacks))]
            lines = [f"stacks of {len(self.stop_stacks)} rank(s) taken before the stop, outliers first:", *view]
        if self._stop_collectives:
            self.findings = find_hang(self._stop_collectives, world_size=self._world_size)
            self.findings_files = list(self._stop_files)
            return lines + view_lines(self.findings, self._stop_files)
        root = self.findings.root_cause if self.findings else None
        return lines + ([f"the collective held at the hang: {root}"] if root else [])

    def deadline(self) -> float | None:
        return None if self._collection is None else self._collection.deadline

    def _hung(self, running: Iterable[int], now: float) -> list[Step]:
        nodes = set(running)
        if self._hang_timeout is None or self._hang_shown or not nodes or not nodes <= self._quiet:
            return []
        self._hang_shown = True
        reason = f"no rank on any node wrote output for {self._hang_timeout:g} s (--hang_timeout)"
        return self.want(reason, nodes, now, hang=True)

    def _finish(self, collection: _Collection) -> list[Step]:
        from xrun.common.result.collectiveview import find_hang, view_lines  # lazy: see the module's doc
        from xrun.common.result.dumpfile import show_stacks

        self._collection = None
        problems = list(dict.fromkeys(collection.problems))
        missing = [self._host_of(n) for n in sorted(collection.waiting)]
        if missing:
            problems.append(f"no answer in time from {', '.join(missing)}")
        lines = show_stacks(collection.stacks, None, collection.reason, log_dir=self._log_dir) if collection.stacks \
            else [f"{collection.reason}: no stacks came back"]
        if collection.collectives:
            self.findings = find_hang(collection.collectives, world_size=self._world_size)
            self.findings_files = list(collection.files)
            lines += view_lines(self.findings, collection.files)
        steps: list[Step] = [Show(tuple(lines + problems))]
        if collection.hang and self._hang_action is not HangAction.DUMP:
            action = self._hang_action
            root = self.findings.root_cause if collection.collectives and self.findings is not None else None
            steps.append(Hang(f"{collection.reason}; --hang_action {action.value}", action is HangAction.RESTART,
                              root))
        return steps
