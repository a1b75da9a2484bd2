"""GPU-near binding: with --bind_cores_to_rank each rank's CPUs lie in its GPU's local CPU list (sysfs of the GPU's
PCI device), compared with ``nvidia-smi topo -m``."""

from __future__ import annotations

import os

from tests.gpu.runs import explain, job, records, run, xrun_argv
from tests.gpu.smi import parse_list, parse_topo, read_proc_gpus, smi
from xrun.common.ranks.binding import parse_cpu_list
from xrun.common.ranks.devices import gpu_numa_nodes


def test_bound_ranks_sit_near_their_gpu(tmp_path, figures):
    count = len(parse_list(smi("-L")))
    topo = parse_topo(smi("topo", "-m"))
    proc = read_proc_gpus()
    figures.put("topo -m", {i: (t.cpu_affinity, t.numa_affinity) for i, t in topo.items()})
    figures.put("sysfs", [(p.bus_id, p.numa_node, p.local_cpulist) for p in proc])
    figures.put("xrun gpu_numa_nodes", gpu_numa_nodes())
    figures.put("agent affinity", sorted(os.sched_getaffinity(0)))
    done = run(xrun_argv("--bind_cores_to_rank", "--num_gpus", str(count), script=job("cuda_rank.py")),
               cwd=str(tmp_path))
    assert done.returncode == 0, explain(done)
    ranks = records(done.stdout)
    figures.put("ranks", [{k: r[k] for k in ("rank", "cpus_allowed", "mems_allowed", "omp_threads", "numactl")}
                          for r in ranks])
    figures.put("xrun notes", [line for line in done.stderr.splitlines() if "xrun" in line][:6])
    assert len(ranks) == count
    seen: set[int] = set()
    for r in ranks:
        cpus = set(r["cpus"])
        assert cpus and not cpus & seen
        assert "OMP_NUM_THREADS" in os.environ or r["omp_threads"] == str(len(cpus))
        seen |= cpus
        near = proc[r["local_rank"]] if len(proc) == count else None
        row = topo.get(r["local_rank"])
        if near is None or near.numa_node is None:
            figures.note(f"rank {r['rank']}: the kernel knows no NUMA node for its GPU: the even split, not "
                         "GPU-near")
            continue
        assert cpus <= parse_cpu_list(near.local_cpulist or "", flag="local_cpulist"), r
        if row is not None and row.cpu_affinity is not None:
            assert cpus <= parse_cpu_list(row.cpu_affinity, flag="topo -m"), r
