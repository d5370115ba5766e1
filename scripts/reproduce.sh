#!/usr/bin/env bash
# Reproduce one row of the paper's tables: train with its preset, then evaluate the run's best checkpoint.
#
#   scripts/reproduce.sh EXPERIMENT [hydra overrides...]    e.g. scripts/reproduce.sh cifar10_resnet20_adder data.root=/data
#   scripts/reproduce.sh --list                             the presets (configs/experiment/) with their paper numbers
#   scripts/reproduce.sh cifar10 [--data-root DIR] [...]    the CIFAR-10 ResNet-20 row from the official checkpoint: float,
#                                                           8/6/5/4 bits and ONNX with 95% intervals, CSV + Markdown
#                                                           (python -m addernet.tools.reproduce; --help for its options)
#
# RUN_DIR (default outputs/reproduce/EXPERIMENT) holds the run; re-running resumes it. NPROC=N trains with N
# processes through scripts/dist_train.sh (torchrun). PYTHON (default python). The test result (last line,
# JSON) is also written to $RUN_DIR/test_results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 EXPERIMENT [overrides...]  or  $0 --list"
if [[ "${1:-}" == "--list" ]]; then
  for f in configs/experiment/*.yaml; do
    printf '%-28s %s\n' "$(basename "$f" .yaml)" "$(sed -n '2s/^# *//p' "$f")"
  done
  exit 0
fi
if [[ "${1:-}" == "cifar10" ]]; then
  exec "${PYTHON:-python}" -m addernet.tools.reproduce "$@"
fi
EXP=${1:-}
if [[ -z "$EXP" || "$EXP" == -* ]]; then echo "$usage" >&2; exit 2; fi
if [[ ! -f "configs/experiment/$EXP.yaml" ]]; then
  echo "reproduce.sh: error: no preset configs/experiment/$EXP.yaml; see $0 --list" >&2; exit 2
fi
shift
RUN_DIR=${RUN_DIR:-outputs/reproduce/$EXP}
if [[ -n "${NPROC:-}" ]]; then
  RUN_DIR="$RUN_DIR" scripts/dist_train.sh "$NPROC" "experiment=$EXP" "$@"
else
  "${PYTHON:-python}" train.py "experiment=$EXP" "hydra.run.dir=$RUN_DIR" "$@"
fi
"${PYTHON:-python}" test.py "checkpoint=$RUN_DIR/checkpoints/best.pt" "results_file=$RUN_DIR/test_results.json"
