"""Each rank's CPU and memory while it runs (issue 40 §1): the ``usage`` message a node's agent sends the head every
sample period (xrun.launch.telemetry.usage reads it), and the period itself, which the head's record shares
(xrun.runner.job.record.head).

The message (stable: a field added later must be optional, and a reader ignores fields it does not know)::

    usage  {"ranks": [[rank, cpu_pct, rss_kib], ...]}   one item per live rank of the node

``cpu_pct``: the CPU time of the rank's process (itself and the children it waited for) over the period since the
node's previous reading of it (the first: since the process started), in percent of one core, rounded;
``rss_kib``: its resident memory now, in KiB. Integers, so that an item is a few bytes on the wire and the head
checks it with one pass. Every value is bounded (``USAGE_FIELDS`` and the bounds below): a message beyond them is
a protocol error.

Pure and cheap: the agent loads it at its start, so the items are ``NamedTuple``s (a frozen dataclass's class costs
~0.4-1.2 ms to make, xrun.channel.fields explains).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from xrun.channel import Kind, Message, message
from xrun.channel.fields import MAX_RANK, USAGE_FIELDS, fields_error

# The period of the head's ``sample`` lines and of the nodes' usage readings: a week is 10,080 sample lines
SAMPLE_EVERY = 60.0
# Internal knob, for tests only (never a flag): the period in seconds, read by the head and every agent alike
SAMPLE_EVERY_ENV = "XRUN_SAMPLE_EVERY_S"
MAX_CPU_PCT = 100 << 14  # a process on 16,384 cores, busy on each
MAX_RSS_KIB = 1 << 40  # a pebibyte


class RankUsage(NamedTuple):
    """One rank's reading: CPU over the last period (percent of one core) and resident memory (KiB)."""

    rank: int
    cpu_pct: int
    rss_kib: int


def sample_every(environ: Mapping[str, str] = os.environ) -> float:
    """The sample period: ``SAMPLE_EVERY``, or the test's ``XRUN_SAMPLE_EVERY_S`` (seconds, at most a day)."""
    try:
        every = float(environ.get(SAMPLE_EVERY_ENV, SAMPLE_EVERY))
    except ValueError:
        return SAMPLE_EVERY
    return every if 0 < every <= 86_400 else SAMPLE_EVERY  # nan and inf fall through too


def usage_message(readings: Iterable[RankUsage]) -> Message:
    return message(Kind.USAGE, ranks=[list(r) for r in readings])


def read_usage(msg: Message) -> tuple[RankUsage, ...]:
    """An agent's ``usage`` message, every field checked; ValueError (a protocol error) when one is odd."""
    problem = fields_error(msg, USAGE_FIELDS)
    if problem is not None:
        raise ValueError(problem.reason)
    readings = []
    for item in msg["ranks"]:
        # type(), not isinstance: True is not a number
        if (type(item) is not list or len(item) != 3 or not all(type(v) is int for v in item)
                or not (0 <= item[0] <= MAX_RANK and 0 <= item[1] <= MAX_CPU_PCT and 0 <= item[2] <= MAX_RSS_KIB)):
            raise ValueError(f"usage: {str(item)[:60]!r} is not [rank, cpu_pct, rss_kib] within bounds")
        readings.append(RankUsage(item[0], item[1], item[2]))
    return tuple(readings)
