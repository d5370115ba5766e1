#!/usr/bin/env bash
# AdderNet vgg_small on cifar10: paper Table 3 (CIFAR-10) reports 93.72%.
# Trains with the preset configs/experiment/cifar10_vgg_small_adder.yaml, then evaluates the run's best checkpoint.
#
#   scripts/reproduce/cifar10_vgg_small_adder.sh [hydra overrides...]      e.g. data.root=/path/to/datasets
#
# RUN_DIR (default outputs/reproduce/cifar10_vgg_small_adder) holds the run; re-running resumes it. NPROC=N trains
# with N processes through scripts/dist_train.sh (torchrun). PYTHON (default python). The test result
# (last line, JSON) is also written to $RUN_DIR/test_results.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
EXP=cifar10_vgg_small_adder
RUN_DIR=${RUN_DIR:-outputs/reproduce/$EXP}
if [[ -n "${NPROC:-}" ]]; then
  RUN_DIR="$RUN_DIR" scripts/dist_train.sh "$NPROC" experiment=$EXP "$@"
else
  "${PYTHON:-python}" train.py experiment=$EXP "hydra.run.dir=$RUN_DIR" "$@"
fi
"${PYTHON:-python}" test.py "checkpoint=$RUN_DIR/checkpoints/best.pt" "results_file=$RUN_DIR/test_results.json"
