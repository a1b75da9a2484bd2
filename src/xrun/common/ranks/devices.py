"""Accelerators without torch: which kind this node has, how many, and the variable that makes them visible.

* ``Vendor`` and ``VISIBILITY``: NVIDIA ``CUDA_VISIBLE_DEVICES``, AMD (ROCm) ``HIP_VISIBLE_DEVICES``, Intel XPU
  ``ZE_AFFINITY_MASK``, Gaudi ``HABANA_VISIBLE_MODULES``, Ascend ``ASCEND_RT_VISIBLE_DEVICES`` (the variables
  DeepSpeed's accelerators and torchrun's device plugins set);
* ``detect_devices(root)``: reads the drivers' ``/proc``, ``/sys`` and ``/dev`` entries under ``root`` (``/`` on
  a node; a literal tree in the tests), never imports torch, never runs a vendor tool;
* ``hides_devices``: ``CUDA_VISIBLE_DEVICES`` empty or ``-1``, the usual way to hide the GPUs (CPU slots then);
* ``gpu_numa_nodes``/``rank_slot``: which NUMA node each rank's GPU sits on, for GPU-near core binding;
* ``device_names``/``visible_devices``: UUIDs and MIG instances (``GPU-…``, ``MIG-…``) as slot names: a slot is a
  position in the listed names, and a rank's list is mapped back to the names.

Pure functions except ``detect_devices`` (reads files only). Used by the runner's local pool
(xrun.runner.hosts.this_machine) and by each agent's rank environment (xrun.launch.ranks.processes).
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass

from xrun.errors import UsageError

NVIDIA_VISIBLE = "CUDA_VISIBLE_DEVICES"


class Vendor(enum.Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"
    GAUDI = "gaudi"
    ASCEND = "ascend"


VISIBILITY = {
    Vendor.NVIDIA: NVIDIA_VISIBLE,
    Vendor.AMD: "HIP_VISIBLE_DEVICES",
    Vendor.INTEL: "ZE_AFFINITY_MASK",
    Vendor.GAUDI: "HABANA_VISIBLE_MODULES",
    Vendor.ASCEND: "ASCEND_RT_VISIBLE_DEVICES",
}

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# nvidia-smi -L's spellings: GPU-<uuid>; MIG-<uuid> (driver >= 470); MIG-GPU-<uuid>/<gi>/<ci> (older drivers).
_DEVICE_NAME = rf"(GPU-{_UUID}|MIG-{_UUID}|MIG-GPU-{_UUID}/[0-9]+/[0-9]+)\Z"  # compiled on first use (re caches)
_INTEL_DATA_CENTER = ("0x0bd", "0x56c")  # Max (Ponte Vecchio) and Flex device ids: not a laptop's iGPU


@dataclass(frozen=True)
class Devices:
    """The accelerators this node has: whose, and how many (counted without importing torch)."""

    vendor: Vendor
    count: int

    @property
    def variable(self) -> str:
        return VISIBILITY[self.vendor]


def detect_devices(root: str = "/") -> Devices | None:
    """The first vendor with devices on this node, and how many (None: CPU only)."""
    for vendor, count in (
        (Vendor.NVIDIA, _count_dir(root, "proc/driver/nvidia/gpus")),
        (Vendor.AMD, _count_amd(root)),
        (Vendor.INTEL, _count_pci(root, "drm", "card", "0x8086", _INTEL_DATA_CENTER)),
        (Vendor.GAUDI, _count_pci(root, "accel", "accel", "0x1da3") or _count_dir(root, "sys/class/habanalabs")),
        (Vendor.ASCEND, sum(1 for n in _listdir(root, "dev") if re.fullmatch(r"davinci[0-9]+", n))),
    ):
        if count:
            return Devices(vendor, count)
    return None


def hides_devices(visible: str) -> bool:
    """``CUDA_VISIBLE_DEVICES`` empty or starting with a negative index (``-1``): CUDA then sees no device."""
    first = visible.split(",", 1)[0].strip()
    return first == "" or (first.startswith("-") and first[1:].isdigit())


def device_names(visible: str) -> tuple[str, ...] | None:
    """The UUID/MIG names a visibility list gives (None: it is not a list of well-formed names)."""
    names = tuple(item.strip() for item in visible.split(","))
    return names if all(re.match(_DEVICE_NAME, n, re.IGNORECASE) for n in names) else None


def visible_devices(inherited: str | None, planned: str) -> str:
    """A rank's ``CUDA_VISIBLE_DEVICES``: the plan's slot list, except over what the node's own value says.

    Hidden GPUs stay hidden (the slots are CPU slots); a list of UUID/MIG names makes the slots positions in it,
    mapped back to the names here. Otherwise the plan's indices win, as in DeepSpeed.
    """
    if inherited is None:
        return planned
    if hides_devices(inherited):
        return inherited
    names = device_names(inherited)
    if names is None or planned == "":
        return planned
    slots = [int(s) for s in planned.split(",")]
    outside = [s for s in slots if s >= len(names)]
    if outside:
        raise UsageError(NVIDIA_VISIBLE, f"lists {len(names)} device(s) by name; there is no slot {outside[0]}")
    return ",".join(names[s] for s in slots)


def gpu_numa_nodes(root: str = "/") -> dict[int, int]:
    """NVIDIA GPU index -> the NUMA node of its PCI device (``/sys/bus/pci/devices/<bus id>/numa_node``).

    Indices follow PCI bus order (the driver's ``/proc/driver/nvidia/gpus/<bus id>`` entries sorted), as
    nvidia-smi numbers them; a device whose node the kernel does not know (``-1``) is left out.
    """
    found = {}
    for index, bus_id in enumerate(sorted(_listdir(root, "proc/driver/nvidia/gpus"))):
        node = _read(os.path.join(root, "sys/bus/pci/devices", bus_id.lower(), "numa_node"))
        if node.isdigit():
            found[index] = int(node)
    return found


def rank_slot(visible: str | None, local_rank: int) -> int | None:
    """The device index a local rank uses: entry ``local_rank`` of its list (its only one with one device)."""
    items = (visible or "").split(",")
    item = items[0] if len(items) == 1 else items[local_rank] if local_rank < len(items) else ""
    return int(item) if item.strip().isdigit() else None


# ---------------------------------------------------------------------------------------------------------------


def _listdir(root: str, path: str) -> list[str]:
    try:
        return os.listdir(os.path.join(root, path))
    except OSError:
        return []


def _count_dir(root: str, path: str) -> int:
    return len(_listdir(root, path))


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _count_amd(root: str) -> int:
    """ROCm's KFD topology: a node with SIMDs is a GPU (node 0 is usually the CPU)."""
    count = 0
    nodes = os.path.join(root, "sys/class/kfd/kfd/topology/nodes")
    for node in _listdir(root, "sys/class/kfd/kfd/topology/nodes"):
        for line in _read(os.path.join(nodes, node, "properties")).splitlines():
            key, _, value = line.partition(" ")
            if key == "simd_count" and value.strip().isdigit() and int(value) > 0:
                count += 1
    return count


def _count_pci(root: str, cls: str, prefix: str, vendor: str, device_prefixes: tuple[str, ...] = ()) -> int:
    """Devices of ``/sys/class/<cls>/<prefix>N`` whose PCI vendor (and device id prefix, if given) match."""
    base = os.path.join(root, "sys/class", cls)
    count = 0
    for name in _listdir(root, os.path.join("sys/class", cls)):
        if not re.fullmatch(rf"{prefix}[0-9]+", name):
            continue
        device = os.path.join(base, name, "device")
        if _read(os.path.join(device, "vendor")).lower() != vendor:
            continue
        if device_prefixes and not _read(os.path.join(device, "device")).lower().startswith(device_prefixes):
            continue
        count += 1
    return count
