"""The parts that read NVIDIA devices, on CPU against what H100/H200 nodes print (issue 29): nvidia-smi -L with and
without MIG, nvidia-smi topo -m, the driver's /proc/driver/nvidia and the PCI devices' sysfs, xrun's counting
through them, and what ``xrun check`` says of the GPUs. The GPU suite (tests/gpu) reads the same on a real card."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.gpu.smi import (
    MigDevice,
    ProcGpu,
    SmiGpu,
    SmiQueryGpu,
    parse_list,
    parse_query_gpu,
    parse_topo,
    read_proc_gpus,
)
from tests.test_stacks import make_tree
from xrun.common.ranks.devices import Devices, Vendor, detect_devices, gpu_numa_nodes
from xrun.runner import check
from xrun.runner.hosts import this_machine as local

U = [f"GPU-{i:x}b6d3a4e-12ab-4c2e-9f1d-0a1b2c3d4e5{i:x}" for i in range(8)]
H100_LIST = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {U[i]})\n" for i in range(8))
H200_LIST = f"GPU 0: NVIDIA H200 (UUID: {U[0]})\n"
M = [f"MIG-{i}c89852c-d268-53f3-9b07-005d5ae1dc3f" for i in range(3)]
H100_MIG_LIST = (
    f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {U[0]})\n"
    f"  MIG 3g.40gb     Device  0: (UUID: {M[0]})\n"
    f"  MIG 2g.20gb     Device  1: (UUID: {M[1]})\n"
    f"  MIG 1g.10gb     Device  2: (UUID: {M[2]})\n"
    f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {U[1]})\n"
)
# driver 450-460 named MIG devices by their parent's UUID and the instance ids
OLD_MIG_LIST = f"GPU 0: A100-SXM4-40GB (UUID: {U[0]})\n  MIG 3g.20gb Device 0: (UUID: MIG-{U[0]}/1/0)\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("No devices were found\n", ()),
        (H200_LIST, (SmiGpu(0, "NVIDIA H200", U[0]),)),
        (H100_LIST, tuple(SmiGpu(i, "NVIDIA H100 80GB HBM3", U[i]) for i in range(8))),
        (H100_MIG_LIST, (SmiGpu(0, "NVIDIA H100 80GB HBM3", U[0], (MigDevice("3g.40gb", 0, M[0]),
                                                                MigDevice("2g.20gb", 1, M[1]),
                                                                MigDevice("1g.10gb", 2, M[2]))),
                         SmiGpu(1, "NVIDIA H100 80GB HBM3", U[1]))),
        (OLD_MIG_LIST, (SmiGpu(0, "A100-SXM4-40GB", U[0], (MigDevice("3g.20gb", 0, f"MIG-{U[0]}/1/0"),)),)),
    ],
    ids=["empty", "no-devices", "H200", "8xH100", "H100-MIG", "MIG-old-driver"],
)
def test_parse_nvidia_smi_list(text, expected):
    assert parse_list(text) == expected


DGX_H100_TOPO = "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\t" \
    "GPU NUMA ID\x1b[0m\n" + "".join(
        f"GPU{i}\t" + "\t".join(" X " if j == i else "NV18" for j in range(8))
        + ("\tPXB\tSYS\t0-55,112-167\t0\t\tN/A\n" if i < 4 else "\tSYS\tPXB\t56-111,168-223\t1\t\tN/A\n")
        for i in range(8)
    ) + "NIC0\tPXB\tPXB\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\t X \tSYS\t\t\t\t\nNIC1\tSYS\n\nLegend:\n\n  X    = Self\n" \
    "  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
ONE_GPU_VM_TOPO = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
NO_NUMA_TOPO = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPIX\tN/A\tN/A\t\tN/A\n" \
    "GPU1\tPIX\t X \tN/A\tN/A\t\tN/A\n"


def test_parse_topo_of_a_dgx_h100():
    rows = parse_topo(DGX_H100_TOPO)
    assert sorted(rows) == list(range(8))
    assert (rows[0].cpu_affinity, rows[0].numa_affinity) == ("0-55,112-167", "0")
    assert (rows[5].cpu_affinity, rows[5].numa_affinity) == ("56-111,168-223", "1")
    assert rows[5].links["GPU5"] == "X" and rows[5].links["GPU0"] == "NV18" and rows[5].links["NIC1"] == "PXB"


def test_parse_topo_of_one_gpu_and_of_a_vm_without_numa():
    [(index, row)] = parse_topo(ONE_GPU_VM_TOPO).items()
    assert (index, row.cpu_affinity, row.numa_affinity, row.links) == (0, "0-15", "0", {"GPU0": "X"})
    rows = parse_topo(NO_NUMA_TOPO)
    assert [(r.cpu_affinity, r.numa_affinity) for r in rows.values()] == [(None, None), (None, None)]
    assert parse_topo("") == {}


DGX_BUSES = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
             "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]
QUERY = "".join(f"{i}, 0000{bus.upper()}, {U[i]}, NVIDIA H100 80GB HBM3, 81559, 580.159.04\n"
                for i, bus in enumerate(DGX_BUSES))


def information(model: str, uuid: str, bus: str, minor: int) -> str:
    """The driver's information file, spaced as the driver writes it."""
    return (f"Model: \t\t {model}\nIRQ:   \t\t {160 + minor}\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.99.00.01\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def dgx_tree(tmp_path, *, numa=True, uuids=True):
    files = {}
    for i, bus in enumerate(DGX_BUSES):
        uuid = U[i] if uuids else "GPU-????????-????-????-????-????????????"
        files[f"proc/driver/nvidia/gpus/{bus}/information"] = information("NVIDIA H100 80GB HBM3", uuid, bus, i)
        files[f"sys/bus/pci/devices/{bus}/numa_node"] = f"{i // 4 if numa else -1}\n"
        cpus = ("0-55,112-167" if i < 4 else "56-111,168-223") if numa else "0-223"
        files[f"sys/bus/pci/devices/{bus}/local_cpulist"] = cpus + "\n"
    files["proc/driver/nvidia/version"] = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"
    return make_tree(tmp_path, files)


def test_xrun_numbers_the_gpus_of_proc_as_nvidia_smi_does(tmp_path):
    root = dgx_tree(tmp_path)
    queried = parse_query_gpu(QUERY)
    assert queried[4] == SmiQueryGpu(4, "00000000:9A:00.0", U[4], "NVIDIA H100 80GB HBM3", 81559, "580.159.04")
    proc = read_proc_gpus(root)
    assert [p.bus_id for p in proc] == [q.sysfs_bus_id for q in queried] == DGX_BUSES
    assert proc[4] == ProcGpu("0000:9a:00.0", "NVIDIA H100 80GB HBM3", U[4], 1, "56-111,168-223")
    assert detect_devices(root) == Devices(Vendor.NVIDIA, 8)
    assert gpu_numa_nodes(root) == {i: i // 4 for i in range(8)}


def test_a_vm_without_numa_and_a_driver_that_hides_the_uuids(tmp_path):
    root = dgx_tree(tmp_path, numa=False, uuids=False)
    assert [p.uuid for p in read_proc_gpus(root)] == [None] * 8
    assert gpu_numa_nodes(root) == {}  # -1: no node known, so no GPU-near binding
    assert detect_devices(root) == Devices(Vendor.NVIDIA, 8)


def fake_smi(tmp_path, listing: str, query: str):
    """An nvidia-smi that answers -L and --query-gpu=name,memory.total,driver_version like the real one."""
    (tmp_path / "list.txt").write_text(listing)
    (tmp_path / "query.txt").write_text(query)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in\n  -L) exec /bin/cat {tmp_path}/list.txt;;\n"
                   f"  --query-gpu=name,memory.total,driver_version) exec /bin/cat {tmp_path}/query.txt;;\n  *) exit 6;;\nesac\n")
    smi.chmod(0o755)
    return str(tmp_path)


@pytest.mark.parametrize(("listing", "count"), [(H100_LIST, 8), (H200_LIST, 1), (H100_MIG_LIST, 2), ("", 0)],
                         ids=["8xH100", "H200", "H100-MIG", "none"])
def test_without_proc_xrun_counts_the_gpus_nvidia_smi_lists_not_their_mig_devices(tmp_path, monkeypatch, listing,
                                                                                  count):
    monkeypatch.setattr(local, "detect_devices", lambda: None)  # as on a node whose /proc hides the driver
    monkeypatch.setenv("PATH", fake_smi(tmp_path, listing, ""))
    assert local.count_accelerators() == count


def test_gpu_summary_groups_identical_cards():
    eight = [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "580.159.04"}] * 8
    assert check.gpu_summary(eight) == "8x NVIDIA H100 80GB HBM3 81559 MiB, driver 580.159.04"
    mixed = [{"name": "NVIDIA H200", "memory_mib": 143771, "driver": "580.159.03"}, eight[0]]
    assert check.gpu_summary(mixed) == ("1x NVIDIA H200 143771 MiB, driver 580.159.03; "
                                        "1x NVIDIA H100 80GB HBM3 81559 MiB, driver 580.159.04")
    assert check.gpu_summary([]) == check.gpu_summary(None) == check.gpu_summary("junk") == "-"


@pytest.mark.slow
def test_xrun_check_reports_each_gpu_name_memory_and_driver(tmp_path):
    query = "NVIDIA H100 80GB HBM3, 81559, 580.159.04\n" * 8
    path = fake_smi(tmp_path, H100_LIST, query)
    env = {"PATH": f"{path}:/usr/bin:/bin", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-m", "xrun", "check"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    assert "gpus" in header.split()
    assert "8/8" in row and "8x NVIDIA H100 80GB HBM3 81559 MiB, driver 580.159.04" in row
