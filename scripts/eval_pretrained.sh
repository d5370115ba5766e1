#!/usr/bin/env bash
# Evaluate the official pretrained AdderNets (github.com/huawei-noah/AdderNet) with test.py.
#
#   scripts/eval_pretrained.sh cifar10 [overrides...]           ResNet-20 on the CIFAR-10 test set (10,000 images;
#                                                              torchvision downloads it into data/ unless present)
#   scripts/eval_pretrained.sh sample [overrides...]            ResNet-20 on the 1,000-JPEG CIFAR-10 sample
#   scripts/eval_pretrained.sh imagenet VAL_DIR [overrides...]  ResNet-50 on ImageNet val (ImageFolder <wnid>/*.JPEG)
#
# Checkpoints: R20 (default ../shared/official/ResNet20-AdderNet.pth), R50 (default ResNet50-AdderNet.pth);
# both come from the official repository's README (Google Drive folder). SAMPLE (default
# ../shared/cifar10-test-sample). PYTHON (default python). Overrides go to test.py, e.g. trainer.device=cpu
# data.batch_size=500 results_file=out.json. The last line printed is the JSON result.
set -euo pipefail
cd "$(dirname "$0")/.."
R20=${R20:-../shared/official/ResNet20-AdderNet.pth}
R50=${R50:-ResNet50-AdderNet.pth}
SAMPLE=${SAMPLE:-../shared/cifar10-test-sample}
PY=${PYTHON:-python}
usage="usage: $0 cifar10|sample [overrides...]  or  $0 imagenet VAL_DIR [overrides...]"

case "${1:-}" in
  cifar10)
    shift
    exec "$PY" test.py "checkpoint=$R20" model=resnet20 data=cifar10 "$@" ;;
  sample)
    shift
    exec "$PY" test.py "checkpoint=$R20" model=resnet20 data=cifar10_folder "data.val_dir=$SAMPLE" "$@" ;;
  imagenet)
    if [[ $# -lt 2 ]]; then echo "$usage" >&2; exit 2; fi
    VAL=$2; shift 2
    exec "$PY" test.py "checkpoint=$R50" model=resnet50 data=imagenet "data.val_dir=$VAL" "$@" ;;
  *)
    echo "$usage" >&2; exit 2 ;;
esac
