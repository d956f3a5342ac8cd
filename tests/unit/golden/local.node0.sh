#!/usr/bin/env bash
# fsdpctl node script: run local-20261121-120000-abcd, node 0 of 1 (localhost)
# Profile local, fsdpctl 0.3.0. Running it again by hand repeats this node's part.
set -eo pipefail
umask 077  # the run directory and everything in it: this user's only
set -u
mkdir -p /home/me/project/runs/local-20261121-120000-abcd
cd /home/me/project/runs/local-20261121-120000-abcd
export FSDPCTL_RUN_DIR="$PWD"
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1
export PYTHONPATH="$FSDPCTL_RUN_DIR"/pkg/fsdpctl/node/startup:"$FSDPCTL_RUN_DIR"/pkg
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'
export TORCH_FR_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$FSDPCTL_RUN_DIR"/flight/on-timeout/rank_
export NCCL_SOCKET_IFNAME==lo
export GLOO_SOCKET_IFNAME=lo
export NCCL_IB_DISABLE=1
export NCCL_NET=Socket
export FSDPCTL_RUN_ID=local-20261121-120000-abcd
export FSDPCTL_ATTEMPT=1
export FSDPCTL_STOP_SIGNAL=SIGTERM
export FSDPCTL_NODE_RANK=0
export FSDPCTL_HOST=localhost  # how fsdpctl names this node (per-rank timings say it)
# Every GPU sampled beside the ranks (nothing on a node without nvidia-smi); a fault is said at once in this log.
/opt/venv/bin/python -m fsdpctl.node.gpu_watch --out "$FSDPCTL_RUN_DIR/gpu/node0.jsonl" --every 5.0 --parent $$ --node 0 --host localhost </dev/null &
echo "fsdpctl: node 0 of 1 on $(hostname) in $PWD"
exec /opt/venv/bin/python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --rdzv-id local-20261121-120000-abcd --standalone --max-restarts 0 --log-dir "$FSDPCTL_RUN_DIR"/logs/node0 --tee 3 -m fsdpctl.workload.train --device cpu --cache-dir ../../cache --preset tiny --steps 60 --batch-size 8 --seq-len 128 --eval-interval 20 --log-interval 5 --run-dir .
