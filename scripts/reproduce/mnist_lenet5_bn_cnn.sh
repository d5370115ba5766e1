#!/usr/bin/env bash
# CNN lenet5_bn on mnist: paper Sec. 4.1 (MNIST) reports 99.4%.
# Trains with the preset configs/experiment/mnist_lenet5_bn_cnn.yaml, then evaluates the run's best checkpoint.
#
#   scripts/reproduce/mnist_lenet5_bn_cnn.sh [hydra overrides...]      e.g. data.root=/path/to/datasets
#
# RUN_DIR (default outputs/reproduce/mnist_lenet5_bn_cnn) holds the run; re-running resumes it. NPROC=N trains
# with N processes through scripts/dist_train.sh (torchrun). PYTHON (default python). The test result
# (last line, JSON) is also written to $RUN_DIR/test_results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
EXP=mnist_lenet5_bn_cnn
RUN_DIR=${RUN_DIR:-outputs/reproduce/$EXP}
if [[ -n "${NPROC:-}" ]]; then
  RUN_DIR="$RUN_DIR" scripts/dist_train.sh "$NPROC" experiment=$EXP "$@"
else
  "${PYTHON:-python}" train.py experiment=$EXP "hydra.run.dir=$RUN_DIR" "$@"
fi
"${PYTHON:-python}" test.py "checkpoint=$RUN_DIR/checkpoints/best.pt" "results_file=$RUN_DIR/test_results.json"
