"""The variables an engine (mpirun, mpiexec, srun) gives the node agent it starts, which ranks must not inherit.

The agent is one engine process per node; its ranks are not. A rank that inherited ``OMPI_COMM_WORLD_RANK``,
``PMI_FD`` or ``SLURM_STEP_ID`` would believe it is that engine process: calling ``MPI_Init`` (mpi4py, Horovod,
DeepSpeed's MPI discovery) then aborts or hangs, and tools that read ``SLURM_PROCID``/``SLURM_NTASKS`` as the
global rank get the node's index instead. So the agent drops them once it has read its node rank; the job's
own settings (``OMPI_MCA_*`` given with ``--export`` or ``.xrun_env``) still reach the ranks through the spec.

Kept: everything describing the job or allocation (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``, ...).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import MutableMapping

IDENTITY_PREFIXES = (
    "OMPI_",  # OpenMPI: OMPI_COMM_WORLD_*, OMPI_MCA_orte_* (the daemon's URI), OMPI_FILE_LOCATION, ...
    "PMIX_",  # PMIx clients: PMIX_RANK, PMIX_NAMESPACE, PMIX_SERVER_URI*
    "PMI_",  # hydra / Slurm PMI-1/2: PMI_RANK, PMI_SIZE, PMI_FD, PMI_PORT
    "HYDI_",  # hydra's control fd
    "MPI_LOCAL",  # hydra: MPI_LOCALRANKID, MPI_LOCALNRANKS
    "MV2_COMM_WORLD_",  # MVAPICH's mpirun_rsh
    "SLURM_STEP",  # srun: SLURM_STEP_ID, SLURM_STEPID, SLURM_STEP_NODELIST, SLURM_STEP_NUM_TASKS, ...
)
IDENTITY_NAMES = frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID", "SLURM_GTIDS", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_CPU_BIND", "SLURM_CPU_BIND_LIST", "SLURM_CPU_BIND_TYPE", "SLURM_CPU_BIND_VERBOSE",
    "SLURM_DISTRIBUTION", "SLURM_UMASK", "SLURM_PRIO_PROCESS",
})


def restore_home(environ: MutableMapping[str, str]) -> None:
    """``HOME`` from the password database where the engine gave none: srun runs its tasks in its own
    environment, and xrun starts srun without the head's ``HOME`` (xrun.runner.backends.slurm)."""
    if "HOME" not in environ:
        try:
            environ["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:  # a uid without an entry (a container's): leave it unset, as the engine did
            pass


def is_identity(name: str) -> bool:
    return name in IDENTITY_NAMES or name.startswith(IDENTITY_PREFIXES)


def drop_engine_identity(environ: MutableMapping[str, str]) -> list[str]:
    """Remove the engine's per-process variables (in place; on ``os.environ`` it unsets them); returns them."""
    names = sorted(name for name in environ if is_identity(name))
    for name in names:
        del environ[name]
    return names
