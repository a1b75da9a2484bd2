"""Running xrun, torchrun and plain python on the GPU suite's rank scripts (tests/gpu/jobs), and reading back the
one ``XRUN_GPU {json}`` line each rank prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from tests.gpu.conftest import JOBS

MARK = "XRUN_GPU "


def job(name: str) -> str:
    return os.path.join(JOBS, name)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without a visibility list of its own (each test says what the ranks may see)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def xrun_argv(*flags: str, script: str, args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "xrun", *flags, script, *args]


def run(argv: Sequence[str], *, cwd: str, env: dict[str, str] | None = None, timeout: float = 90):
    """Run to the end (``cwd`` outside the repository, so ``-m xrun`` loads the installed xrun)."""
    return subprocess.run(list(argv), cwd=cwd, env=clean_env(env), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def records(stdout: str) -> list[dict]:
    """Every rank's record, in rank order (a rank's line may carry xrun's ``[host:rank]`` prefix)."""
    found = [json.loads(line.split(MARK, 1)[1]) for line in stdout.splitlines() if MARK in line]
    return sorted(found, key=lambda r: r.get("rank", 0))


def explain(done) -> str:
    """What a failed run said, for an assertion's message."""
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
