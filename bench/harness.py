"""The common harness: paired interleaved rounds, statistics, and one supervised trial of a local job.

Rounds are *paired*: in each round every variant runs once, the first round in the given order and later rounds
in a shuffled order, so slow drifts of a shared, noisy machine hit every variant alike. Ratios are computed per
round (variant / reference in the same round) and then summarised, which cancels most of that drift.

Stats and scheduling are pure (tested in tests/test_bench.py); the process part is at the bottom.
"""

from __future__ import annotations

import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from bench import procs
from bench.launchers import Launcher, LocalJob

RANKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")

# ---------------------------------------------------------------------------------------------------------------
# Pure: statistics and scheduling.

Value = Optional[float]  # None = censored: the event did not happen before the trial's deadline


def summarize(values: Sequence[Value], *, censor_at: float | None = None) -> dict[str, Any]:
    """Median and min–max of the values; censored values (None) count as larger than everything."""
    ranked = sorted(math.inf if v is None else float(v) for v in values)
    if not ranked:
        return {"n": 0, "median": None, "min": None, "max": None, "censored": 0, "values": []}

    def finite(x: float) -> float | None:
        return None if math.isinf(x) else x

    return {
        "n": len(ranked),
        "median": finite(statistics.median(ranked)) if not _median_censored(ranked) else None,
        "min": finite(ranked[0]),
        "max": finite(ranked[-1]),
        "censored": sum(1 for v in values if v is None),
        "censor_at": censor_at,
        "values": list(values),
    }


def _median_censored(ranked: list[float]) -> bool:
    # statistics.median of [1, inf] is inf: the median is unknown (above the deadline) then.
    return math.isinf(statistics.median(ranked))


def paired_ratios(values: Sequence[Value], reference: Sequence[Value]) -> dict[str, Any]:
    """Per-round ratio values[i] / reference[i] over rounds where both are known, summarised."""
    ratios: list[Value] = [v / r for v, r in zip(values, reference) if v is not None and r is not None and r > 0]
    return summarize(ratios)


def schedule(names: Sequence[str], rounds: int, rng: random.Random) -> list[list[str]]:
    """Round 0 in the given order, every later round shuffled: A B C D, then e.g. C A D B, B D A C..."""
    plan = [list(names)]
    for _ in range(1, rounds):
        order = list(names)
        rng.shuffle(order)
        plan.append(order)
    return plan[:rounds]


@dataclass
class Trial:
    """What one run of one variant measured. ``metrics`` values are seconds, MiB, counts; None = censored."""

    metrics: dict[str, Value] = field(default_factory=dict)
    exit_code: int | None = None
    error: str | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def run_rounds(
    variants: Sequence[str],
    rounds: int,
    trial: Callable[[str], Trial],
    *,
    rng: random.Random,
    label: str,
) -> dict[str, list[Trial]]:
    """Run ``trial(variant)`` for every variant in every round, in the interleaved order of ``schedule``."""
    results: dict[str, list[Trial]] = {v: [] for v in variants}
    for index, order in enumerate(schedule(variants, rounds, rng)):
        for name in order:
            result = trial(name)
            results[name].append(result)
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in result.metrics.items())
            err = f"  ERROR: {result.error}" if result.error else ""
            print(f"  [{label}] round {index + 1}/{rounds} {name:<16} {shown}{err}", file=sys.stderr, flush=True)
    return results


def summarize_group(
    results: dict[str, list[Trial]], *, references: Sequence[str] = ("floor", "xrun"), censor_at: float | None = None
) -> dict[str, Any]:
    """Per variant: stats of every metric, exit codes, errors; per metric: paired ratios to each reference."""
    out: dict[str, Any] = {"variants": {}}
    for name, trials in results.items():
        keys = list(dict.fromkeys(k for t in trials for k in t.metrics))
        entry: dict[str, Any] = {
            "metrics": {k: summarize([t.metrics.get(k) for t in trials], censor_at=censor_at) for k in keys},
            "exit_codes": [t.exit_code for t in trials],
            "errors": [t.error for t in trials if t.error],
            "notes": [t.notes for t in trials if t.notes],
        }
        for ref in references:
            if ref in results and ref != name:
                entry[f"vs_{ref}"] = {
                    k: paired_ratios([t.metrics.get(k) for t in trials], [t.metrics.get(k) for t in results[ref]])
                    for k in keys
                }
        out["variants"][name] = entry
    return out


def _fmt(value: Value) -> str:
    if value is None:
        return "censored"
    return f"{value:.4g}"


# ---------------------------------------------------------------------------------------------------------------
# Processes: a fresh run directory, a tagged environment, one supervised launcher run.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_script(name: str) -> str:
    return os.path.join(RANKS_DIR, name)


class RunDir:
    """A temporary directory for one trial: ``ranks/`` (pid files), ``ok/``, ``logs/``, ``out`` (console)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="xbench-")
        for sub in ("ranks", "ok", "logs"):
            os.mkdir(os.path.join(self.path, sub))
        self.console = os.path.join(self.path, "out")

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def count(self, sub: str) -> int:
        return len(os.listdir(os.path.join(self.path, sub)))

    def tail(self, limit: int = 600) -> str:
        try:
            with open(self.console, "rb") as f:
                f.seek(max(0, os.path.getsize(self.console) - limit))
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""


def bench_env(tag: str) -> dict[str, str]:
    """The environment every launcher gets: ours, tagged, with the knobs that would skew a comparison removed.

    PYTHONUNBUFFERED (set on these machines) would make the floor's writes unbuffered; launchers that want
    unbuffered ranks pass ``-u`` themselves. PYTHONDONTWRITEBYTECODE would make xrun (an editable install)
    recompile itself on every start, which no user sees. OMP_NUM_THREADS=1 for every variant because torchrun
    sets it and the others do not.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env[procs.TAG_ENV] = tag
    env["OMP_NUM_THREADS"] = "1"
    return env


def start(argv: list[str], *, env: dict[str, str], console: str | int) -> subprocess.Popen[bytes]:
    """Start a launcher in its own session, so signals we send reach only the pid we name."""
    out = open(console, "wb") if isinstance(console, str) else console  # noqa: SIM115 - closed by the caller's exit
    try:
        return subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        if isinstance(console, str):
            out.close()


@contextmanager
def leave_nothing(proc: subprocess.Popen[bytes], tag: str) -> Iterator[None]:
    """Around a trial's watch of ``proc``: if the trial is interrupted, nothing tagged ``tag`` is left behind;
    either way the launcher is reaped (killed first if it still runs)."""
    try:
        yield
    except BaseException:  # interrupted: leave nothing of this trial behind
        procs.kill_all([proc.pid, *procs.tagged_pids(tag)])
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@dataclass
class JobRun:
    """What ``run_local_job`` observed, all times in seconds from just before the launcher was started."""

    wall_s: float | None  # launch to launcher exit; None = killed at the deadline
    exit_code: int | None
    first_rank_s: float | None
    last_rank_s: float | None
    ranks_started: int
    leftovers: list[str]
    peak_kib: dict[str, int]  # "launcher" and each other non-rank process ("agent <pid>: cmdline") -> VmHWM
    started_at: float = 0.0  # time.time() just before the launcher started
    peak_pss_kib: int | None = None  # largest sampled sum of PSS over the launcher and its non-rank processes
    cpu_s: float | None = None  # user + system CPU of the launcher and every descendant it reaped (pdsh, ssh, ...)


def run_local_job(
    launcher: Launcher,
    job: LocalJob,
    run: RunDir,
    *,
    deadline_s: float,
    console: str | int | None = None,
    sample_memory: bool = False,
    env_extra: dict[str, str] | None = None,
) -> JobRun:
    """Run one local job to completion (or the deadline), then collect leftovers and kill them."""
    tag = procs.new_tag()
    argv = launcher.argv(replace(job, args=rank_args(tag, run, job.args)))
    return run_command(
        argv, tag, run, deadline_s=deadline_s, console=console, sample_memory=sample_memory, env_extra=env_extra
    )


def rank_args(tag: str, run: RunDir, args: tuple[str, ...]) -> tuple[str, ...]:
    """What every rank script gets first: the tag (so /proc finds it even without our environment) and the
    run directory for its pid file."""
    return (f"tag={tag}", f"dir={run.path}", *args)


def run_command(
    argv: list[str],
    tag: str,
    run: RunDir,
    *,
    deadline_s: float,
    console: str | int | None = None,
    sample_memory: bool = False,
    sample_every_s: float = 0.002,
    env_extra: dict[str, str] | None = None,
    more_helpers: Callable[[], list[int]] | None = None,
) -> JobRun:
    """Run ``argv`` (a launcher whose ranks carry ``tag``) to exit or the deadline; observe ranks and memory.

    With ``sample_memory``, VmHWM of the launcher and its tagged helpers is read every ``sample_every_s`` (make it
    larger when there are dozens of helpers, or the sampling itself loads the machine). ``more_helpers`` finds
    helpers that carry no tag (node agents started over ssh)."""
    env = {**bench_env(tag), **(env_extra or {})}
    peaks: dict[int, tuple[int, str]] = {}  # pid -> (VmHWM KiB, cmdline)
    t_wall0 = time.time()
    t0 = time.monotonic()
    reaped = _children_cpu()  # the bench reaps only the launcher in between: the delta is the launcher's tree
    proc = start(argv, env=env, console=run.console if console is None else console)
    wall: float | None = None
    next_scan = next_pss = 0.0
    pss_peak = 0
    known: set[int] = set()
    with leave_nothing(proc, tag):
        while True:
            code = proc.poll()
            now = time.monotonic()
            if code is not None:
                wall = now - t0
                break
            if now - t0 > deadline_s:
                break
            if sample_memory:
                if now >= next_scan:  # discover agents now and then; sampling known pids is cheap
                    known = set(procs.tagged_pids(tag)) - set(procs.rank_pids(run.path))
                    known |= set(more_helpers() if more_helpers else ())
                    next_scan = now + 0.1
                _sample(peaks, {proc.pid} | known)
                if now >= next_pss:  # smaps_rollup walks page tables: sample it less often
                    helpers = {p for p in known if not procs.runs_script(p, RANKS_DIR)}
                    pss_peak = max(pss_peak, sum(procs.pss_kib(p) or 0 for p in {proc.pid} | helpers))
                    next_pss = now + 0.02
            time.sleep(sample_every_s if sample_memory else 0.001)
    cpu_s = _children_cpu() - reaped
    ranks = procs.rank_pids(run.path)
    starts = sorted(ranks.values())
    time.sleep(0.05)  # let a launcher's own teardown of stragglers finish before we call them leftovers
    leftover_pids = procs.tagged_pids(tag)
    leftovers = [procs.cmdline(p) for p in leftover_pids]
    procs.kill_all(leftover_pids)
    return JobRun(
        wall_s=wall,
        exit_code=proc.returncode if wall is not None else None,
        first_rank_s=starts[0] - t_wall0 if starts else None,
        last_rank_s=starts[-1] - t_wall0 if starts else None,
        ranks_started=len(starts),
        leftovers=leftovers,
        peak_kib=_roles(peaks, launcher_pid=proc.pid, rank_pids=set(ranks)),
        peak_pss_kib=pss_peak or None,
        started_at=t_wall0,
        cpu_s=cpu_s,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _sample(peaks: dict[int, tuple[int, str]], pids: set[int]) -> None:
    for pid in pids:
        hwm = procs.status_kib(pid)
        if hwm:
            old = peaks.get(pid)
            peaks[pid] = (max(hwm, old[0]), old[1]) if old else (hwm, procs.cmdline(pid, 90))


def _roles(peaks: dict[int, tuple[int, str]], *, launcher_pid: int, rank_pids: set[int]) -> dict[str, int]:
    """Name the sampled processes: the launcher, and every other tagged process that is not a rank (an agent).

    A rank seen before it wrote its pid file was sampled too; it is dropped here once its pid file says so.
    """
    out = {}
    for pid, (hwm, cmd) in peaks.items():
        if pid == launcher_pid:
            out["launcher"] = hwm
        elif pid not in rank_pids:
            out[f"agent {pid}: {cmd}"] = hwm
    return out


def generations(run_dir: str) -> dict[int, list[float]]:
    """Start times by restart count, from the ranks' pid files ("start rank restart_count")."""
    out: dict[int, list[float]] = {}
    ranks = os.path.join(run_dir, "ranks")
    for name in os.listdir(ranks):
        with open(os.path.join(ranks, name)) as f:
            words = f.read().split()
        if len(words) == 3:
            out.setdefault(int(words[2]), []).append(float(words[0]))
    return out


def restart_timing(
    got: JobRun, restarted: list[float], since: float | None, *, ranks: int, cause: str, after: str, tail: str
) -> Trial:
    """One restart's figures: from ``since`` (the failure or the kill, a ``time.time()``; None = it never came, and
    ``cause`` says so in the error) until every one of the ``ranks`` ranks of attempt 1 runs (``restart_s``, from
    ``restarted``: their own start times), and until the launcher exits (``exit_s``); an exit other than 0 ``after``
    the restart is an error. ``tail``: the console's last lines, for the errors."""
    trial = Trial(exit_code=got.exit_code, notes={"leftovers": got.leftovers} if got.leftovers else {})
    if since is None or len(restarted) != ranks:
        trial.error = f"{len(restarted)} of {ranks} ranks restarted, {cause}, exit {got.exit_code} | console: {tail!r}"
        return trial
    trial.metrics = {
        "restart_s": max(restarted) - since,
        "exit_s": None if got.wall_s is None else got.started_at + got.wall_s - since,
        "leftovers": float(len(got.leftovers)),
    }
    if got.exit_code != 0:
        trial.error = f"exit {got.exit_code} after {after} | console: {tail!r}"
    return trial


def wait_ranks(run: RunDir, n: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait until ``n`` ranks wrote their pid file (True) or the launcher died / the timeout passed (False)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if len(procs.rank_pids(run.path)) >= n:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def send(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
