"""Issue 31's promise on time, with real local gloo jobs through xrun: a straggler is named within 60 s of becoming
slow, again when it recovers, and a rank that sleeps a little longer each step is named once its lateness passes
the floor, its line's lateness what it has grown to. The ranks write their wall clock at each turn; the test reads
xrun's console with the moment each line came and compares (one machine, one clock).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from tests.cluster.harness import processes_with_marker
from tests.test_hang_doctor import start_xrun
from xrun.common.result.stragglers import LATE_FLOOR_NS

PROMISED_S = 60.0  # issue 31: named within 60 s of becoming slow; the recovery said as soon
NAMED = re.compile(r"straggler: rank (\d+) \(localhost\) enters collectives ([\d.]+) ms after")
RECOVERED = re.compile(r"straggler: rank (\d+) \(localhost\) recovered: ")

# Every rank enters an all-reduce every ~50 ms (15-20 a second here); the slow rank's turns come by its wall clock,
# and it ends the job through the all-reduce's tensor (the others stop at the same step).
GLOO_PHASES = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
slow_rank = int(os.environ["SLOW_RANK"])
healthy, slow, after = (float(s) for s in os.environ["PHASES"].split(","))
flag = torch.zeros(1)
dist.all_reduce(flag)
start, phase = time.time(), "healthy"
while True:
    if rank == slow_rank:
        now = time.time()
        if phase == "healthy" and now - start >= healthy:
            phase = "slow"
            print(f"slow from {now:.3f}", flush=True)
        elif phase == "slow" and now - start >= healthy + slow:
            phase = "recovered"
            print(f"recovered at {now:.3f}", flush=True)
        elif phase == "recovered" and now - start >= healthy + slow + after:
            flag[0] = 1
        if phase == "slow":
            time.sleep(float(os.environ["LATE"]))
    dist.all_reduce(flag)
    if flag.item() > 0:
        break
    time.sleep(0.05)
"""

# The growing rank sleeps GROW s longer at each step before its all-reduce, and writes (wall clock, sleep in ms)
# at each; it ends the job RUN_PAST s after its sleep passed the floor.
GLOO_GROWING = """
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
grow, floor_s, run_past = float(os.environ["GROW"]), float(os.environ["FLOOR_S"]), float(os.environ["RUN_PAST"])
flag = torch.zeros(1)
dist.all_reduce(flag)
step, passed = 0, None
log = open(os.environ["SLEEPS"], "w") if rank == int(os.environ["SLOW_RANK"]) else None
while True:
    if log is not None:
        sleep, now = step * grow, time.time()
        log.write(f"{now:.3f} {sleep * 1000:.2f}\\n")
        log.flush()
        if passed is None and sleep >= floor_s:
            passed = now
        if passed is not None and now - passed >= run_past:
            flag[0] = 1
        time.sleep(sleep)
    dist.all_reduce(flag)
    step += 1
    if flag.item() > 0:
        break
    time.sleep(0.05)
"""


def run_local_job(tmp_path, nproc: int, env: dict[str, str], script: str, *, timeout: float):
    """A local gloo job of ``nproc`` ranks: its stdout, and its stderr's lines with the wall clock each came at."""
    pytest.importorskip("torch")
    proc, marker = start_xrun(tmp_path, "--num_gpus", str(nproc), "--master_port", "0", env=env, script=script)
    stamped: list[tuple[float, str]] = []
    out: list[str] = []

    def stamp() -> None:
        for line in proc.stderr:
            stamped.append((time.time(), line.rstrip("\n")))

    readers = [threading.Thread(target=stamp, daemon=True),
               threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        for reader in readers:
            reader.join(timeout=10)
    console = "\n".join(f"{at:.3f} {line}" for at, line in stamped)
    assert proc.returncode == 0, (console, out)
    assert not processes_with_marker(f"XRUN_TEST_MARKER={marker}")
    return "".join(out), stamped, console


def straggler_lines(stamped: list[tuple[float, str]]) -> list[tuple[float, str]]:
    return [(at, line) for at, line in stamped if "straggler:" in line]


def moment(stdout: str, words: str) -> float:
    """The wall clock a rank printed after ``words``."""
    [found] = re.findall(rf"\] {words} ([\d.]+)$", stdout, flags=re.MULTILINE)
    return float(found)


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_that_turns_slow_is_named_within_60_s_and_again_when_it_recovers(tmp_path):
    """3 ranks; rank 1 healthy for 40 s (a clean history: ~4 samples scored), then 150 ms late before each
    all-reduce for 45 s, then healthy for 30 s; ~2 min in all. The samples come every 10 s and each scores up to
    16 collectives, so the rule (12 of the last 16 late) names it 1-2 samples after the turn (measured
    12-19 s, at load 2-6) and says its recovery as soon (12-19 s): a 60 s promise with margin, on a loaded machine too."""
    stdout, stamped, console = run_local_job(
        tmp_path, 3, {"SLOW_RANK": "1", "PHASES": "40,45,30", "LATE": "0.15"}, GLOO_PHASES, timeout=240)
    slow_from, recovered_at = moment(stdout, "slow from"), moment(stdout, "recovered at")
    lines = straggler_lines(stamped)
    assert len(lines) == 2, console
    (named_at, named), (cleared_at, cleared) = lines
    found = NAMED.search(named)
    assert found and found[1] == "1" and "(others wait for it)" in named, console
    assert 100 <= float(found[2]) <= 400, named  # its 150 ms
    assert slow_from < named_at <= slow_from + PROMISED_S, (slow_from, console)  # never in its healthy 40 s
    found = RECOVERED.search(cleared)
    assert found and found[1] == "1", console
    assert recovered_at < cleared_at <= recovered_at + PROMISED_S, (recovered_at, console)
    print(f"named {named_at - slow_from:.1f} s after it turned slow; recovered {cleared_at - recovered_at:.1f} s "
          "after it did")


@pytest.mark.slow
@pytest.mark.torch
def test_a_rank_that_sleeps_a_little_longer_each_step_is_named_once_past_the_floor(tmp_path):
    """3 ranks; rank 2 sleeps 0.1 ms longer at each step from 0 (at ~15 steps a second: ~1.5 ms more a second),
    passing the 10 ms floor after ~7 s; the job ends 55 s later. It is named once past the floor, and its line's
    lateness (the median of its late collectives lately) lies between the floor and what it sleeps when the line
    comes (measured: named 11-21 s past the floor, 17-32 ms late, sleeping 26-38 ms by then)."""
    sleeps = tmp_path / "sleeps.txt"
    floor_ms = LATE_FLOOR_NS / 1e6
    _, stamped, console = run_local_job(
        tmp_path, 3, {"SLOW_RANK": "2", "GROW": "0.0001", "FLOOR_S": str(floor_ms / 1000), "RUN_PAST": "55",
                      "SLEEPS": str(sleeps)}, GLOO_GROWING, timeout=200)
    steps = [(float(at), float(ms)) for at, ms in (row.split() for row in sleeps.read_text().splitlines())]
    passed_floor = next(at for at, ms in steps if ms >= floor_ms)
    [(named_at, named)] = straggler_lines(stamped)  # named once; it never recovers
    found = NAMED.search(named)
    assert found and found[1] == "2", console
    assert passed_floor < named_at <= passed_floor + PROMISED_S, (passed_floor, console)
    sleeping = max(ms for at, ms in steps if at <= named_at)  # what it sleeps when the line comes
    late_ms = float(found[2])
    assert floor_ms <= late_ms <= sleeping + 5, (late_ms, sleeping, named)  # 5 ms: an all-reduce's own jitter
    print(f"named {named_at - passed_floor:.1f} s after its sleep passed the floor, {late_ms:g} ms late, "
          f"sleeping {sleeping:g} ms then")
