"""``--launcher mvapich``: MVAPICH2's ``mpirun``/``mpiexec`` (hydra), the same command as ``mpich``.

MVAPICH2 launches through hydra by default, so it takes ``-hosts``, ``-ppn 1`` and ``-genvlist``; its processes
see ``PMI_RANK`` (``MV2_COMM_WORLD_RANK`` under ``mpirun_rsh``). MVAPICH is not installable on the machines
xrun is tested on: this backend is covered by golden tests of its rendered command only.
"""

from __future__ import annotations

from xrun.runner.backends.mpich import HydraBackend


class MvapichBackend(HydraBackend):
    name = "mvapich"
    programs = ("mpirun", "mpiexec")
    rank_variables = ("MV2_COMM_WORLD_RANK", "PMI_RANK")
    install_hint = "load MVAPICH2 (module load mvapich2) so that its mpirun comes first on PATH"
