"""What every scenario gets (``Context``) and returns (a section: plain JSON-able dict)."""

from __future__ import annotations

import datetime
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import harness
from bench.launchers import LAUNCHERS

FLOORS = ("floor", "pyfloor")  # references, always run


@dataclass
class Context:
    quick: bool = False
    reps: int | None = None  # rounds; None = the scenario's default for quick/full
    launchers: tuple[str, ...] | None = None  # restrict to these launcher names; None = all
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    options: dict[str, Any] = field(default_factory=dict)  # scenario-specific overrides (--set key=value)

    def rounds(self, quick: int, full: int) -> int:
        return self.reps if self.reps is not None else (quick if self.quick else full)

    def pick(self, wanted: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """The variants to run and, for the others, why not (not installed, or filtered out by --launchers)."""
        run, skipped = [], {}
        for variant in wanted:
            launcher = variant.split(":")[0]
            if self.launchers is not None and launcher not in self.launchers and launcher not in FLOORS:
                skipped[variant] = "not selected"
                continue
            missing = LAUNCHERS[launcher].available()
            if missing:
                skipped[variant] = missing
            else:
                run.append(variant)
        return run, skipped

    def option(self, key: str, quick: Any, full: Any) -> Any:
        """A scenario knob: the quick or full default, unless ``--set key=value`` overrides it."""
        default = quick if self.quick else full
        if key not in self.options:
            return default
        raw = str(self.options[key])
        if isinstance(full, tuple):
            return tuple(type(full[0])(x) for x in raw.split(",") if x)
        return type(full)(raw)


def section(name: str, title: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "title": title,
        "status": "ok",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_before": harness.load(),
        "started": time.monotonic(),
        **fields,
    }


def finish(sec: dict[str, Any]) -> dict[str, Any]:
    sec["load_after"] = harness.load()
    sec["duration_s"] = round(time.monotonic() - sec.pop("started"), 1)
    return sec


def unavailable(name: str, title: str, reason: str) -> dict[str, Any]:
    return finish(section(name, title, status=f"not available: {reason}", groups=[], targets=[]))


def target(what: str, value: float | None, limit: float, unit: str = "") -> dict[str, Any]:
    """A target check for the report: a measured median against the issue's limit (None = not measured)."""
    return {
        "what": f"{what} ≤ {limit:g}{_sep(unit)}{unit}",
        "value": value,
        "limit": limit,
        "unit": unit,
        "met": None if value is None else value <= limit,
    }


def restart_table(running: str, references: list[str]) -> dict[str, Any]:
    """The report's table of a restart's figures (``harness.restart_timing``): until ``running`` (the next attempt's
    ranks, all of them), and until the launcher exits; ratios to ``references``."""
    return {
        "metrics": [["restart_s", running, "s"], ["exit_s", "launcher exit", "s"]],
        "ratio": "restart_s",
        "references": references,
        "extra_ratio": "exit_s",
    }


def median(group: dict[str, Any], variant: str, metric: str, ratio_to: str | None = None) -> float | None:
    entry = group["variants"].get(variant)
    if entry is None:
        return None
    stats = entry[f"vs_{ratio_to}"][metric] if ratio_to else entry["metrics"].get(metric)
    return None if stats is None else stats["median"]


def num(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _sep(unit: str) -> str:
    return " " if unit and unit != "×" else ""
