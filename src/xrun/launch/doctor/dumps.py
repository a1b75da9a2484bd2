"""The hang doctor's hands on one node: the dumps (py-spy's stacks of the live ranks and, with telemetry, their
collective records), the straggler samples, the survivors' stacks at a failure, and the files the full dumps go to.

``xrun.launch.doctor.node_doctor`` makes one ``NodeDumps`` for its rank group at the first dump, sample or
failure it acts on (or, with ``--failure_stacks``, half a second of the ranks' own time into the run), never at the
agent's start: everything here (py-spy's runner, the Flight Recorder's records parsed and summed up, the stacks as
data and their merged view, the background thread) is what reads a rank, and nothing reads a rank before its first
sample (issue 38). Blocking work runs on the worker thread (xrun.launch.doctor.background), its result handed to the
rank group's loop; at a failure within ``FAILURE_BUDGET``, before the stop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from xrun.common.output.streams import notice
from xrun.common.result.dumpfile import write_dump_file
from xrun.common.result.stacks import RankStack
from xrun.common.spec import AgentOptions
from xrun.common.telemetry.records import EntryTimes, Reading, entry_times_message
from xrun.launch.doctor.background import InBackground
from xrun.launch.doctor.pyspy import EXITED, FAILURE_BUDGET, pyspy_path, stack_problem
from xrun.launch.doctor.stackdump import dump_ranks
from xrun.launch.telemetry.frtrace import write_analyser_folder
from xrun.launch.telemetry.reads import RankReads

if TYPE_CHECKING:
    from xrun.channel import Message
    from xrun.common.result.outcome import RankOutcome
    from xrun.launch.ranks.supervise import DumpTarget, RankGroup
    from xrun.launch.telemetry.endpoints import Endpoints

SAMPLE_BUDGET = 2.0  # a rank that has not answered a straggler sample by then sits this sample out


@dataclass(frozen=True)
class Diagnosis:
    """What a dump found: the ranks' stacks, or why there are none; their collective records (None: telemetry
    is off)."""

    stacks: Sequence[RankStack]
    problem: str | None
    reading: Reading | None = None


DumpDone = Callable[[Diagnosis], None]


class NodeDumps:
    """One rank group's dumps and samples (an attempt's): what ``NodeDoctor`` asks once it first needs a rank read."""

    def __init__(self, host: str, options: AgentOptions, group: RankGroup, *, environ: Mapping[str, str],
                 endpoints: Endpoints | None, world_size: int) -> None:
        self.host = host
        self.options = options
        self.group = group
        self._environ = environ
        self._pyspy = pyspy_path(environ)
        self._reads = RankReads(host, endpoints, world_size) if endpoints is not None else None
        self._worker: InBackground | None = None  # dumps and samples: made at the first (no thread until then)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def dump(self, on_done: DumpDone, budget: float) -> None:
        """Take every live rank's stack (and collective records) in the background; ``on_done`` runs in the loop."""
        targets, ranks = self.group.live_targets(), self.group.ranks
        if not self._background().start(lambda: self._diagnose(targets, budget, ranks), on_done):
            notice(self.host, "a stack dump is already running; this request is dropped")

    def sample(self, ranks: Sequence[int], *, send: Callable[[Message], None]) -> None:
        """The ``ranks``' entry times, in the background (a dump running: not this time), then to the head, which
        scores stragglers (a one-node job's too), as the ``entry_times`` message (``send``)."""
        reads = self._reads
        assert reads is not None, "no straggler sample without telemetry's endpoints"

        def sampled(samples: list[EntryTimes]) -> None:
            if not samples or self.group.stopping:
                return
            send(entry_times_message(samples))

        self._background().start(lambda: reads.sample(ranks, SAMPLE_BUDGET), sampled)

    def _background(self) -> InBackground:
        """The background worker, made and watched by the loop at the first dump or sample."""
        if self._worker is None:
            self._worker = InBackground("xrun-doctor")
            self.group.add_reader(self._worker, self._worker.ready)
        return self._worker

    def _diagnose(self, targets: Sequence[DumpTarget], budget: float, ranks: Sequence[int], *,
                  keep: bool = False) -> Diagnosis:
        """The stacks of the live ``targets`` with py-spy and, while its processes work, the collective records of
        every rank of the node (blocking): an ended rank's are those it left at its exit. ``keep``: the records'
        full answers are kept, not written yet (``settle`` does, once the ranks have ended)."""
        reading: Reading | None = None

        def read() -> None:
            nonlocal reading
            if self._reads is not None and ranks:
                live = [t.rank for t in targets]
                found = self._reads.reading(live, budget, ended=[r for r in ranks if r not in live])
                reading = found if keep else self._written(found)

        problem = stack_problem(self.host, self._environ)
        if not targets:
            read()
            return Diagnosis([], problem, reading)
        if self._pyspy is None or problem is not None:
            read()
            return Diagnosis([], problem, reading)
        return Diagnosis(dump_ranks(self.host, targets, budget=budget, pyspy=self._pyspy, meanwhile=read), None,
                         reading)

    def _written(self, reading: Reading) -> Reading | None:
        """The ranks' records, their full answers written to a file on this node (and left out of the result);
        None when no rank had a process group: no collective to report (issue 37 §6)."""
        if not reading.grouped:
            return None
        if not reading.full:
            return reading
        text = json.dumps({"host": self.host, "ranks": {str(r): v for r, v in sorted(reading.full.items())}})
        try:
            file = write_dump_file(self.options.log_dir, text, kind="collectives", suffix=".json")
        except OSError as err:
            notice(self.host, f"the ranks' full collective records not written: {err.strerror or err}")
            return replace(reading, full={})
        try:
            folder = write_analyser_folder(file, reading.full)
        except OSError as err:
            notice(self.host, f"the ranks' Flight Recorder dumps for torchfrtrace not written: {err.strerror or err}")
            folder = None
        return replace(reading, full={}, file=file, folder=folder)

    def stop_stacks(self) -> None:
        """The live ranks' stacks (and collective records), now and within FAILURE_BUDGET (blocking: they are about
        to be stopped), kept in the group for the failure report."""
        group = self.group
        targets = group.live_targets()
        found = self._diagnose(targets, FAILURE_BUDGET, group.ranks, keep=True)
        group.collectives = found.reading  # the ended ranks' too, what they left at their exit; settled at the end
        if not targets:
            return
        if found.problem is not None or self._pyspy is None:  # the report's view says why, in one line
            why = found.problem or "py-spy is missing"
            group.stacks = tuple(RankStack(self.host, t.rank, t.local_rank, t.pid, error=why) for t in targets)
            return
        # a rank that ended on its own meanwhile was not part of the failure: its missing stack is no news
        group.stacks = tuple(s for s in found.stacks if s.error != EXITED)

    def settle(self, outcomes: Sequence[RankOutcome]) -> None:
        """Once every rank has ended: the failure's reading (taken before the stop, not written yet) with the last
        word of each rank that exited on its own, what it left at its exit, then written (issue 37 §2).

        When gloo's timeout fails every rank waiting in a collective at once, the agent reads them while they fail:
        one still answers, its collective retired by gloo as if done, one has just taken its socket away. What each
        left at its exit says which collective it died in (``records.with_failure``); a rank xrun stopped keeps
        what it said before the stop (where it was, not where the stop found it)."""
        reading, reads = self.group.collectives, self._reads
        if reading is None or reading.file is not None or reads is None:
            return
        ended = [o.rank for o in outcomes if o.started and not o.stopped_by_xrun]
        self.group.collectives = self._written(reads.settle(reading, ended))
