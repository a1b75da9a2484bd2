"""What the GPU suite compares xrun with: nvidia-smi's own words, and the driver's /proc and the PCI device's sysfs
read independently of xrun. Parsers are pure (tested on CPU in tests/test_gpu_readings.py against outputs of
H100/H200 nodes, with and without MIG); ``smi`` runs the tool.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_LINE = re.compile(rf"GPU (\d+): (.+?) \(UUID: (GPU-{_UUID})\)\s*\Z")
# driver >= 470: "  MIG 3g.40gb     Device  0: (UUID: MIG-<uuid>)"; older: "MIG-GPU-<uuid>/<gi>/<ci>"
_MIG_LINE = re.compile(rf"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-{_UUID}|MIG-GPU-{_UUID}/\d+/\d+)\)\s*\Z")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class MigDevice:
    profile: str  # "3g.40gb"
    device: int
    uuid: str


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    uuid: str
    mig: tuple[MigDevice, ...] = ()


def parse_list(text: str) -> tuple[SmiGpu, ...]:
    """``nvidia-smi -L``: every GPU with its index, name and UUID, and its MIG devices beneath it."""
    gpus: list[SmiGpu] = []
    for line in text.splitlines():
        if match := _GPU_LINE.match(line):
            gpus.append(SmiGpu(int(match.group(1)), match.group(2), match.group(3)))
        elif (match := _MIG_LINE.match(line)) and gpus:
            last = gpus[-1]
            mig = MigDevice(match.group(1), int(match.group(2)), match.group(3))
            gpus[-1] = SmiGpu(last.index, last.name, last.uuid, (*last.mig, mig))
    return tuple(gpus)


@dataclass(frozen=True)
class TopoRow:
    """One GPU's row of ``nvidia-smi topo -m``: its links, its CPU affinity and NUMA affinity as printed."""

    gpu: str  # "GPU0"
    links: dict[str, str]  # "GPU1" -> "NV18", "NIC0" -> "PXB"
    cpu_affinity: str | None  # "0-55,112-167"; None where the column is missing or N/A
    numa_affinity: str | None


def parse_topo(text: str) -> dict[int, TopoRow]:
    """``nvidia-smi topo -m``: GPU index -> its row. Columns are tab-separated, but padded with extra tabs (an empty
    cell before ``GPU NUMA ID``), so the non-empty cells of a row pair up with the header's names in order."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in line or line.startswith("\tGPU0")), None)
    if header_at is None:
        return {}
    names = [cell.strip() for cell in lines[header_at].split("\t") if cell.strip()]
    rows = {}
    for line in lines[header_at + 1 :]:
        if not line.strip():
            break  # the legend follows a blank line
        cells = [cell.strip() for cell in line.split("\t") if cell.strip()]
        label = cells[0]
        if not re.fullmatch(r"GPU\d+", label):
            continue  # NIC rows
        values = dict(zip(names, cells[1:]))
        links = {n: v for n, v in values.items() if re.fullmatch(r"(GPU|NIC)\d+", n)}

        def known(column: str, values: dict[str, str] = values) -> str | None:
            value = values.get(column)
            return value if value not in (None, "N/A") else None

        rows[int(label[3:])] = TopoRow(label, links, known("CPU Affinity"), known("NUMA Affinity"))
    return rows


@dataclass(frozen=True)
class SmiQueryGpu:
    index: int
    bus_id: str  # as nvidia-smi prints it: 00000000:18:00.0
    uuid: str
    name: str
    memory_mib: int
    driver: str

    @property
    def sysfs_bus_id(self) -> str:
        """The PCI address as /sys and /proc/driver/nvidia spell it: a 4-digit domain, lower case."""
        domain, rest = self.bus_id.split(":", 1)
        return f"{int(domain, 16):04x}:{rest}".lower()


QUERY_GPU = "--query-gpu=index,pci.bus_id,uuid,name,memory.total,driver_version"


def parse_query_gpu(text: str) -> tuple[SmiQueryGpu, ...]:
    """``nvidia-smi QUERY_GPU --format=csv,noheader,nounits``."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < 6 or not cells[0].isdigit():
            continue
        index, bus, uuid, *name, memory, driver = cells
        found.append(SmiQueryGpu(int(index), bus, uuid, ",".join(name), int(memory) if memory.isdigit() else -1, driver))
    return tuple(found)


def smi(*args: str, timeout: float = 30) -> str:
    """nvidia-smi's stdout; a failure raises with its stderr."""
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class ProcGpu:
    """One GPU as the driver's /proc/driver/nvidia/gpus/<bus id>/information and the PCI device's sysfs say."""

    bus_id: str
    model: str | None
    uuid: str | None  # None where the driver prints question marks (no client has opened the GPU yet, on some drivers)
    numa_node: int | None  # /sys/bus/pci/devices/<bus id>/numa_node; None for -1 or missing
    local_cpulist: str | None  # /sys/bus/pci/devices/<bus id>/local_cpulist


def parse_information(text: str) -> dict[str, str]:
    """``Key: \\t value`` lines of the driver's information file."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def read_proc_gpus(root: str = "/") -> tuple[ProcGpu, ...]:
    """Every GPU the driver lists under ``root``, in PCI bus order."""
    base = os.path.join(root, "proc/driver/nvidia/gpus")
    try:
        buses = sorted(os.listdir(base))
    except OSError:
        return ()
    gpus = []
    for bus in buses:
        info = parse_information(_read(os.path.join(base, bus, "information")) or "")
        uuid = info.get("GPU UUID")
        pci = os.path.join(root, "sys/bus/pci/devices", bus.lower())
        node = _read(os.path.join(pci, "numa_node"))
        gpus.append(ProcGpu(
            bus_id=bus.lower(),
            model=info.get("Model"),
            uuid=uuid if uuid and re.fullmatch(f"GPU-{_UUID}", uuid) else None,
            numa_node=int(node) if node is not None and node.isdigit() else None,
            local_cpulist=_read(os.path.join(pci, "local_cpulist")),
        ))
    return tuple(gpus)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None
