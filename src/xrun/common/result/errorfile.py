"""``TORCHELASTIC_ERROR_FILE``: the exception a rank decorated with torch's ``@record`` leaves behind.

torch's ``record`` (torch.distributed.elastic.multiprocessing.errors) writes, when the wrapped function raises,
``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": "<traceback>", "timestamp": "..."}}}`` to
the file this variable names, and nothing when it is unset. What a rank prints after the exception (atexit
handlers, logging shutdown) then buries the traceback in the stderr tail; the file does not (issue 13).

* ``ErrorFiles``: a per-run temporary directory with one file per rank (``rank<N>.json``), removed at the end;
  the static path gives each rank its own path (under ``--elastic`` torch's agent sets its own, and
  ``read_error_file`` reads what its ``ProcessFailure`` names);
* ``read_error_file``/``parse_error``: the file as a ``RankError`` (type, message, last frames), or None when
  there is none or it is not torch's format (a rank's own file is data, never trusted to be well formed);
* ``error_lines``: the words of the report and of the failure sent to the head node.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

VARIABLE = "TORCHELASTIC_ERROR_FILE"
_FRAMES = 3  # the innermost frames shown: where it was raised, and what called that
_MAX_BYTES = 1 << 20  # a file bigger than this is not torch's


@dataclass(frozen=True)
class RankError:
    """The exception a rank recorded: ``ValueError``, ``bad lr``, and its innermost frames (innermost last)."""

    type: str
    message: str
    frames: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "frames": list(self.frames)}


class ErrorFiles:
    """One error file path per rank, in a temporary directory of this run (``close`` removes it)."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="xrun-errors-")

    def path(self, rank: int) -> str:
        return os.path.join(self.directory, f"rank{rank}.json")

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def read_error_file(path: str | None) -> RankError | None:
    """The recorded exception in ``path``, or None (no path, no file, not torch's format)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        return parse_error(json.loads(raw.decode("utf-8", "replace")))
    except ValueError:
        return None


def parse_error(data: Any) -> RankError | None:
    """torch's JSON (``message`` a dict with ``message`` and ``extraInfo.py_callstack``) as a RankError."""
    body = data.get("message") if isinstance(data, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return None
    kind, sep, text = body["message"].partition(": ")
    if not sep:
        kind, text = body["message"], ""
    extra = body.get("extraInfo")
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return RankError(type=kind, message=text, frames=last_frames(stack) if isinstance(stack, str) else ())


def last_frames(callstack: str, count: int = _FRAMES) -> tuple[str, ...]:
    """The innermost ``count`` frames of a formatted traceback, each ``File "x.py", line 3, in f: code``."""
    lines = callstack.splitlines()
    frames = []
    for i, line in enumerate(lines):
        if line.startswith('  File "'):
            code = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
            frames.append(line.strip() + (f": {code}" if code else ""))
    return tuple(frames[-count:])


def error_lines(rank: int, error: RankError) -> list[str]:
    """``rank 1 raised ValueError: bad lr`` and its innermost frames, for the reports."""
    text = f"{error.type}: {error.message}" if error.message else error.type
    return [f"rank {rank} raised {text}", *(f"  at {frame}" for frame in error.frames)]
