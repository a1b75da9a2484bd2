"""Device counting without torch against nvidia-smi: count, indices (PCI bus order), UUIDs, MIG devices; asking for
more GPUs than the node has."""

from __future__ import annotations

from tests.gpu.runs import explain, job, run, xrun_argv
from tests.gpu.smi import QUERY_GPU, parse_list, parse_query_gpu, read_proc_gpus, smi
from xrun.common.ranks.devices import Devices, Vendor, detect_devices, gpu_numa_nodes
from xrun.runner.hosts.selection import Selection
from xrun.runner.hosts.this_machine import count_accelerators, local_pool


def test_device_counting_without_torch_matches_nvidia_smi(figures):
    listed = parse_list(smi("-L"))
    queried = parse_query_gpu(smi(QUERY_GPU, "--format=csv,noheader,nounits"))
    proc = read_proc_gpus()
    figures.put("nvidia-smi -L", [(g.index, g.name, g.uuid, [m.uuid for m in g.mig]) for g in listed])
    figures.put("nvidia-smi bus ids", [q.bus_id for q in queried])
    figures.put("/proc/driver/nvidia/gpus", [(p.bus_id, p.model, p.uuid, p.numa_node) for p in proc])
    figures.put("xrun detect_devices", repr(detect_devices()))
    figures.put("xrun count_accelerators", count_accelerators())
    figures.put("xrun local slots", local_pool({}, Selection()).pool)
    figures.put("xrun gpu_numa_nodes", gpu_numa_nodes())
    assert listed and [g.index for g in listed] == list(range(len(listed)))
    assert count_accelerators() == len(listed)
    assert local_pool({}, Selection()).pool == {"localhost": tuple(range(len(listed)))}
    if not proc:
        figures.note("no /proc/driver/nvidia/gpus here: xrun counted through nvidia-smi -L, and knows no GPU's "
                     "NUMA node (GPU-near binding falls back to the even split)")
        assert detect_devices() is None
    else:
        assert detect_devices() == Devices(Vendor.NVIDIA, len(listed))
        # xrun numbers GPUs in the PCI bus order of /proc; nvidia-smi's index must name the same device
        assert [p.bus_id for p in proc] == [q.sysfs_bus_id for q in queried]
        readable = [(p.uuid, g.uuid) for p, g in zip(proc, listed) if p.uuid is not None]
        figures.put("UUIDs readable in /proc", f"{len(readable)} of {len(proc)}")
        assert all(a.lower() == b.lower() for a, b in readable)
        assert gpu_numa_nodes() == {i: p.numa_node for i, p in enumerate(proc) if p.numa_node is not None}
    mig = [m.uuid for g in listed for m in g.mig]
    figures.put("MIG devices", len(mig))
    if mig:  # each MIG device named in CUDA_VISIBLE_DEVICES is one slot
        assert local_pool({"CUDA_VISIBLE_DEVICES": ",".join(mig)}, Selection()).pool == {
            "localhost": tuple(range(len(mig)))}
    else:
        figures.note("no MIG device on this card (MIG mode is left as the machine has it)")
    uuids = ",".join(g.uuid for g in listed)
    assert local_pool({"CUDA_VISIBLE_DEVICES": uuids}, Selection()).pool == {"localhost": tuple(range(len(listed)))}


def test_more_gpus_than_the_node_has_is_one_line_and_exit_2(tmp_path, figures):
    count = len(parse_list(smi("-L")))
    for flags in (["--num_gpus", str(count + 1)], ["-i", f"localhost:{count}"]):
        done = run(xrun_argv(*flags, script=job("cuda_rank.py")), cwd=str(tmp_path), timeout=60)
        figures.put(" ".join(flags), {"exit": done.returncode, "stderr": done.stderr.strip()})
        assert done.returncode == 2, explain(done)
        assert len(done.stderr.strip().splitlines()) == 1 and "XRUN_GPU" not in done.stdout, explain(done)
        assert flags[0] in done.stderr
