"""``--launcher mpich``: MPICH's hydra, ``mpiexec.hydra -hosts H1,H2,.. -ppn 1 -n N -genvlist XRUN_TOKEN
[--launcher_args] PYTHON -u -m xrun.launch --connect=... --node_rank_from=PMI_RANK --token=env:XRUN_TOKEN``.

* ``-hosts`` in node order with ``-ppn 1``: one agent per host, numbered in that order (``PMI_RANK``).
* ``-genvlist XRUN_TOKEN`` exports the token by name and, unlike hydra's default (every variable), nothing
  else: the agents start in the nodes' own environment, as over ssh, and the job's variables travel in the
  node spec, byte-exact.
* ``--network_interface NAME`` adds ``-iface NAME`` unless ``--launcher_args`` has an ``-iface`` already.
* Otherwise no interface is chosen for you: ``--launcher_args '-iface eth1'`` picks the one hydra's proxies use to reach
  mpiexec (needed where this machine's own hostname resolves to a loopback address); ``-launcher ssh`` /
  ``-launcher slurm`` choose the bootstrap.

Intel MPI and MVAPICH2 launch through hydra as well: ``impi.py`` and ``mvapich.py`` change only data.
"""

from __future__ import annotations

from xrun.runner.backends.engine import TOKEN_ENV, EngineBackend, host_list, interface_args
from xrun.runner.plan import Plan


class HydraBackend(EngineBackend):
    """Any hydra ``mpiexec``: MPICH, Intel MPI, MVAPICH2."""

    def engine_args(self, plan: Plan) -> tuple[str, ...]:
        return (
            "-hosts", host_list(plan),
            "-ppn", "1",
            "-n", str(len(plan.nodes)),
            "-genvlist", TOKEN_ENV,
        ) + interface_args(plan, ("-iface",), "-iface")


class MpichBackend(HydraBackend):
    name = "mpich"
    # Debian/Ubuntu: mpiexec.hydra is MPICH's; plain mpiexec may be OpenMPI's through the alternatives.
    programs = ("mpiexec.hydra", "mpiexec.mpich", "mpiexec")
    rank_variables = ("PMI_RANK", "PMIX_RANK")
    install_hint = "install MPICH (apt-get install mpich) or put its bin directory on PATH"
