"""The embedded default: no hostfile means one node, ``localhost``, with the local accelerators (or 1 CPU slot).

The visibility variable (``CUDA_VISIBLE_DEVICES``, or another vendor's: xrun.common.ranks.devices) set and empty, or
``-1``, hides the GPUs: the slots are CPU slots (``--num_gpus N`` processes), and the ranks keep the variable as
the user set it. A list of UUIDs/MIG instances gives one slot per name (its position; the agent maps it back).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from xrun.common.ranks.devices import VISIBILITY, detect_devices, device_names, hides_devices
from xrun.errors import SelectionError
from xrun.runner.hosts.selection import Pool, Selection

LOCALHOST = "localhost"
LOCAL_ADDR = "127.0.0.1"


@dataclass(frozen=True)
class LocalPool:
    pool: Pool
    notice: str | None = None  # one line for stderr, e.g. why CUDA_VISIBLE_DEVICES was ignored


def count_accelerators() -> int:
    """Count accelerators without importing torch: the drivers' /proc, /sys and /dev entries
    (xrun.common.ranks.devices: NVIDIA, AMD, Intel XPU, Gaudi, Ascend), else ``nvidia-smi -L``."""
    found = detect_devices()
    if found is not None:
        return found.count
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
    """The slots of ``localhost``: the visibility variable when set and no filter flag, else the detected devices."""
    variable = next((v for v in VISIBILITY.values() if v in env), "CUDA_VISIBLE_DEVICES")
    visible = env.get(variable)
    if visible is not None and hides_devices(visible):  # the usual way to hide the GPUs: CPU ranks (issue 13)
        return LocalPool(_detected_pool(0, selection))
    # UUIDs/MIG instances: the slots are positions in the list (the agent maps them back to the names)
    if visible and (names := device_names(visible)) is not None:
        if len(set(names)) != len(names):
            raise SelectionError(variable, visible, "lists a device twice")
        return LocalPool({LOCALHOST: tuple(range(len(names)))})
    if visible and visible.strip():
        if not selection.filters:
            return LocalPool({LOCALHOST: _parse_visible_devices(visible, variable)})
        notice = f"xrun: ignoring {variable}={visible} because a device filter flag was given"
        return LocalPool(_detected_pool(detect(), selection), notice)
    return LocalPool(_detected_pool(detect(), selection))


def _detected_pool(count: int, selection: Selection) -> Pool:
    if count > 0:
        return {LOCALHOST: tuple(range(count))}
    # No accelerator: CPU ranks. --num_gpus N asks for N processes; otherwise one.
    return {LOCALHOST: tuple(range(selection.num_gpus or 1))}


def _parse_visible_devices(visible: str, variable: str) -> tuple[int, ...]:
    items = [item.strip() for item in visible.split(",")]
    if not all(re.fullmatch(r"[0-9]+", item) for item in items):
        raise SelectionError(
            variable,
            visible,
            "xrun needs device indices such as 0,1 or whole UUIDs/MIG names as nvidia-smi -L prints them "
            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); or pass --include localhost:0,1",
        )
    slots = tuple(int(item) for item in items)
    if len(set(slots)) != len(slots):
        raise SelectionError(variable, visible, "lists a device twice")
    return slots
