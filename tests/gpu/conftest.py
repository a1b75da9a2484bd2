"""The GPU suite (issue 29): marked ``gpu``, skipped with one line where no CUDA device is present; every test
records its figures, and with ``XRUN_GPU_RESULTS=DIR`` (tests/gpu/run.sh sets it) they are written to
``DIR/results.json`` and ``DIR/results.md`` with each test's outcome, so nothing there claims what did not run.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "jobs")
RESULTS_ENV = "XRUN_GPU_RESULTS"


@functools.lru_cache(maxsize=1)
def no_cuda_reason() -> str | None:
    """Why the suite cannot run here (None: it can), checked cheaply first: no nvidia-smi means no torch import."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here: nvidia-smi is not installed"
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no NVIDIA GPU here: nvidia-smi -L failed ({err})"
    if not any(line.startswith("GPU ") for line in listing.splitlines()):
        return "no NVIDIA GPU here: nvidia-smi -L lists none"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if not str(item.fspath).startswith(HERE + os.sep):
            continue
        item.add_marker(pytest.mark.gpu)
        RESULTS.entry(item.nodeid)  # listed from the start: a test the time limit cut off shows as "not run"
        reason = reason or no_cuda_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# -- figures -------------------------------------------------------------------------------------------------------


class Results:
    """Every test's figures and outcome, in the order the tests ran."""

    def __init__(self) -> None:
        self.tests: dict[str, dict] = {}
        self.started = time.time()

    def entry(self, nodeid: str) -> dict:
        return self.tests.setdefault(nodeid, {"outcome": "not run", "figures": {}, "notes": []})


RESULTS = Results()


class Figures:
    """What a test measured: ``figures.put(name, value)``; ``figures.note(text)`` for what a reader must know."""

    def __init__(self, entry: dict) -> None:
        self._entry = entry

    def put(self, name: str, value) -> None:
        self._entry["figures"][name] = value

    def note(self, text: str) -> None:
        self._entry["notes"].append(text)


@pytest.fixture
def figures(request) -> Figures:
    return Figures(RESULTS.entry(request.node.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not str(item.fspath).startswith(HERE + os.sep):
        return
    entry = RESULTS.entry(item.nodeid)
    if report.when == "call" or report.outcome != "passed":
        entry["outcome"] = report.outcome if report.when == "call" or report.outcome == "skipped" else "error"
        entry["seconds"] = round(report.duration, 2) if report.when == "call" else entry.get("seconds")
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            entry["notes"].append(f"skipped: {report.longrepr[2]}")
        elif report.outcome != "passed":
            entry["notes"].append(f"{report.when} failed: {report.longreprtext.strip().splitlines()[-1][:500]}")
    if report.when == "teardown":
        write_results()  # after every test: a suite cut off by its time limit still leaves what it finished


def pytest_sessionfinish(session, exitstatus):
    write_results()


def write_results() -> None:
    folder = os.environ.get(RESULTS_ENV)
    if not folder or not RESULTS.tests:
        return
    os.makedirs(folder, exist_ok=True)
    document = {"machine": machine(), "seconds": round(time.time() - RESULTS.started, 1), "tests": RESULTS.tests}
    with open(os.path.join(folder, "results.json"), "w") as handle:
        json.dump(document, handle, indent=1, default=str)
    with open(os.path.join(folder, "results.md"), "w") as handle:
        handle.write(render_markdown(document))


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """The card and the software the figures were taken with (each read here, not assumed)."""
    found: dict = {"python": sys.version.split()[0]}
    try:
        query = "--query-gpu=name,memory.total,driver_version"
        found["gpus"] = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True,
                                       text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as err:
        found["gpus"] = f"nvidia-smi failed: {err}"
    try:
        import torch

        found["torch"] = torch.__version__
        found["cuda"] = torch.version.cuda
    except ImportError:
        found["torch"] = None
    import xrun

    found["xrun"] = xrun.__file__
    found["cpus"] = os.cpu_count()
    found["kernel"] = os.uname().release
    return found


def render_markdown(document: dict) -> str:
    lines = ["# xrun GPU suite results", "", f"machine: `{json.dumps(document['machine'])}`", "",
             f"suite time: {document['seconds']} s", ""]
    for nodeid, entry in document["tests"].items():
        lines.append(f"## {nodeid.split('::', 1)[-1]} — {entry['outcome']} ({entry.get('seconds')} s)")
        for name, value in entry["figures"].items():
            lines.append(f"- {name}: `{json.dumps(value, default=str)}`")
        lines.extend(f"- note: {note}" for note in entry["notes"])
        lines.append("")
    return "\n".join(lines)
