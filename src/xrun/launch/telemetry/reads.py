"""What a node asks its ranks' endpoints: a reading at a hang, Ctrl-\\ or a failure, and a sample while the job
trains (the questions: xrun.launch.telemetry.client; the summaries: xrun.launch.telemetry.records).

A reading asks every rank for its Flight Recorder dump and its threads' Python stacks at once (one deadline),
and gives back each rank's ``RankCollectives`` (what crosses the channel) beside the full answers, which stay on
the node (the hang doctor writes them to a file, xrun.launch.doctor.node_doctor). A sample asks for the dumps
only and keeps of each the ``EntryTimes``. Blocking: the hang doctor runs them on its background thread, or, at a
failure, within the budget before the stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xrun.launch.telemetry.client import Reply, ask
from xrun.launch.telemetry.endpoints import Endpoints
from xrun.launch.telemetry.records import (
    CollectivesReport,
    EntrySampler,
    EntryTimes,
    RankCollectives,
    parse_dump,
    picked_per_sample,
    rank_collectives,
    where_from_traceback,
)

FLIGHT_RECORDER = "fr_trace_json"
TRACEBACK = "dump_traceback"  # every thread's Python stack, taken inside the rank (it needs the GIL)


@dataclass(frozen=True)
class Reading:
    """One reading of a node's ranks: every asked rank's record (or why there is none), and the full answers."""

    collectives: tuple[RankCollectives, ...]
    full: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)  # rank -> dump and stacks: node only
    file: str | None = None  # where ``full`` was written on this node, once it is

    def line(self) -> str:
        """Where the full collective records are, or why there are none (for the node's console)."""
        recorded = [c for c in self.collectives if c.problem is None]
        if self.file is None:
            problems = sorted({c.problem for c in self.collectives if c.problem})
            return f"no collective records from the ranks: {problems[0] if problems else 'nothing was recorded'}"
        return (f"collective records of {len(recorded)} of {len(self.collectives)} ranks (torch's Flight Recorder) "
                f"in {self.file}")

    def report(self, dump_id: int | str) -> CollectivesReport:
        """The part that crosses the channel: the records and where the full answers are on the node."""
        return CollectivesReport(dump_id, self.collectives, self.file)


class RankReads:
    """A node's questions to its ranks' endpoints (one attempt's). A rank whose stacks did not come in time has
    its main thread holding the GIL: it is not asked for them again, which would tie up another of its server's
    threads for as long."""

    def __init__(self, host: str, endpoints: Endpoints, world_size: int) -> None:
        self.host = host
        self.endpoints = endpoints
        self._sampler = EntrySampler(picked_per_sample(world_size))
        self._no_traceback: set[int] = set()

    def reading(self, ranks: Iterable[int], budget: float) -> Reading:
        ranks = list(ranks)
        questions = {(r, FLIGHT_RECORDER): (self.endpoints.socket(r), FLIGHT_RECORDER) for r in ranks}
        questions.update({(r, TRACEBACK): (self.endpoints.socket(r), TRACEBACK)
                          for r in ranks if r not in self._no_traceback})
        replies = ask(questions, budget)
        records, full = [], {}
        for rank in ranks:
            traceback = replies.get((rank, TRACEBACK))
            if traceback is not None and traceback.timed_out:
                self._no_traceback.add(rank)
            text = traceback.body.decode("utf-8", "replace") if traceback and traceback.body is not None else None
            record, dump = self._record(rank, replies[(rank, FLIGHT_RECORDER)], text)
            records.append(record)
            if dump is not None or text is not None:
                full[rank] = {"flight_recorder": dump, "traceback": text}
        return Reading(tuple(records), full)

    def _record(self, rank: int, reply: Reply, traceback: str | None) -> tuple[RankCollectives, Any]:
        where = where_from_traceback(traceback) if traceback else None
        if reply.body is None:
            return RankCollectives(self.host, rank, where=where, problem=reply.error), None
        try:
            dump = parse_dump(reply.body)
            record = rank_collectives(self.host, rank, dump, where=where)
        except ValueError as err:
            return RankCollectives(self.host, rank, where=where, problem=str(err)), None
        if not dump.get("entries"):
            record = RankCollectives(self.host, rank, where=where, problem=_empty(dump))
        return record, dump

    def sample(self, ranks: Iterable[int], budget: float) -> list[EntryTimes]:
        """The ranks' entry times into the collectives since the last sample (``EntrySampler``); a rank without an
        answer (or with one not torch's) is left out."""
        replies = ask({r: (self.endpoints.socket(r), FLIGHT_RECORDER) for r in ranks}, budget)
        samples = []
        for rank, reply in sorted(replies.items()):
            if reply.body is None:
                continue
            try:
                sample = self._sampler.sample(rank, parse_dump(reply.body))
            except ValueError:
                continue
            if sample.groups:
                samples.append(sample)
        return samples


def _empty(dump: Mapping[str, Any]) -> str:
    """Why a rank's Flight Recorder holds no collective."""
    if dump.get("pg_config") or dump.get("pg_status"):
        return "no collective recorded yet"
    return "no process group recorded (none made yet, or the Flight Recorder is off: TORCH_FR_BUFFER_SIZE=0)"
