"""Telemetry's head half (issue 31, issue 40 §1; [Telemetry](docs/telemetry.md)): what the head reads of the agents'
samples, registered with the control server by message kind (``reads``). The node half is ``xrun.launch.telemetry``
and the node's doctor (``xrun.launch.doctor.node_doctor``), which sends the samples.

* ``entry_times``: a node's straggler samples, scored on its clock (xrun.common.result.stragglers); a rank named,
  or recovered, is a line (and the record's event). A one-node job's ranks share the head's clock, and its
  console has the lines as the node's own words;
* ``pong``: the node's clock against the head's, from the round trip of the ping the control server sent
  (``pinged``; issue 31), kept across attempts;
* ``usage``: the ranks' CPU and RSS, for the job's record (checked with or without one).

A restart begins the scores anew (``begin_attempt``); the clock offsets stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xrun.channel import Kind, Message, Reader
from xrun.common.output.status import PlainStatus
from xrun.common.output.streams import notice
from xrun.common.result.stragglers import SAME_CLOCK, ClockOffset, ClockOffsets, StragglerScores
from xrun.common.telemetry.usage import read_usage
from xrun.runner.job.wire import pong_clock

if TYPE_CHECKING:
    from xrun.runner.job.record.head import JobRecord


class TelemetryHead:
    """The straggler scores of this attempt, every node's clock offset, the usage handed to the record."""

    def __init__(self, world_size: int | None, *, host: Callable[[int], str], status: PlainStatus,
                 record: Callable[[], JobRecord | None], alone: bool) -> None:
        self.world_size = world_size
        self.host = host  # an agent's host as the job names it
        self.status = status
        self.record = record  # the job's record, if any (made after this half: it reads ``scores``)
        self.alone = alone  # a one-node job: the head's clock, the node's words
        self.clocks = ClockOffsets()
        self.scores = StragglerScores(world_size=world_size)

    def reads(self) -> dict[Kind, Reader]:
        return {Kind.ENTRY_TIMES: self._entry_times, Kind.PONG: self._pong, Kind.USAGE: self._usage}

    def begin_attempt(self) -> None:
        self.scores = StragglerScores(world_size=self.world_size)

    def pinged(self, node: int) -> None:
        """A ping goes to ``node``: its pong's clock is read against this round trip."""
        self.clocks.sent(node, time.time_ns())

    def _pong(self, node: int, msg: Message, now: float) -> None:
        self.clocks.pong(node, time.time_ns(), pong_clock(msg))

    def _usage(self, node: int, msg: Message, now: float) -> None:
        readings = read_usage(msg)  # checked with or without a record: every byte from a socket is hostile
        record = self.record()
        if record is not None:
            record.used(readings, now)

    def _entry_times(self, node: int, msg: Message, now: float) -> None:
        from xrun.common.telemetry.records import read_entry_times  # lazy: at the first sample (stragglers' too)

        offset, samples = self._clock_of(node), read_entry_times(msg)
        lines = self.scores.add(self.host(node), offset, samples)
        self._say(node, lines, now)
        record = self.record()
        if record is not None:
            record.sampled(node, offset, samples, self.scores, changed=bool(lines), now=now)

    def _clock_of(self, node: int) -> ClockOffset | None:
        """A node's clock against this one: the pongs' offset (alone: its ranks share this process's clock)."""
        return SAME_CLOCK if self.alone else self.clocks.of(node)

    def _say(self, node: int, lines: Sequence[str], now: float) -> None:
        """Each line on the console; the live status holds who is named now (alone: the node's words, as a
        one-node job's console has them)."""
        for line in lines:
            if self.alone:
                notice(self.host(node), line)
            else:
                self.status.line(line)
        if not self.alone:
            self.status.stragglers(self.scores.status(), now)
