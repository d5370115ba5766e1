#!/usr/bin/env bash
# One prepared command for a CUDA machine: versions, the CUDA correctness tests, the GPU benchmark,
# and timed train.py jobs (training images/s and the projected time of the 400-epoch recipe).
#   bash scripts/gpu_check.sh            (uses python3; set PYTHON=... to choose another)
# Each stage prints its own header; a failing stage does not stop the next ones (exit codes are
# recorded and returned at the end). Logs, bench_gpu.json, the run dirs and train_throughput.json
# go to $OUT when it is set.
# Budget: 8 minutes on an H200 in all (GPU_CHECK_BUDGET=480 s), Triton and torch.compile compilation
# included: the tests time out at 240 s, the benchmark at 330 s or earlier so that the training stage
# keeps 150 s, and the training jobs run in order of importance until the budget is spent (a job that
# no longer fits is reported as not run). On an H200 it ran 494 s with GPU_CHECK_BUDGET=500 (docs/gpu.md).
# Knobs: GPU_CHECK_STAGES="1 2 3 4" (the stages to run), GPU_CHECK_EPOCHS=2 (per training job; the
# last epoch is the one reported, the first is warm-up), GPU_CHECK_JOBS="adder_device_graph ..." (the training jobs:
# layer_data_mode with data device|loader and mode off|graph|compile), GPU_CHECK_TINY=1 (training jobs on a tiny
# FakeData, with GPU_CHECK_DEVICE=cpu on a machine without a GPU: checks the commands, measures nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # scripts/ import addernet
PY=${PYTHON:-python3}
OUTDIR=${OUT:-}
[ -n "$OUTDIR" ] && mkdir -p "$OUTDIR"
log() { if [ -n "$OUTDIR" ]; then tee -a "$OUTDIR/$1"; else cat; fi; }
STAGES=" ${GPU_CHECK_STAGES:-1 2 3 4} "
BUDGET=${GPU_CHECK_BUDGET:-480}
TRAIN_RESERVE=150
run_stage() { [[ "$STAGES" == *" $1 "* ]]; }
T0=$(date +%s)
left() { echo $(( T0 + BUDGET - $(date +%s) )); }
TEST_RC=0 BENCH_RC=0 TRAIN_RC=0

if run_stage 1; then
echo "=== [1/4] environment ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi failed"
$PY - <<'PYEOF' 2>&1 | log env.txt
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuda available:", torch.cuda.is_available())
try:
    import triton; print("triton", triton.__version__)
except ImportError as e:
    print("triton missing:", e)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, "| SMs", p.multi_processor_count, "| capability", f"{p.major}.{p.minor}",
          "| memory GiB", round(p.total_memory / 2**30, 1))
from addernet.ops.kernels import triton as tk
print("addernet triton kernels available:", tk.available())
PYEOF
fi

if run_stage 2; then
echo "=== [2/4] CUDA correctness tests and this triton's sm_90 code check (pytest -m 'cuda or codegen'; timeout 240 s)"
timeout 240 $PY -m pytest -q -p no:cacheprovider -m "cuda or codegen" tests 2>&1 \
    | log pytest.txt || TEST_RC=${PIPESTATUS[0]}
echo "pytest exit code: $TEST_RC ($(( $(date +%s) - T0 )) s elapsed)"
fi

if run_stage 3; then
BENCH_T=$(left)
if run_stage 4; then BENCH_T=$(( BENCH_T - TRAIN_RESERVE )); fi
BENCH_T=$(( BENCH_T < 330 ? BENCH_T : 330 ))
echo "=== [3/4] benchmark: scripts/bench_gpu.py (timeout $BENCH_T s)"
if [ "$BENCH_T" -gt 30 ]; then
    timeout "$BENCH_T" $PY scripts/bench_gpu.py 2>&1 | log bench.txt || BENCH_RC=${PIPESTATUS[0]}
else
    echo "not run: budget spent"; BENCH_RC=124
fi
echo "bench exit code: $BENCH_RC ($(( $(date +%s) - T0 )) s elapsed)"
fi

if run_stage 4; then
# Training throughput: ResNet-20 AdderNet and its CNN twin, DataLoader vs data.on_device, eager vs CUDA graphs vs
# torch.compile.
EPOCHS=${GPU_CHECK_EPOCHS:-2}
RUNS=${OUTDIR:-$(mktemp -d)}/runs
mkdir -p "$RUNS"
if [ "${GPU_CHECK_TINY:-0}" = 1 ]; then
    DATA=(data=fake data.train_size=64 data.val_size=32 data.transform=cifar data.batch_size=32 data.num_workers=0
          data.pin_memory=false)
elif [ -d ../shared/cifar10-jpeg/train ]; then
    DATA=(data=cifar10_folder "data.root=$(cd ../shared/cifar10-jpeg && pwd)" data.num_workers=8)
else  # CIFAR-sized random images
    DATA=(data=fake data.train_size=50000 data.val_size=10000 data.transform=cifar data.batch_size=256
          data.num_workers=8 data.pin_memory=true)
fi
COMMON=(model=resnet20 "trainer.epochs=$EPOCHS" "trainer.device=${GPU_CHECK_DEVICE:-cuda}" trainer.progress=false
        trainer.log_every=1000000 trainer.hist_every=1000000 trainer.seed=0)
echo "=== [4/4] training throughput: train.py ${DATA[0]} ${DATA[1]}, $EPOCHS epoch(s) per job, $(left) s left"
DONE=()
# In order of importance: the adder and its twin on the device path, eager and with CUDA graphs (the comparison and
# the 400-epoch target), the adder with graphs from a DataLoader, then torch.compile (it compiles during the first
# epoch: the slowest jobs), then the DataLoader path of the others. Without a GPU (GPU_CHECK_DEVICE=cpu) the CUDA
# graph jobs are skipped: trainer.cuda_graph needs CUDA.
JOBS=${GPU_CHECK_JOBS:-"adder_device_off conv_device_off adder_device_graph conv_device_graph adder_loader_graph
      adder_device_compile conv_device_compile adder_loader_off conv_loader_off adder_loader_compile"}
for job in $JOBS; do
    IFS=_ read -r layer data mode <<< "$job"
    if [ "$mode" = graph ] && [ "${GPU_CHECK_DEVICE:-cuda}" = cpu ]; then continue; fi
    args=("model.layer=$layer" "data.on_device=$([ "$data" = device ] && echo true || echo false)"
          "trainer.compile=$([ "$mode" = compile ] && echo true || echo false)"
          "trainer.cuda_graph=$([ "$mode" = graph ] && echo true || echo false)")
    if [ "$layer" = conv ]; then args+=(adaptive_lr.enabled=false); fi
    budget=$(( $(left) - 15 ))  # 15 s kept for the summary
    budget=$(( budget < 180 ? budget : 180 ))
    if [ "$budget" -lt 30 ]; then echo "$job: not run (budget spent)" | log train.txt; continue; fi
    t=$(date +%s) rc=0
    timeout "$budget" $PY train.py "${DATA[@]}" "${COMMON[@]}" "${args[@]}" "hydra.run.dir=$RUNS/$job" \
        > "$RUNS/$job.log" 2>&1 || rc=$?
    echo "$job: ${args[*]} -> exit $rc in $(( $(date +%s) - t )) s" | log train.txt
    if [ "$rc" -ne 0 ]; then TRAIN_RC=$rc; tail -5 "$RUNS/$job.log" | log train.txt; fi
    if [ -s "$RUNS/$job/metrics.jsonl" ]; then DONE+=("$RUNS/$job"); fi
done
if [ "${#DONE[@]}" -gt 0 ]; then
    $PY scripts/summarize_runs.py "${DONE[@]}" --epochs 400 --images 50000 10000 ${OUTDIR:+--json "$OUTDIR/train_throughput.json"} 2>&1 \
        | log train.txt || TRAIN_RC=${PIPESTATUS[0]}
else
    echo "no training job finished an epoch" | log train.txt; TRAIN_RC=1
fi
echo "training exit code: $TRAIN_RC"
fi

echo "=== summary: tests rc=$TEST_RC bench rc=$BENCH_RC training rc=$TRAIN_RC, total $(( $(date +%s) - T0 )) s"
[ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ] && [ "$TRAIN_RC" -eq 0 ]
