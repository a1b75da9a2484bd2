"""After an attempt's ranks are over: wait, bounded, until no process of the job still holds a GPU (issue 29).

A process of the job that outlived the teardown (one stuck in the driver after SIGKILL, say) can keep gigabytes of
GPU memory, and the next attempt of ``--max_restarts`` would start beside it and run out of memory (a case from the
field: an orphan held 115 GiB through five restarts). So the agent looks once the ranks are over and before it
reports the node's result, which is before xrun exits and before the next attempt can start on any node (its start
barrier waits for this one):

* no NVIDIA device on this node (no ``/dev/nvidiactl``): nothing more, one ``stat``; NVML is never loaded;
* the job's processes still alive: the live members of the ranks' sessions and the leftovers the teardown named
  (one pass over ``/proc``). None, the usual case: done, without asking the driver anything, since a process that
  has exited holds no device file (tests/gpu checks on a GPU that its memory is free by then);
* some: which of them hold a GPU, i.e. have ``/dev/nvidia<N>`` or ``/dev/nvidia-uvm`` open (read from ``/proc``,
  right in any pid namespace) or are listed by the driver with memory (NVML through nvidia-ml-py, the ``gpu``
  extra, else ``nvidia-smi --query-compute-apps``; the driver lists host pids, so inside a container only the
  device files tell). Looked at again every ``POLL`` s until none is left or ``RELEASE_WAIT`` s passed; then one
  line names each holder with the memory the driver lists for it, and the node goes on.

``holders`` and ``wait_released`` are pure (readings injected); ``wait_for_gpu_release`` is the one caller's entry
(xrun.launch.agent.run_node), so a local run, an agent connected to a head, pod mode and every attempt of
``--max_restarts`` all pass through it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from xrun.common.output.streams import notice
from xrun.common.result.outcome import NodeResult
from xrun.common.result.summary import format_bytes, seconds
from xrun.launch.procs import proctable

RELEASE_WAIT = 10.0  # seconds: a driver frees a dead client's memory in well under a second; this is for stragglers
POLL = 0.25
SMI_TIMEOUT = 10.0
_MIB = 1024 * 1024
# A CUDA context keeps its GPU's device file and the unified-memory one open; nvidiactl alone is any driver client.
_DEVICE_FILE = re.compile(r"/dev/nvidia([0-9]+|-uvm)\Z")


@dataclass(frozen=True)
class ComputeApp:
    """One process the driver lists on one GPU, with the memory it holds there (None: not reported, e.g. MIG)."""

    pid: int
    used_bytes: int | None
    gpu: str  # NVML's index, or nvidia-smi's UUID


@dataclass(frozen=True)
class GpuHolder:
    """A process of the job that still holds a GPU, and what the driver lists for it (empty: its open files tell)."""

    pid: int
    apps: tuple[ComputeApp, ...] = ()

    def describe(self) -> str:
        if not self.apps:
            return f"pid {self.pid} (GPU device files open; the driver lists no memory for it here)"
        held = ", ".join(
            f"{format_bytes(a.used_bytes) if a.used_bytes is not None else 'memory not reported'} on GPU {a.gpu}"
            for a in self.apps
        )
        return f"pid {self.pid} ({held})"


# ---------------------------------------------------------------------------------------------------------------
# Pure: who holds, and the bounded wait.


def holders(
    alive: Collection[int], apps: Sequence[ComputeApp], has_device_files: Callable[[int], bool]
) -> list[GpuHolder]:
    """The processes of ``alive`` that hold a GPU: listed by the driver, or with a GPU device file open."""
    listed: dict[int, list[ComputeApp]] = {}
    for app in apps:
        listed.setdefault(app.pid, []).append(app)
    held = [pid for pid in sorted(alive) if pid in listed or has_device_files(pid)]
    return [GpuHolder(pid, tuple(listed.get(pid, ()))) for pid in held]


def wait_released(
    look: Callable[[], list[GpuHolder]],
    *,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[GpuHolder], float]:
    """Look until nobody holds a GPU or ``timeout`` s passed: (the holders left, seconds waited)."""
    start = clock()
    last = False
    while True:
        found = look()
        waited = clock() - start
        if not found or last:
            return found, waited
        remaining = timeout - waited
        last = remaining <= POLL  # the look after this sleep is the last: no float left to chase
        sleep(max(0.0, min(POLL, remaining)))


def release_line(left: Sequence[GpuHolder], waited: float) -> str:
    """The one line when the wait gives up: who, how much, and what to do."""
    pids = " ".join(str(h.pid) for h in left)
    return (
        f"GPU still held {seconds(waited)} after the ranks ended, by {len(left)} process(es) of the job: "
        f"{'; '.join(h.describe() for h in left)}; going on without waiting longer (a next attempt may run out of "
        f"GPU memory): stop them (kill -9 {pids}), or drain the node if they will not die"
    )


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """``nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits``: MiB per line."""
    apps = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue  # a message such as "No running processes found", or a row it could not fill
        used = int(fields[1]) * _MIB if fields[1].isdigit() else None  # "[N/A]" under MIG
        apps.append(ComputeApp(int(fields[0]), used, fields[2]))
    return apps


# ---------------------------------------------------------------------------------------------------------------
# Readings: /proc, NVML, nvidia-smi.


def nvml_apps() -> list[ComputeApp] | None:
    """Every GPU's compute processes through NVML (nvidia-ml-py); None when it is not installed or will not start."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        apps = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            device = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(device):
                used = proc.usedGpuMemory  # None where NVML cannot say (MIG, no privilege)
                apps.append(ComputeApp(int(proc.pid), int(used) if isinstance(used, int) else None, str(index)))
        return apps
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def smi_apps(smi: str | None = None) -> list[ComputeApp] | None:
    """The same from ``nvidia-smi --query-compute-apps``; None when it is missing, fails or hangs."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = [smi, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=SMI_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_compute_apps(done.stdout) if done.returncode == 0 else None


def driver_apps() -> list[ComputeApp]:
    """What the driver lists: NVML where nvidia-ml-py is installed, else nvidia-smi, else nothing."""
    apps = nvml_apps()
    if apps is None:
        apps = smi_apps()
    return apps or []


def has_device_files(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` has a GPU's device file (or the unified-memory one) open."""
    fd_dir = os.path.join(proc, str(pid), "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if _DEVICE_FILE.match(os.readlink(os.path.join(fd_dir, name))):
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def job_processes(sessions: Collection[int], leftovers: Collection[int]) -> set[int]:
    """The live members of the ranks' sessions and the live leftovers the teardown named."""
    alive = {p.pid for p in proctable.live_members(sessions)}
    for pid in leftovers:
        proc = proctable.read_proc(pid)
        if proc is not None and proc.alive:
            alive.add(pid)
    return alive


# ---------------------------------------------------------------------------------------------------------------
# The entry.


def wait_for_gpu_release(
    result: NodeResult,
    *,
    root: str = "/",
    timeout: float = RELEASE_WAIT,
    read_apps: Callable[[], list[ComputeApp]] = driver_apps,
) -> list[GpuHolder]:
    """Once the node's ranks are over: wait until none of the job's processes holds a GPU, at most ``timeout`` s;
    name those left in one line. Returns them (empty: released, or no NVIDIA device here)."""
    if not os.path.exists(os.path.join(root, "dev", "nvidiactl")):
        return []
    sessions = {o.pid for o in result.outcomes if o.started}
    leftovers = {pid for o in result.outcomes for pid in o.leftovers}

    def look() -> list[GpuHolder]:
        alive = job_processes(sessions, leftovers)
        return holders(alive, read_apps(), has_device_files) if alive else []

    left, waited = wait_released(look, timeout=timeout)
    if left:
        notice(result.host, release_line(left, waited))
    return left
