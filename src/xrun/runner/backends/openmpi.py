"""``--launcher openmpi``: ``mpirun -np N --host H1,H2,.. --map-by ppr:1:node --bind-to none -x XRUN_TOKEN
[--launcher_args] PYTHON -u -m xrun.launch --connect=... --node_rank_from=OMPI_COMM_WORLD_RANK --token=env:XRUN_TOKEN``.

* ``--host`` in node order with ``ppr:1:node`` puts exactly one agent on each host, and OpenMPI numbers them
  in that order, so ``OMPI_COMM_WORLD_RANK`` is the node rank (``PMIX_RANK`` under OpenMPI 5).
* ``--bind-to none``: OpenMPI binds each process to a core or socket by default; the agent's ranks would
  inherit that mask. Binding is the agent's (``--bind_cores_to_rank``).
* ``-x XRUN_TOKEN`` exports the token by name; OpenMPI forwards nothing else of our environment (all of it
  travels in the node spec).
* ``--network_interface NAME`` adds ``--mca btl_tcp_if_include NAME`` unless ``--launcher_args`` names
  btl_tcp_if_include already (``auto`` cannot: the head does not know each node's interface name in advance).
* Otherwise no interface is chosen for you: pass ``--launcher_args '--mca oob_tcp_if_include NET --mca
  btl_tcp_if_include NET'`` (a CIDR or an interface name) on hosts with several networks, and
  ``--allow-run-as-root`` (or ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``) as root.
"""

from __future__ import annotations

from xrun.runner.backends.engine import TOKEN_ENV, EngineBackend, host_list, interface_args
from xrun.runner.plan import Plan


class OpenMpiBackend(EngineBackend):
    name = "openmpi"
    # Debian/Ubuntu install OpenMPI's as mpirun.openmpi next to other MPIs' mpirun.
    programs = ("mpirun", "mpirun.openmpi")
    rank_variables = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")
    install_hint = "install OpenMPI (apt-get install openmpi-bin) or put its bin directory on PATH"

    def program(self) -> str:
        # Prefer the unambiguous name where it exists: plain mpirun may be MPICH's or Intel's.
        return "mpirun.openmpi" if self._which("mpirun.openmpi") is not None else "mpirun"

    def engine_args(self, plan: Plan) -> tuple[str, ...]:
        return (
            "-np", str(len(plan.nodes)),
            "--host", host_list(plan),
            "--map-by", "ppr:1:node",
            "--bind-to", "none",
            "-x", TOKEN_ENV,
        ) + interface_args(plan, ("--mca", "btl_tcp_if_include"), "btl_tcp_if_include")
