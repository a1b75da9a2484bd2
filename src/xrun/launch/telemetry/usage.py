"""Each rank's CPU and memory while it runs, read on its node for the head's record (issue 40 §1; the message:
xrun.common.telemetry.usage).

Every sample period the node's doctor (xrun.launch.doctor.node_doctor), from a timer in the rank group's loop,
reads each live rank's ``/proc/PID/stat`` once (its CPU ticks, its own and its waited-for children's, its start
and its resident pages are all on that one line) and sends the node's readings as one ``usage`` message: no
thread, no psutil (its ``Process`` object costs more than the read), no reading between samples. A rank whose
file is gone (it just ended) is left out of that sample.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from xrun.common.telemetry.usage import MAX_CPU_PCT, MAX_RSS_KIB, RankUsage

_TICKS = os.sysconf("SC_CLK_TCK")  # /proc's CPU times and start times are in these (proc(5))
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def read_stat(pid: int) -> tuple[int, int, int] | None:
    """CPU ticks, start ticks and resident pages of ``pid`` (None: it is gone)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        line = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # proc(5): the command's name (field 2) is in parentheses and may hold spaces and ")": the fields that follow
    # its last ")" start at field 3 (state); utime..cstime are 14-17, starttime 22, rss 24
    fields = line[line.rfind(b")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14]), int(fields[19]),
                int(fields[21]))
    except (IndexError, ValueError):
        return None


def cpu_pct(ticks: int, since_ticks: int, seconds: float) -> int:
    """CPU ticks spent over ``seconds`` as a percentage of one core, within the message's bounds."""
    if seconds <= 0:
        return 0
    return min(MAX_CPU_PCT, max(0, round((ticks - since_ticks) * 100 / _TICKS / seconds)))


class UsageReader:
    """A node's readings of its ranks, each one's CPU over the period since the reading before."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, float]] = {}  # pid -> its CPU ticks and the boot clock at the last read

    def read(self, ranks: Sequence[tuple[int, int]]) -> list[RankUsage]:
        """Each (rank, pid)'s reading now: CPU since the last one (a new process: since its start) and RSS."""
        now = time.clock_gettime(time.CLOCK_BOOTTIME)  # /proc's start times count from the boot, suspend included
        last, self._last = self._last, {}
        readings = []
        for rank, pid in ranks:
            stat = read_stat(pid)
            if stat is None:
                continue
            ticks, start, pages = stat
            before, at = last.get(pid, (0, start / _TICKS))
            self._last[pid] = (ticks, now)
            readings.append(RankUsage(rank, cpu_pct(ticks, before, now - at), min(MAX_RSS_KIB, pages * _PAGE_KIB)))
        return readings
