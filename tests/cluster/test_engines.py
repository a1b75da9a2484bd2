"""The engines themselves work across the namespace nodes (what the MPI and Slurm backends stand on)."""

from __future__ import annotations

import shutil

import pytest

from .slurm import HYDRA_ARGS, OPENMPI_ARGS, slurm  # noqa: F401 - fixture

ECHO = ["sh", "-c", 'echo "$(hostname) $0"']


def _lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.strip())


def test_srun_runs_one_task_per_node_in_listed_order(slurm):  # noqa: F811
    # --distribution=arbitrary: task i goes to the i-th listed host, so SLURM_PROCID follows our node order
    # (SLURM_NODEID follows Slurm's own sorted order instead).
    proc = slurm.run([
        "srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--distribution=arbitrary",
        "--nodelist=node3,node1,node2", "sh", "-c", 'echo "$(hostname) $SLURM_PROCID $SLURM_NODEID"',
    ])
    assert _lines(proc.stdout) == ["node1 1 0", "node2 2 1", "node3 0 2"]


def test_salloc_exports_the_allocation(slurm):  # noqa: F811
    proc = slurm.run([
        "salloc", "--nodes=3", "--ntasks-per-node=2", "--gpus-per-node=2", "sh", "-c",
        'echo "$SLURM_JOB_NODELIST|$SLURM_TASKS_PER_NODE|$SLURM_GPUS_PER_NODE"',
    ])
    assert proc.stdout.strip() == "node[1-3]|2(x3)|2"


@pytest.mark.skipif(shutil.which("mpirun.openmpi") is None, reason="OpenMPI not installed")
def test_openmpi_runs_one_process_per_node(cluster):
    proc = cluster_run([
        "mpirun.openmpi", *OPENMPI_ARGS, "--host", "node3,node1,node2", "--map-by", "ppr:1:node", "-np", "3",
        "sh", "-c", 'echo "$(hostname) $OMPI_COMM_WORLD_RANK"',
    ])
    assert _lines(proc.stdout) == ["node1 1", "node2 2", "node3 0"]


@pytest.mark.skipif(shutil.which("mpiexec.hydra") is None, reason="MPICH not installed")
def test_hydra_runs_one_process_per_node(cluster):
    proc = cluster_run([
        "mpiexec.hydra", *HYDRA_ARGS, "-hosts", "node3,node1,node2", "-ppn", "1", "-n", "3",
        "sh", "-c", 'echo "$(hostname) $PMI_RANK"',
    ])
    assert _lines(proc.stdout) == ["node1 1", "node2 2", "node3 0"]


def cluster_run(argv):
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc
