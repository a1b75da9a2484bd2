"""``--launcher impi``: Intel MPI's hydra, the same command as ``mpich`` (``-hosts``, ``-ppn 1``, ``-genvlist``).

Intel MPI ships ``mpiexec.hydra`` (also in the ``impi-rt`` wheel on PyPI: its ``bin`` directory). Put the Intel
one first on PATH (``source <oneapi>/setvars.sh``, or the wheel's environment's ``bin``): the name is shared
with MPICH's. ``--launcher_args '-iface eth1'`` picks the network; Intel's ``I_MPI_*`` variables reach the
agents when exported by name: ``--launcher_args '-genvlist XRUN_TOKEN,I_MPI_DEBUG'`` (a later ``-genvlist``
replaces ours, so keep ``XRUN_TOKEN`` in it).
"""

from __future__ import annotations

from xrun.runner.backends.mpich import HydraBackend


class IntelMpiBackend(HydraBackend):
    name = "impi"
    programs = ("mpiexec.hydra", "mpiexec", "mpirun")
    rank_variables = ("PMI_RANK", "PMIX_RANK")
    install_hint = "source Intel oneAPI's setvars.sh, or pip install impi-rt and put its bin directory on PATH"
