"""Waiting for the GPUs to be released after an attempt (xrun.launch.ranks.gpu_release, issue 29), on CPU: the pure
logic with injected readings, the driver's listings as NVML and nvidia-smi give them (a fake module, a fake tool),
and real processes standing in for a rank's leftovers that hold a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types

import pytest

from xrun.common.output.writer import writer
from xrun.common.result.outcome import NodeResult, RankOutcome
from xrun.launch.ranks import gpu_release
from xrun.launch.ranks.gpu_release import (
    ComputeApp,
    GpuHolder,
    has_device_files,
    holders,
    parse_compute_apps,
    release_line,
    wait_for_gpu_release,
    wait_released,
)

GIB = 1 << 30


def test_holders_are_the_jobs_processes_the_driver_lists_or_that_hold_a_device_file():
    apps = [ComputeApp(20, 2 * GIB, "0"), ComputeApp(20, GIB, "1"), ComputeApp(99, GIB, "0")]  # 99: not the job's
    found = holders({10, 20, 30}, apps, has_device_files=lambda pid: pid == 30)
    assert found == [GpuHolder(20, (apps[0], apps[1])), GpuHolder(30)]
    assert holders(set(), apps, has_device_files=lambda pid: True) == []


class Clock:
    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_released_returns_as_soon_as_nobody_holds():
    clock = Clock()
    looks = iter([[GpuHolder(5)], [GpuHolder(5)], []])
    left, waited = wait_released(lambda: next(looks), timeout=10.0, clock=clock, sleep=clock.sleep)
    assert left == [] and waited == pytest.approx(0.5) and clock.sleeps == [0.25, 0.25]


def test_wait_released_gives_up_at_the_bound_and_returns_who_is_left():
    clock = Clock()
    left, waited = wait_released(lambda: [GpuHolder(5)], timeout=0.6, clock=clock, sleep=clock.sleep)
    assert left == [GpuHolder(5)] and waited == pytest.approx(0.6)
    assert clock.sleeps == pytest.approx([0.25, 0.25, 0.1])  # never past the bound


def test_nothing_held_costs_one_look():
    clock = Clock()
    calls = []
    left, waited = wait_released(lambda: calls.append(1) or [], timeout=10.0, clock=clock, sleep=clock.sleep)
    assert (left, waited, calls, clock.sleeps) == ([], 0.0, [1], [])


def test_the_line_names_each_holder_with_its_memory_and_says_what_to_do():
    left = [GpuHolder(4242, (ComputeApp(4242, 115 * GIB, "0"),)), GpuHolder(4250),
            GpuHolder(4260, (ComputeApp(4260, None, "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"),))]
    assert release_line(left, 10.02) == (
        "GPU still held 10.0 s after the ranks ended, by 3 process(es) of the job: pid 4242 (115 GiB on GPU 0); "
        "pid 4250 (GPU device files open; the driver lists no memory for it here); pid 4260 (memory not reported "
        "on GPU GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f); going on without waiting longer (a next attempt may run "
        "out of GPU memory): stop them (kill -9 4242 4250 4260), or drain the node if they will not die")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("No running processes found\n", []),
        ("31337, 81000, GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f\n4242, 518, GPU-0b6d3a4e-1111-2222-3333-444455556666\n",
         [ComputeApp(31337, 81000 << 20, "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"),
          ComputeApp(4242, 518 << 20, "GPU-0b6d3a4e-1111-2222-3333-444455556666")]),
        ("777, [N/A], GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f\n",  # MIG: the driver reports no per-process memory
         [ComputeApp(777, None, "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f")]),
        ("[Insufficient Permissions], 12, GPU-x\n", []),
    ],
)
def test_parse_compute_apps(text, expected):
    assert parse_compute_apps(text) == expected


def fake_pynvml(monkeypatch, devices, *, fail_init=False):
    """A stand-in for nvidia-ml-py's module: ``devices`` is one list of (pid, usedGpuMemory) per GPU."""
    module = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    calls = []

    def init():
        calls.append("init")
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    module.NVMLError = NVMLError
    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    module.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return calls


def test_nvml_lists_every_gpus_processes_and_shuts_down(monkeypatch):
    calls = fake_pynvml(monkeypatch, [[(11, 2 * GIB)], [(12, None), (11, GIB)]])
    assert gpu_release.nvml_apps() == [ComputeApp(11, 2 * GIB, "0"), ComputeApp(12, None, "1"),
                                       ComputeApp(11, GIB, "1")]
    assert calls == ["init", "shutdown"]


def test_nvml_that_will_not_start_or_is_not_installed_gives_none_and_nvidia_smi_answers(monkeypatch, tmp_path):
    fake_pynvml(monkeypatch, [], fail_init=True)
    assert gpu_release.nvml_apps() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert gpu_release.nvml_apps() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-compute-apps=pid,used_memory,gpu_uuid ] || exit 9\n"
                   "echo '4242, 2048, GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_release.driver_apps() == [ComputeApp(4242, 2048 << 20, "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f")]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n")
    assert gpu_release.smi_apps() is None and gpu_release.driver_apps() == []
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpu_release.smi_apps() is None


def test_device_files_are_read_from_the_process_fd_table(tmp_path):
    proc = tmp_path / "proc"
    for pid, targets in {10: ["/dev/null", "/dev/nvidiactl"], 11: ["/dev/nvidiactl", "/dev/nvidia3"],
                         12: ["/dev/nvidia-uvm"], 13: ["socket:[1234]", "/dev/nvidia-modeset"]}.items():
        (proc / str(pid) / "fd").mkdir(parents=True)
        for fd, target in enumerate(targets):
            os.symlink(target, proc / str(pid) / "fd" / str(fd))
    assert [pid for pid in (10, 11, 12, 13, 14) if has_device_files(pid, str(proc))] == [11, 12]


def result_of(pid: int, leftovers=()) -> NodeResult:
    rank = RankOutcome("h", 0, 0, pid, 1, None, 1.0, (), False, leftovers=tuple(leftovers))
    return NodeResult("h", (rank,), rank, None, 1)


def test_a_node_without_an_nvidia_device_asks_nothing(tmp_path):
    def never():
        raise AssertionError("the driver was asked on a node without an NVIDIA device")

    assert wait_for_gpu_release(result_of(os.getpid()), root=str(tmp_path), read_apps=never) == []


def gpu_root(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    return str(tmp_path)


def test_no_live_process_of_the_job_asks_the_driver_nothing(tmp_path):
    def never():
        raise AssertionError("the driver was asked though every process of the job is gone")

    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    assert wait_for_gpu_release(result_of(gone.pid, [gone.pid]), root=gpu_root(tmp_path), read_apps=never) == []


def start_rank_with_a_leftover(tmp_path):
    """A real 'rank' (its own session) that leaves a child behind in its session, as a stuck leftover would be."""
    pidfile = tmp_path / "child"
    rank = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\nchild = subprocess.Popen(['sleep', '30'])\n"
                             f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"], start_new_session=True)
    rank.wait()
    return rank.pid, int(pidfile.read_text())


@pytest.mark.slow
def test_the_wait_ends_when_the_leftover_that_held_the_gpu_is_gone(tmp_path, capfd):
    rank, child = start_rank_with_a_leftover(tmp_path)
    try:
        listed = lambda: [ComputeApp(child, 3 * GIB, "0")]  # noqa: E731 - what the driver would say while it lives
        threading.Timer(0.6, os.kill, (child, 9)).start()
        started = time.monotonic()
        left = wait_for_gpu_release(result_of(rank), root=gpu_root(tmp_path), read_apps=listed, timeout=10.0)
        waited = time.monotonic() - started
        assert left == [] and 0.5 < waited < 3.0
        writer().drain()
        assert capfd.readouterr().err == ""
    finally:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_the_wait_gives_up_at_its_bound_and_names_the_holder(tmp_path, capfd):
    rank, child = start_rank_with_a_leftover(tmp_path)
    try:
        listed = lambda: [ComputeApp(child, 3 * GIB, "0"), ComputeApp(1, GIB, "0")]  # noqa: E731
        started = time.monotonic()
        left = wait_for_gpu_release(result_of(rank), root=gpu_root(tmp_path), read_apps=listed, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 2.0
        assert left == [GpuHolder(child, (ComputeApp(child, 3 * GIB, "0"),))]  # pid 1 is not the job's
        writer().drain()  # the console is written from a thread
        [line] = capfd.readouterr().err.splitlines()
        assert line.startswith("xrun[h]: GPU still held 0.5")
        assert line.split(" s after ", 1)[1].startswith(f"the ranks ended, by 1 process(es) of the job: pid {child} "
                                                        "(3.0 GiB on GPU 0); going on")
        assert f"kill -9 {child}" in line
    finally:
        os.kill(child, 9)
