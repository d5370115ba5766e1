#!/usr/bin/env bash
# One prepared command for a CUDA machine: versions, the CUDA correctness tests, the GPU benchmark.
#   bash scripts/gpu_check.sh            (uses python3; set PYTHON=... to choose another)
# Each stage prints its own header; a failing test stage does not stop the benchmark (its exit
# code is recorded and returned at the end). Logs and bench_gpu.json go to $OUT when it is set.
# Budget: about 8 minutes on an H200 including Triton compilation (stage timeouts below).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PYTHON:-python3}
OUTDIR=${OUT:-}
[ -n "$OUTDIR" ] && mkdir -p "$OUTDIR"
log() { if [ -n "$OUTDIR" ]; then tee -a "$OUTDIR/$1"; else cat; fi; }
T0=$(date +%s)

echo "=== [1/3] environment ($(date -u +%FT%TZ))"
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

echo "=== [2/3] CUDA correctness tests and this triton's sm_90 code check (pytest -m 'cuda or codegen'; timeout 240 s)"
TEST_RC=0
timeout 240 $PY -m pytest -q -p no:cacheprovider -m "cuda or codegen" tests 2>&1 \
    | log pytest.txt || TEST_RC=${PIPESTATUS[0]}
echo "pytest exit code: $TEST_RC ($(( $(date +%s) - T0 )) s elapsed)"

echo "=== [3/3] benchmark: scripts/bench_gpu.py (timeout 330 s)"
BENCH_RC=0
timeout 330 $PY scripts/bench_gpu.py 2>&1 | log bench.txt || BENCH_RC=${PIPESTATUS[0]}
echo "bench exit code: $BENCH_RC"

echo "=== summary: tests rc=$TEST_RC bench rc=$BENCH_RC, total $(( $(date +%s) - T0 )) s"
[ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
