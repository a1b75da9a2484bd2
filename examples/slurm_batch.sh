#!/bin/bash
# xrun in a Slurm batch job:  sbatch examples/slurm_batch.sh [ARGS for the training script]
#
# The batch script runs once, on the allocation's first node. xrun sees SLURM_JOB_ID, reads the allocation
# (SLURM_JOB_NODELIST; slots from --gpus-per-node, else the tasks per node) and starts one node agent per node
# with srun, which starts the ranks: no hostfile, no --launcher. --include/--exclude, --log_dir,
# --bind_cores_to_rank work as anywhere else; one failing rank ends the job on every node with its exit code.
#
#SBATCH --job-name=xrun-example
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --output=slurm-%j.out

set -euo pipefail

PYTHON=${XRUN_PYTHON:-python3}                       # the environment that has xrun (and torch) installed
SCRIPT=${XRUN_SCRIPT:-examples/train_ddp.py}

# On hosts with several networks, name the one the ranks should use (no interface is hard-coded):
#   export GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0      # travel to every rank (GLOO_*/NCCL_* prefixes)

exec "$PYTHON" -m xrun --log_dir "logs/$SLURM_JOB_ID" "$SCRIPT" "$@"
