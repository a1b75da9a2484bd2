"""Every rank summarised: wall time, CPU time, peak RSS and how it ended, from the kernel's accounting.

``RankFigures`` is one rank's line of the summary. The static supervisor fills it from ``wait4``'s rusage of
the reaped rank (xrun.launch.ranks.reaper: ``ru_utime + ru_stime``, ``ru_maxrss``); the elastic path has no rusage and
leaves CPU and RSS unknown. It travels in the ``rank_exited`` message (``to_json``/``from_json``), so the head
(xrun.runner.job.control_server) summarises a multi-node job exactly as a node summarises its own ranks.

Pure wording, no I/O: ``success_line`` is the one line of a run that succeeded
(``16 ranks ok in 312 s; peak RSS 4.1 GiB (rank 3)``), ``table_lines`` the full table of a failure report, and
``summary_json`` the content of ``summary.json`` under ``--log_dir``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xrun.common.result.group_restart import restarted_words
from xrun.common.result.outcome import RankOutcome, describe_status
from xrun.printable import columns, one_line


@dataclass(frozen=True)
class RankFigures:
    """One rank's line in the job's summary: how it ended, its runtime, CPU time and peak memory."""

    host: str
    rank: int
    local_rank: int
    wall_s: float  # from its start to its reaping, as the supervisor's monotonic clock saw it
    cpu_s: float | None  # user + system; None: not known (elastic, or its status was lost)
    peak_rss_bytes: int | None
    status: str  # describe_status's wording: "exit code 0", "signal SIGKILL (9)", ...
    ok: bool  # exit code 0

    @classmethod
    def of(cls, outcome: RankOutcome) -> RankFigures:
        return cls(
            host=outcome.host, rank=outcome.rank, local_rank=outcome.local_rank, wall_s=outcome.runtime_s,
            cpu_s=outcome.cpu_s, peak_rss_bytes=outcome.peak_rss_bytes, status=describe_status(outcome),
            ok=not outcome.failed,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host, "rank": self.rank, "local_rank": self.local_rank, "wall_s": round(self.wall_s, 3),
            "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 3), "peak_rss_bytes": self.peak_rss_bytes,
            "status": self.status, "ok": self.ok,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankFigures:
        """The figures an agent sent; a field of the wrong type raises ValueError (a protocol error)."""
        try:
            cpu, rss = data.get("cpu_s"), data.get("peak_rss_bytes")
            return cls(
                host=str(data["host"]), rank=_int(data["rank"]), local_rank=_int(data["local_rank"]),
                wall_s=float(data["wall_s"]), cpu_s=None if cpu is None else float(cpu),
                peak_rss_bytes=None if rss is None else _int(rss), status=str(data["status"]),
                ok=bool(data["ok"]),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed rank figures: {err}") from None


def success_line(figures: Sequence[RankFigures], lost: Collection[int] = (),
                 group_restarts: Mapping[int, int] | None = None) -> str:
    """``16 ranks ok in 312 s; peak RSS 4.1 GiB (rank 3)``: the wall time is the longest rank's. The ranks ``lost``
    under --on_rank_exit keep are named: ``15 ranks ok in 312 s, rank 3 lost on the way (signal SIGKILL (9))``;
    under --replica_groups, the groups restarted (group -> how many times): ``; replica group 1 restarted twice``
    (the figures are each rank's last run's)."""
    count = len(figures) - len(lost)
    line = f"{count} rank{'s' if count != 1 else ''} ok in {seconds(max((f.wall_s for f in figures), default=0.0))}"
    gone = [f for f in sorted(figures, key=lambda f: f.rank) if f.rank in lost]
    if gone:
        line += ", " + ", ".join(f"rank {f.rank} ({one_line(f.status)})" for f in gone) + " lost on the way"
    known = [f for f in figures if f.peak_rss_bytes is not None]
    if known:
        peak = max(known, key=lambda f: (f.peak_rss_bytes, -f.rank))
        line += f"; peak RSS {format_bytes(peak.peak_rss_bytes or 0)} (rank {peak.rank})"
    restarted = restarted_words(group_restarts or {})
    return f"{line}; {restarted}" if restarted else line


def lost_before(ranks: Sequence[int]) -> str:
    """``; rank 1, 4 lost before it``: after a failure's end line, the ranks --on_rank_exit keep lost on the way."""
    return f"; rank {', '.join(map(str, sorted(ranks)))} lost before it" if ranks else ""


def table_lines(figures: Sequence[RankFigures]) -> list[str]:
    """Every rank, in rank order: one header and one row each, columns aligned."""
    rows = [("rank", "host", "local", "wall", "cpu", "peak RSS", "status")]
    for f in sorted(figures, key=lambda f: f.rank):
        cpu = "-" if f.cpu_s is None else seconds(f.cpu_s)
        rss = "-" if f.peak_rss_bytes is None else format_bytes(f.peak_rss_bytes)
        # escaped: on the head, the host and status are what each agent reported (issue 22 §6)
        rows.append((str(f.rank), one_line(f.host), str(f.local_rank), seconds(f.wall_s), cpu, rss, one_line(f.status)))
    return ["  " + line for line in columns(rows)]


def summary_json(figures: Sequence[RankFigures], *, exit_code: int, lost: Collection[int] = ()) -> dict[str, Any]:
    """What ``summary.json`` holds: the exit code, the success line's facts, every rank's figures; with
    --on_rank_exit keep, the ranks lost on the way (``lost_ranks``: their numbers, where there were any)."""
    return {
        "exit_code": exit_code,
        "ranks_ok": sum(1 for f in figures if f.ok),
        "ranks": [f.to_json() for f in sorted(figures, key=lambda f: f.rank)],
    } | ({"lost_ranks": sorted(lost)} if lost else {})


def seconds(value: float) -> str:
    """``0.41 s``, ``12.3 s``, ``312 s``: three significant figures are all a summary needs."""
    if value < 10:
        return f"{value:.2f} s"
    if value < 100:
        return f"{value:.1f} s"
    return f"{value:.0f} s"


def format_bytes(count: int) -> str:
    """``4.1 GiB``, ``312 MiB``, ``980 KiB`` (binary units, as ``free -h`` and the kernel count)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return _scaled(value, unit)
        value /= 1024
    return _scaled(value, "GiB")


def _scaled(value: float, unit: str) -> str:
    return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value
