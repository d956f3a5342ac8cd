#!/usr/bin/env bash
#SBATCH --job-name=fsdpctl-slurm-20261121-120000-abcd
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --partition=gpu
#SBATCH --time=02:00:00
#SBATCH --output=/home/me/fsdpctl/runs/slurm-20261121-120000-abcd/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --exclusive
# fsdpctl batch script: run slurm-20261121-120000-abcd on 2 nodes, profile slurm,
# fsdpctl 0.3.0. Submitted again with `sbatch`, it continues from its newest checkpoint.
set -eo pipefail
umask 077  # the run directory and everything in it: this user's only
set -u
export FSDPCTL_PYTHON="$HOME"/venv/bin/python
export FSDPCTL_RUN_DIR=/home/me/fsdpctl/runs/slurm-20261121-120000-abcd
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1
export PYTHONPATH="$FSDPCTL_RUN_DIR"/pkg/fsdpctl/node/startup:"$FSDPCTL_RUN_DIR"/pkg
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'
export TORCH_FR_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$FSDPCTL_RUN_DIR"/flight/on-timeout/rank_
export NCCL_SOCKET_IFNAME==eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_IB_DISABLE=1
export NCCL_NET=Socket
export FSDPCTL_RUN_ID=slurm-20261121-120000-abcd
export FSDPCTL_ATTEMPT=1
export FSDPCTL_STOP_SIGNAL=SIGTERM
mkdir -p "$FSDPCTL_RUN_DIR"
# The head node's address, as the other nodes reach it (a host name may resolve differently there).
# `sed -n 1p` rather than `head`: head exits early and pipefail would turn scontrol's SIGPIPE into a failure.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
FSDPCTL_HEAD_ADDR=$(scontrol show node "$head_node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | sed -n 1p)
export FSDPCTL_HEAD_ADDR="${FSDPCTL_HEAD_ADDR:-$head_node}"
echo "fsdpctl: job $SLURM_JOB_ID (Slurm start $((${SLURM_RESTART_COUNT:-0} + 1))) head $head_node ($FSDPCTL_HEAD_ADDR), nodes $SLURM_JOB_NODELIST"
# One torchrun per node; any task failing ends the whole step.
srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 bash -c 'cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && { echo "fsdpctl: node $SLURM_NODEID of 2 on $(hostname) in $PWD, Slurm start $((${SLURM_RESTART_COUNT:-0} + 1))${FSDPCTL_SLURM_STEP:+, step $FSDPCTL_SLURM_STEP}"; "$FSDPCTL_PYTHON" -m fsdpctl.node.gpu_watch --out "$FSDPCTL_RUN_DIR/gpu/node$SLURM_NODEID.jsonl" --every 5 --parent $$ --node "$SLURM_NODEID" --host "$(hostname)" </dev/null & exec "$FSDPCTL_PYTHON" -m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-id slurm-20261121-120000-abcd --rdzv-backend c10d --rdzv-endpoint "$FSDPCTL_HEAD_ADDR":23981 --rdzv-conf join_timeout=600 --max-restarts 0 --log-dir "$FSDPCTL_RUN_DIR"/logs/node"$SLURM_NODEID" --tee 3 -m fsdpctl.workload.train --device cuda --cache-dir ../../cache --preset gpt2-124m --fsdp 2 --steps 2000 --batch-size 16 --seq-len 1024 --mixed-precision bf16 --checkpoint-interval 200 --resume-if-present --run-dir .; } >> node"$SLURM_NODEID".log 2>&1'
