"""No process of the job holds GPU memory when xrun exits or when the next attempt of --max_restarts starts, orphans
that hold GPU memory included (a case from the field: one held 115 GiB through five restarts); xrun's own wait for
the release (xrun.launch.ranks.gpu_release) against a real holder; what the wait costs when nothing is held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.gpu.runs import clean_env, explain, job, run, xrun_argv
from tests.gpu.smi import smi
from xrun.common.output.writer import writer
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.launch.ranks import gpu_release

HOLDER = """
import sys, time, torch
block = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(600)
"""


def used_mib() -> list[int]:
    return [int(v) for v in smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").split()]


def listed_pids() -> dict[int, int]:
    return {a.pid: (a.used_bytes or 0) >> 20 for a in gpu_release.driver_apps()}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_no_memory_held_between_attempts_or_at_exit(tmp_path, figures):
    folder = tmp_path / "attempts"
    folder.mkdir()
    before = used_mib()
    env = {"XRUN_GPU_DIR": str(folder), "HOLD_GIB": "2", "ORPHAN_GIB": "1"}
    started = time.time()
    # one rank; --min_attempt_s 0: the same failure twice in a row must not end the restarts early
    flags = ("--num_gpus", "1", "--max_restarts", "2", "--min_attempt_s", "0")
    done = run(xrun_argv(*flags, script=job("hold_rank.py")), cwd=str(tmp_path), env=env, timeout=180)
    exited = time.time()
    listed_at_exit = listed_pids()
    after = used_mib()
    attempts = [json.load(open(folder / f"attempt-{i}.json")) for i in range(3) if (folder / f"attempt-{i}.json").exists()]
    job_pids = {p for a in attempts for p in [a["pid"], *a["orphans"]]}
    figures.put("xrun exit", done.returncode)
    figures.put("attempts", [{"attempt": a["attempt"], "pid": a["pid"], "orphans": a["orphans"],
                              "starts after xrun start (s)": round(a["at_start"] - started, 2),
                              "listed by the driver at its start (pid: MiB)": a["listed_at_start"],
                              "listed before it exits": a["listed_before_exit"],
                              "earlier pids alive at its start": a["earlier_alive"]} for a in attempts])
    figures.put("GPU memory used (MiB): before, right after xrun exits", (before, after))
    figures.put("listed by the driver right after xrun exits", listed_at_exit)
    figures.put("seconds of the whole job", round(exited - started, 2))
    figures.put("xrun's lines", [line for line in done.stderr.splitlines() if line.startswith("xrun")][-12:])
    assert done.returncode == 0, explain(done)
    assert len(attempts) == 3
    for k, later in enumerate(attempts[1:], start=1):
        earlier = attempts[k - 1]
        # the orphan and the rank really held memory, as the driver saw it ...
        assert str(earlier["pid"]) in earlier["listed_before_exit"], earlier
        assert all(str(p) in earlier["listed_before_exit"] for p in earlier["orphans"]), earlier
        # ... and none of the job's earlier processes holds any, or lives, when the next attempt starts
        before = {p for a in attempts[:k] for p in [a["pid"], *a["orphans"]]}
        assert not set(map(int, later["listed_at_start"])) & before, later
        assert later["earlier_alive"] == [], later
    assert not set(listed_at_exit) & job_pids
    assert not [p for p in job_pids if alive(p)]


def test_the_wait_names_a_real_holder_and_sees_its_release(tmp_path, figures, capfd):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=clean_env(), stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        rank = RankOutcome("localhost", 0, 0, holder.pid, 1, None, 1.0, (), False)
        result = NodeResult("localhost", (rank,), rank, None, 1)
        nvml, from_smi = gpu_release.nvml_apps(), gpu_release.smi_apps()
        figures.put("NVML lists (pid, MiB)", [(a.pid, (a.used_bytes or 0) >> 20) for a in nvml or []])
        figures.put("nvidia-smi lists (pid, MiB)", [(a.pid, (a.used_bytes or 0) >> 20) for a in from_smi or []])
        figures.put("device files open", gpu_release.has_device_files(holder.pid))
        started = time.monotonic()
        left = gpu_release.wait_for_gpu_release(result, timeout=1.0)
        figures.put("gave up after (s)", round(time.monotonic() - started, 2))
        writer().drain()  # the console is written from a thread
        line = capfd.readouterr().err.strip()
        figures.put("its line", line)
        assert [h.pid for h in left] == [holder.pid]
        assert left[0].apps and left[0].apps[0].used_bytes >= 1 << 30
        assert f"pid {holder.pid} (" in line and "GiB on GPU" in line
        assert nvml is not None and holder.pid in {a.pid for a in nvml}
        assert from_smi is not None and holder.pid in {a.pid for a in from_smi}
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        reaped = time.monotonic()
        still_listed = holder.pid in listed_pids()
        figures.put("listed by the driver right after the holder was reaped", still_listed)
        figures.put("seconds from SIGKILL to reaped", round(reaped - killed, 3))
        assert gpu_release.wait_for_gpu_release(result, timeout=10.0) == []
        assert not still_listed
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_the_wait_costs_next_to_nothing_when_nothing_is_held(figures):
    rank = RankOutcome("localhost", 0, 0, 2**22 + 7, 0, None, 1.0, (), False)  # long gone
    result = NodeResult("localhost", (rank,), None, None, 0)
    costs = []
    for _ in range(5):
        started = time.perf_counter()
        assert gpu_release.wait_for_gpu_release(result) == []
        costs.append(round((time.perf_counter() - started) * 1000, 2))
    figures.put("ms per wait, 5 runs", costs)
    assert max(costs) < 500
