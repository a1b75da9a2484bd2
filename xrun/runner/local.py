"""The embedded default: no hostfile means one node, ``localhost``, with the local accelerators (or 1 CPU slot).

``CUDA_VISIBLE_DEVICES`` set and empty, or ``-1``, hides the GPUs: the slots are CPU slots (``--num_gpus N``
processes), and the ranks keep the variable as the user set it (xrun.launch.ranks.hides_devices)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from xrun.errors import SelectionError
from xrun.launch.ranks import hides_devices
from xrun.runner.selection import Pool, Selection

LOCALHOST = "localhost"
LOCAL_ADDR = "127.0.0.1"
_NVIDIA_PROC = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class LocalPool:
    pool: Pool
    notice: str | None = None  # one line for stderr, e.g. why CUDA_VISIBLE_DEVICES was ignored


def count_accelerators() -> int:
    """Count NVIDIA GPUs without importing torch: the driver's /proc entries, else ``nvidia-smi -L``."""
    try:
        return len(os.listdir(_NVIDIA_PROC))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def local_pool(
    env: Mapping[str, str], selection: Selection, detect: Callable[[], int] = count_accelerators
) -> LocalPool:
    """The slots of ``localhost``: CUDA_VISIBLE_DEVICES when set and no filter flag, else the detected devices."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and hides_devices(visible):  # the usual way to hide the GPUs: CPU ranks (issue 13)
        return LocalPool(_detected_pool(0, selection))
    if visible and visible.strip():
        if not selection.filters:
            return LocalPool({LOCALHOST: _parse_visible_devices(visible)})
        notice = f"xrun: ignoring CUDA_VISIBLE_DEVICES={visible} because a device filter flag was given"
        return LocalPool(_detected_pool(detect(), selection), notice)
    return LocalPool(_detected_pool(detect(), selection))


def _detected_pool(count: int, selection: Selection) -> Pool:
    if count > 0:
        return {LOCALHOST: tuple(range(count))}
    # No accelerator: CPU ranks. --num_gpus N asks for N processes; otherwise one.
    return {LOCALHOST: tuple(range(selection.num_gpus or 1))}


def _parse_visible_devices(visible: str) -> tuple[int, ...]:
    items = [item.strip() for item in visible.split(",")]
    if not all(re.fullmatch(r"[0-9]+", item) for item in items):
        raise SelectionError(
            "CUDA_VISIBLE_DEVICES",
            visible,
            "xrun needs device indices such as 0,1 (not UUIDs); set indices or pass --include localhost:0,1",
        )
    slots = tuple(int(item) for item in items)
    if len(set(slots)) != len(slots):
        raise SelectionError("CUDA_VISIBLE_DEVICES", visible, "lists a device twice")
    return slots
