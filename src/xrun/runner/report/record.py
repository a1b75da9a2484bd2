"""A run's record as the page reads it: ``events.jsonl``'s lines, ``summary.json`` and ``failure.json`` (when there)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from xrun.common.output.logfiles import EVENTS_FILE, FAILURE_JSON, SUMMARY_JSON
from xrun.errors import RecordError


@dataclass(frozen=True)
class Run:
    """What a log directory holds of a run: ``torn`` when the last line was cut (a run still writing, or killed)."""

    lines: tuple[dict[str, Any], ...]
    summary: dict[str, Any] | None
    failure: dict[str, Any] | None
    torn: bool = False


def read_run(log_dir: str) -> Run:
    if not os.path.isdir(log_dir):
        raise RecordError(log_dir, None, "no such directory (give the --log_dir of a run)")
    path = os.path.join(log_dir, EVENTS_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read().split(b"\n")
    except FileNotFoundError:
        raise RecordError(path, None, "no such file: the head writes it with --log_dir (docs/events.md)") from None
    except OSError as err:
        raise RecordError(path, None, f"cannot read it: {err.strerror or err}") from None
    lines, torn = _lines(path, raw)
    return Run(lines, _json_file(os.path.join(log_dir, SUMMARY_JSON)), _json_file(os.path.join(log_dir, FAILURE_JSON)),
               torn)


def _lines(path: str, raw: list[bytes]) -> tuple[tuple[dict[str, Any], ...], bool]:
    """Every line parsed; the last one may be cut (the file's lines reach the disk every 2 s, and a SIGKILL stops
    the writing mid-line): it is skipped. A bad line before it is a damaged file."""
    while raw and not raw[-1].strip():
        raw.pop()
    lines: list[dict[str, Any]] = []
    torn = False
    for number, text in enumerate(raw, start=1):
        try:
            line = json.loads(text)
        except ValueError:
            line = None
        if not isinstance(line, dict) or not isinstance(line.get("event"), str):
            if number == len(raw):
                torn = True
                break
            raise RecordError(path, number, "not a line of the record (one JSON object with an 'event')")
        lines.append(line)
    if not lines or lines[0]["event"] != "job_started":
        raise RecordError(path, 1, "the record does not begin with job_started")
    return tuple(lines), torn


def _json_file(path: str) -> dict[str, Any] | None:
    """``summary.json`` or ``failure.json``: None when absent (a run in progress, or one that died)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise RecordError(path, None, f"cannot read it: {err.strerror or err}") from None
    except ValueError as err:
        raise RecordError(path, None, f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise RecordError(path, None, "not a JSON object")
    return data
