"""A rank's Python stack as data: what ``py-spy dump`` saw (xrun.launch.doctor.stackdump), or why there is none.

Part of a node's result: a failure report shows the survivors' stacks, and the hang doctor's dumps travel to
the head as these records (``to_json``/``from_json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Frame:
    name: str  # the function
    filename: str
    line: int


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: tuple[Frame, ...]  # outermost first, as a traceback reads


@dataclass(frozen=True)
class RankStack:
    """One rank's stack (its main thread first), or why there is none."""

    host: str
    rank: int
    local_rank: int
    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host, "rank": self.rank, "local_rank": self.local_rank, "pid": self.pid, "error": self.error,
            "threads": [{"name": t.name, "frames": [[f.name, f.filename, f.line] for f in t.frames]}
                        for t in self.threads],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankStack:
        """A stack an agent sent; a malformed one raises ValueError (a protocol error)."""
        try:
            threads = tuple(
                ThreadStack(str(t["name"]), tuple(Frame(str(n), str(f), int(ln)) for n, f, ln in t["frames"]))
                for t in data["threads"]
            )
            error = data.get("error")
            return cls(str(data["host"]), int(data["rank"]), int(data["local_rank"]), int(data["pid"]), threads,
                       None if error is None else str(error))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed stack: {err!r}") from None
