"""``--launcher slurm``: ``srun --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=H1,H2,..
--distribution=arbitrary --kill-on-bad-exit=1 --cpu-bind=none --export=ALL --job-name=RUN_ID [--exclusive]
[--launcher_args] PYTHON -u -m xrun.launch --connect=... --node_rank_from=SLURM_PROCID --token=env:XRUN_TOKEN``.

* ``--distribution=arbitrary`` places task i on the i-th host of ``--nodelist``, so ``SLURM_PROCID`` is the
  node rank in xrun's order (``SLURM_NODEID`` follows Slurm's own sorted order, not ours).
* ``--kill-on-bad-exit=1``: a node agent that exits non-zero ends the step everywhere (after xrun's own
  channel-driven stop); ``--cpu-bind=none`` leaves CPU binding to the agent (``--bind_cores_to_rank``).
* ``--export=ALL``: srun's environment, the token included, reaches the agents by name; the job's variables
  also travel in the node spec, byte-exact. Since srun hands on all of its environment, and the agents'
  ranks inherit theirs, srun is started without the names that never travel (``envpass.is_blocked``:
  ``HOME``, ``HOSTNAME``, ``PWD``, ``SSH_*``, ``BASH_FUNC_*``, ...), as every other backend keeps them from the
  ranks (ssh and pdsh: the remote login's own; MPI: only ``XRUN_TOKEN``, by name); ``--dry-run`` shows them as
  ``env -u NAME``. The agent sets ``HOME`` from the password database, as a login would, and removes the
  token from its environment before any rank starts.
* Inside an allocation (``SLURM_JOB_ID`` set: ``salloc``, ``sbatch``) this is a job step on the allocation's
  nodes and gets their resources. Outside one, srun makes its own allocation: ``--exclusive`` asks for whole
  nodes, since every rank of the node shares the agent's task; add ``--partition``, ``--time``,
  ``--gpus-per-node`` ... with ``--launcher_args``.
"""

from __future__ import annotations

from xrun.runner.backends.engine import EngineBackend, host_list
from xrun.runner.envpass import is_blocked
from xrun.runner.hosts.slurm_alloc import in_allocation
from xrun.runner.plan import Plan


class SlurmBackend(EngineBackend):
    name = "slurm"
    programs = ("srun",)
    rank_variables = ("SLURM_PROCID",)
    install_hint = "run xrun on a Slurm login node (srun on PATH), or use --launcher ssh/pdsh"

    def withheld(self) -> tuple[str, ...]:
        # --export=ALL would give every agent, and so every rank, the head's session: never-travel names stay
        return tuple(sorted(name for name in self._environ if is_blocked(name)))

    def engine_args(self, plan: Plan) -> tuple[str, ...]:
        nodes = str(len(plan.nodes))
        own_allocation = () if in_allocation(self._environ) else ("--exclusive",)
        return (
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            f"--nodelist={host_list(plan)}",
            "--distribution=arbitrary",
            "--kill-on-bad-exit=1",
            "--cpu-bind=none",
            "--export=ALL",
            f"--job-name={plan.rendezvous.run_id}",
            *own_allocation,
        )
