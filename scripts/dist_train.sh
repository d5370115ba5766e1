#!/usr/bin/env bash
# Multi-GPU / multi-node training through torchrun: scripts/dist_train.sh NPROC_PER_NODE [hydra overrides...]
#
#   single node, 8 GPUs:  scripts/dist_train.sh 8 experiment=imagenet_resnet18_adder data.root=/data/imagenet
#   two nodes (run on each node, same RUN_DIR on a shared filesystem, NODE_RANK 0 and 1):
#     NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 RUN_DIR=/shared/outputs/r18 \
#       scripts/dist_train.sh 8 experiment=imagenet_resnet18_adder data.root=/data/imagenet
#
# Run dir: every rank must write to one directory, but Hydra's default outputs/<date>/<time> is computed
# by each process from its own clock. This script pins it once per launch: RUN_DIR (default
# outputs/<date>/<time> taken here, once) is passed to every rank as hydra.run.dir=... . Multi-node jobs
# must set RUN_DIR themselves (each node runs this script with its own clock). train.py additionally makes
# all ranks use rank 0's dir, and only rank 0 writes into it. Re-running with the same RUN_DIR resumes.
# data.batch_size is the global batch (split across all processes). Environment: PYTHON (default python),
# NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), MASTER_PORT (29500), RUN_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 NPROC_PER_NODE [hydra overrides...]   (e.g. $0 8 experiment=cifar10_resnet20_adder)" >&2
  exit 2
fi
NPROC=$1; shift
NNODES=${NNODES:-1}
if [[ "$NNODES" -gt 1 && -z "${RUN_DIR:-}" ]]; then
  echo "$0: NNODES=$NNODES needs RUN_DIR=<one path on a filesystem shared by all nodes>, set identically on every node" >&2
  exit 2
fi
RUN_DIR=${RUN_DIR:-outputs/$(date +%Y-%m-%d/%H-%M-%S)}

if [[ "$NNODES" -gt 1 ]]; then
  LAUNCH=(--nnodes "$NNODES" --node_rank "${NODE_RANK:-0}" --master_addr "${MASTER_ADDR:-127.0.0.1}"
          --master_port "${MASTER_PORT:-29500}")
else
  LAUNCH=(--standalone --nnodes 1)
fi
echo "run dir: $RUN_DIR" >&2
exec "${PYTHON:-python}" -m torch.distributed.run "${LAUNCH[@]}" --nproc_per_node "$NPROC" \
  train.py "$@" "hydra.run.dir=$RUN_DIR"
