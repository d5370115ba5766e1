#!/usr/bin/env bash
# The measured rows of docs/any_network.md: short schedules of the adder ViT and its twin on an MNIST subset,
# and of an adderized torchvision ResNet-18 and its twin on a CIFAR-10 JPEG subset. One thread per run.
#   scripts/anynet_evidence.sh OUT_DIR [SHARED_DIR]      (SHARED_DIR defaults to ../shared)
# Subsets: the first N_TRAIN / N_TEST MNIST images (truncated copies of the idx files) and the first
# PER_CLASS_TRAIN / PER_CLASS_TEST JPEGs of every class (sorted names, symlinked), written under OUT_DIR.
set -euo pipefail
OUT=${1:?usage: scripts/anynet_evidence.sh OUT_DIR [SHARED_DIR]}
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${2:-$REPO/../shared}
N_TRAIN=${N_TRAIN:-3000} N_TEST=${N_TEST:-1000} PER_CLASS_TRAIN=${PER_CLASS_TRAIN:-200} PER_CLASS_TEST=${PER_CLASS_TEST:-100}
EPOCHS=${EPOCHS:-3}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
python - "$SHARED" "$OUT" "$N_TRAIN" "$N_TEST" "$PER_CLASS_TRAIN" "$PER_CLASS_TEST" <<'PY'
import os, sys
shared, out, n_train, n_test, per_train, per_test = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
raw_in, raw_out = os.path.join(shared, "mnist/MNIST/raw"), os.path.join(out, "mnist/MNIST/raw")
os.makedirs(raw_out, exist_ok=True)
for prefix, n in (("train", n_train), ("t10k", n_test)):
    for kind, header, item in (("images-idx3", 16, 784), ("labels-idx1", 8, 1)):
        data = open(os.path.join(raw_in, f"{prefix}-{kind}-ubyte"), "rb").read()
        head = bytearray(data[:header]); head[4:8] = n.to_bytes(4, "big")
        open(os.path.join(raw_out, f"{prefix}-{kind}-ubyte"), "wb").write(bytes(head) + data[header:header + n * item])
for split, n in (("train", per_train), ("test", per_test)):
    src = os.path.join(shared, "cifar10-jpeg", split)
    for cls in sorted(os.listdir(src)):
        dst = os.path.join(out, "cifar10", split, cls)
        os.makedirs(dst, exist_ok=True)
        for name in sorted(os.listdir(os.path.join(src, cls)))[:n]:
            if not os.path.exists(os.path.join(dst, name)):
                os.symlink(os.path.join(os.path.abspath(src), cls, name), os.path.join(dst, name))
PY
COMMON="trainer.epochs=$EPOCHS trainer.device=cpu trainer.progress=false data.num_workers=0 data.pin_memory=false"
run() {  # run NAME ARGS...: train, then evaluate best.pt
    local name=$1; shift
    python "$REPO/train.py" "$@" $COMMON hydra.run.dir="$OUT/runs/$name" > "$OUT/$name.train.log" 2>&1
    python "$REPO/test.py" checkpoint="$OUT/runs/$name/checkpoints/best.pt" trainer.device=cpu \
        data.num_workers=0 data.pin_memory=false > "$OUT/$name.test.log" 2>&1
    echo "$name: $(tail -n 1 "$OUT/$name.test.log")"
}
VIT="model=vit data=mnist data.root=$OUT/mnist data.download=false data.batch_size=64 optim=adamw"
R18="model=torchvision model.arch=resnet18 data=cifar10_folder data.root=$OUT/cifar10 data.batch_size=64"
run vit_adder $VIT model.layer=adder
run vit_conv $VIT model.layer=conv adaptive_lr.enabled=false
run resnet18_adder $R18 model.layer=adder
run resnet18_conv $R18 model.layer=conv adaptive_lr.enabled=false
