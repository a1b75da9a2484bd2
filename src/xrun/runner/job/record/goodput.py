"""Where a job's wall time went, folded over its record's events (docs/events.md, "goodput").

The phases, by the events that open them:

* ``startup``: from the job's start (``job_started``) to its first attempt's start (``attempt_started``: the
  ranks were told to start);
* ``training``: from an attempt's start to the first of: its first failure (``failure``), a stop requested by a
  signal (``stop_requested``), its first rank's exit (``rank_exited``: a static job no longer trains as a whole);
* ``hang``: of that training, the ``silent_s`` before a hang was detected (``hang_detected``): nothing trained
  while every rank was silent;
* ``restarts``: from the end of an attempt's training to the next attempt's start (stopping the ranks, the restart,
  the new barrier);
* ``teardown``: from the end of the last attempt's training to the job's end (``job_ended``).

Pure: the events in (the live job's as the record writes them, or a file's lines: ``goodput_of``), seconds out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PHASES = ("startup", "training", "hang", "restarts", "teardown")


class Goodput:
    """The fold: ``add`` each event in order; ``to_json`` at any time (a job still running: up to ``now``)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._began: float | None = None  # job_started's t
        self._training_since: float | None = None  # the current attempt trains: since when
        self._idle_since: float | None = None  # an attempt's training ended: since when (restarts or teardown)
        self.ended: float | None = None

    def add(self, event: Mapping[str, Any]) -> None:
        kind, t = event.get("event"), event.get("t")
        if not isinstance(t, (int, float)):
            return  # a line without a time (``dropped``) moves no phase
        if kind == "job_started":
            self._began = t
        elif kind == "attempt_started" and self._training_since is None:
            if self._idle_since is not None:
                self.seconds["restarts"] += t - self._idle_since
            elif self._began is not None:
                self.seconds["startup"] += t - self._began
            self._training_since, self._idle_since = t, None
        elif kind == "hang_detected" and self._training_since is not None:
            silent = min(float(event.get("silent_s") or 0.0), t - self._training_since)
            self._stop_training(t)
            self.seconds["training"] -= silent
            self.seconds["hang"] += silent
        elif kind in ("failure", "rank_exited") or (kind == "stop_requested" and event.get("by") == "signal"):
            self._stop_training(t)
        elif kind == "job_ended":
            self._stop_training(t)
            self._end(t)

    def _stop_training(self, t: float) -> None:
        if self._training_since is not None:
            self.seconds["training"] += t - self._training_since
            self._training_since, self._idle_since = None, t

    def _end(self, t: float) -> None:
        if self._idle_since is not None:
            self.seconds["teardown"] += t - self._idle_since
        elif self._began is not None and not any(self.seconds.values()):
            self.seconds["startup"] += t - self._began  # it ended before any rank started
        self._idle_since, self.ended = None, t

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """``wall_s``, ``training_s``, ``share`` (training / wall) and ``lost_s`` by phase; a job still running
        counts up to ``now`` (its open phase included)."""
        seconds = dict(self.seconds)
        end = self.ended if self.ended is not None else now
        if self.ended is None and end is not None:
            if self._training_since is not None:
                seconds["training"] += end - self._training_since
            elif self._idle_since is not None:
                seconds["restarts"] += end - self._idle_since
            elif self._began is not None:
                seconds["startup"] += end - self._began
        wall = (end - self._began) if end is not None and self._began is not None else sum(seconds.values())
        training = seconds.pop("training")
        return {"wall_s": round(wall, 3), "training_s": round(training, 3),
                "share": round(training / wall, 4) if wall > 0 else 0.0,
                "lost_s": {phase: round(value, 3) for phase, value in seconds.items()}}


def goodput_of(lines: Iterable[Mapping[str, Any]], now: float | None = None) -> dict[str, Any]:
    """The goodput of a record's events (``events.jsonl`` read line by line, e.g. a job that died: ``now`` its last
    line's ``t``)."""
    fold = Goodput()
    for line in lines:
        fold.add(line)
    return fold.to_json(now)
