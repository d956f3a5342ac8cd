#!/usr/bin/env bash
# fsdpctl node script: run two-node-user-20261121-120000-abcd, node 0 of 2 (node1)
# Profile two-node, fsdpctl 0.3.0. Running it again by hand repeats this node's part.
set -eo pipefail
umask 077  # the run directory and everything in it: this user's only
set -u
mkdir -p "$HOME"/fsdpctl/runs/two-node-user-20261121-120000-abcd
cd "$HOME"/fsdpctl/runs/two-node-user-20261121-120000-abcd
export FSDPCTL_RUN_DIR="$PWD"
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1
export PYTHONPATH="$FSDPCTL_RUN_DIR"/pkg/fsdpctl/node/startup:"$FSDPCTL_RUN_DIR"/code:"$FSDPCTL_RUN_DIR"/pkg
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:'
export TORCH_FR_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export TORCH_FR_DUMP_TEMP_FILE="$FSDPCTL_RUN_DIR"/flight/on-timeout/rank_
export NCCL_SOCKET_IFNAME==eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_IB_DISABLE=1
export NCCL_NET=Socket
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export FSDPCTL_RUN_ID=two-node-user-20261121-120000-abcd
export FSDPCTL_ATTEMPT=1
export FSDPCTL_STOP_SIGNAL=SIGTERM
export FSDPCTL_TELEMETRY=1
export FSDPCTL_SECRET_NAMES=HF_TOKEN
export FSDPCTL_NODE_RANK=0
export FSDPCTL_HOST=node1  # how fsdpctl names this node (per-rank timings say it)
: "${HF_TOKEN?fsdpctl: the secret HF_TOKEN is not in this environment; fsdpctl hands it over when it starts the node}"
# Every GPU sampled beside the ranks (nothing on a node without nvidia-smi); a fault is said at once in this log.
"$HOME"/venv/bin/python -m fsdpctl.node.gpu_watch --out "$FSDPCTL_RUN_DIR/gpu/node0.jsonl" --every 5.0 --parent $$ --node 0 --host node1 </dev/null &
cd code
echo "fsdpctl: node 0 of 2 on $(hostname) in $PWD"
exec "$HOME"/venv/bin/python -m torch.distributed.run --nnodes 2 --nproc-per-node gpu --rdzv-id two-node-user-20261121-120000-abcd --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:23981 --rdzv-conf join_timeout=600 --local-addr 10.0.0.1 --max-restarts 0 --log-dir "$FSDPCTL_RUN_DIR"/logs/node0 --tee 3 train.py --config 'conf/a b.yaml' '$(id)'
