"""What a node asks its ranks' endpoints: a reading at a hang, Ctrl-\\ or a failure, and a sample while the job
trains (the questions: xrun.launch.telemetry.client; the summaries: xrun.common.telemetry.records).

A reading asks every rank for its Flight Recorder dump and its threads' Python stacks at once (one deadline),
and gives back each rank's ``RankCollectives`` (what crosses the channel) beside the full answers, which stay on
the node (the hang doctor writes them to a file, xrun.launch.doctor.node_doctor). A sample asks for the dumps
only and keeps of each the ``EntryTimes``. A rank that has ended, or is ending (its socket gone), is read from
what it left at its exit (``rank<N>.last.json``, xrun.launch.telemetry.site); ``settle`` reads again, once the
ranks have ended, those that exited on their own after a failure's reading. Blocking: the hang doctor runs them
on its background thread, or, at a failure, within the budget before the stop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from xrun.common.telemetry.records import (
    EntrySampler,
    EntryTimes,
    RankCollectives,
    Reading,
    parse_dump,
    parse_left_records,
    picked_per_sample,
    rank_collectives,
    where_from_traceback,
    with_failure,
)
from xrun.launch.telemetry.client import ENDPOINT_GONE, MAX_BODY, NO_ENDPOINT, Reply, ask
from xrun.launch.telemetry.endpoints import Endpoints

FLIGHT_RECORDER = "fr_trace_json"
TRACEBACK = "dump_traceback"  # every thread's Python stack, taken inside the rank (it needs the GIL)


class RankReads:
    """A node's questions to its ranks' endpoints (one attempt's). A rank whose stacks did not come in time has
    its main thread holding the GIL: it is not asked for them again, which would tie up another of its server's
    threads for as long.

    A rank whose socket is gone, or closed without an answer, is read from what it left at its exit
    (``Endpoints.last_records``): when gloo's timeout fails every rank waiting in a collective at once, they exit
    while the agent asks, and their records are the ones that say who waited (issue 37 §2). A rank that ended
    without its exit path (a signal, ``os._exit``) left none: its problem says so."""

    def __init__(self, host: str, endpoints: Endpoints, world_size: int) -> None:
        self.host = host
        self.endpoints = endpoints
        self._sampler = EntrySampler(picked_per_sample(world_size))
        self._no_traceback: set[int] = set()

    def reading(self, ranks: Iterable[int], budget: float, *, ended: Iterable[int] = ()) -> Reading:
        """The records of the running ``ranks``, asked within ``budget`` seconds, and of the ``ended`` ones, read
        from what they left at their exit (never asked: a child that outlived its rank may hold its socket, and
        would cost the whole budget)."""
        ranks = list(ranks)
        ended = [r for r in ended if r not in set(ranks)]
        questions = {(r, FLIGHT_RECORDER): (self.endpoints.socket(r), FLIGHT_RECORDER) for r in ranks}
        questions.update({(r, TRACEBACK): (self.endpoints.socket(r), TRACEBACK)
                          for r in ranks if r not in self._no_traceback})
        replies = ask(questions, budget)
        for rank in ended:  # nothing left at its exit: it never served (no socket), or died without its exit path
            socket = self.endpoints.socket(rank)
            replies[(rank, FLIGHT_RECORDER)] = (Reply(None, ENDPOINT_GONE) if os.path.exists(socket)
                                                else Reply(None, NO_ENDPOINT, absent=True))
        records, full, at_exit, no_group = [], {}, [], set()
        for rank in sorted([*ranks, *ended]):
            traceback = replies.get((rank, TRACEBACK))
            if traceback is not None and traceback.timed_out:
                self._no_traceback.add(rank)
            text = traceback.body.decode("utf-8", "replace") if traceback and traceback.body is not None else None
            reply = replies[(rank, FLIGHT_RECORDER)]
            left = self._left_at_exit(rank) if reply.body is None and not reply.timed_out else None
            if isinstance(left, tuple):
                text = left[1]
                record, dump = self._left_record(rank, *left)
                at_exit.append(rank)
            elif left is not None:
                record, dump = RankCollectives(self.host, rank, problem=left), None
            else:
                record, dump = self._record(rank, reply, text)
                if reply.absent:
                    no_group.add(rank)  # no socket ever, and no records left: it never served
            if dump is not None and not _has_group(dump):
                no_group.add(rank)
            records.append(record)
            if dump is not None or text is not None:
                full[rank] = {"flight_recorder": dump, "traceback": text, "at_exit": isinstance(left, tuple)}
        return Reading(tuple(records), full, at_exit=tuple(at_exit), no_group=frozenset(no_group))

    def settle(self, reading: Reading, ended: Iterable[int]) -> Reading:
        """``reading`` with the records of the ranks in ``ended`` (they exited on their own since) replaced by what
        they left at their exit, where they left something: the last word of a rank that failed, read after it
        (a rank read while gloo's timeout failed it still answers, its collective already retired as if done)."""
        records, full = {r.rank: r for r in reading.collectives}, dict(reading.full)
        at_exit, no_group = list(reading.at_exit), set(reading.no_group)
        for rank in ended:
            if rank not in records or rank in at_exit:
                continue
            left = self._left_at_exit(rank)
            if not isinstance(left, tuple):
                continue
            records[rank], dump = self._left_record(rank, *left)
            full[rank] = {"flight_recorder": dump, "traceback": left[1], "at_exit": True}
            at_exit.append(rank)
            if dump is not None and _has_group(dump):
                no_group.discard(rank)
        return replace(reading, collectives=tuple(records[r.rank] for r in reading.collectives), full=full,
                       at_exit=tuple(sorted(at_exit)), no_group=frozenset(no_group))

    def _left_record(self, rank: int, dump: dict[str, Any], traceback: str | None) -> tuple[RankCollectives, Any]:
        return self._summary(rank, dump, where_from_traceback(traceback) if traceback else None,
                             failed=with_failure(dump, traceback))

    def _left_at_exit(self, rank: int) -> tuple[dict[str, Any], str | None] | str | None:
        """What ``rank`` left at its exit: its dump and traceback, why they cannot be read, or None (nothing)."""
        try:
            with open(self.endpoints.last_records(rank), "rb") as f:
                body = f.read(MAX_BODY + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"the records the rank left at its exit cannot be read: {err.strerror or err}"
        if len(body) > MAX_BODY:
            return f"the records the rank left at its exit are larger than {MAX_BODY >> 20} MiB"
        try:
            return parse_left_records(body)
        except ValueError as err:
            return str(err)

    def _record(self, rank: int, reply: Reply, traceback: str | None) -> tuple[RankCollectives, Any]:
        where = where_from_traceback(traceback) if traceback else None
        if reply.body is None:
            return RankCollectives(self.host, rank, where=where, problem=reply.error), None
        try:
            dump = parse_dump(reply.body)
        except ValueError as err:
            return RankCollectives(self.host, rank, where=where, problem=str(err)), None
        return self._summary(rank, dump, where)

    def _summary(self, rank: int, dump: dict[str, Any], where: str | None, *,
                 failed: Mapping[str, Any] | None = None) -> tuple[RankCollectives, Any]:
        """The record of ``dump`` (``failed``: the same with the collective the rank died in marked, which the
        record shows; the full records keep torch's own)."""
        try:
            record = rank_collectives(self.host, rank, dump if failed is None else failed, where=where)
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


def _has_group(dump: Mapping[str, Any]) -> bool:
    """The rank made a process group (its Flight Recorder knows one, or recorded a collective)."""
    return bool(dump.get("entries") or dump.get("pg_config") or dump.get("pg_status"))


def _empty(dump: Mapping[str, Any]) -> str:
    """Why a rank's Flight Recorder holds no collective."""
    if _has_group(dump):
        return "no collective recorded yet"
    return "no process group recorded (none made yet, or the Flight Recorder is off: TORCH_FR_BUFFER_SIZE=0)"
