#!/usr/bin/env bash
# The cp.async load path (schedule load = "cp_async") on the GPU, under 120 s, two gemm_bench
# steps each under a hard `timeout` (a hang ends only that step):
#   1. checks (50 s cap): every cp.async variant of the plan at odd shapes (tails in M, N and K,
#      K % 64 != 0, one row), each output poisoned first, compared with a float64 reference,
#      run twice and bitwise equal (gemm_bench.check); no timing;
#   2. timing (60 s cap): the TMA kernel (128x256 s4, staged 128 columns), the same with cp.async
#      loads, cp.async unstaged, 128x128 s6 staged and ping-pong 128x128 s6 with cp.async, and
#      cuBLAS, interleaved, at 3072x5120x2048 (aligned K),
#      3072x5120x2056, 3000x5000x2056 and 4096x4096x4104 (each kernel checked at each shape
#      before it is timed).
# Results under $OUT/unaligned_check and $OUT/unaligned_time (gemm_bench.json, log.txt); the
# timing table is printed last. `lab/matmul/unaligned_run.sh --dry-run` runs both steps without
# a GPU (names resolve, kernels emit and compile clean; PY=.venv/bin/python there).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
PY=${PY:-python3}
DRY=""
if [ "${1:-}" = "--dry-run" ]; then DRY="--dry-run"; fi
mkdir -p "$OUT/unaligned_check" "$OUT/unaligned_time"

OUT="$OUT/unaligned_check" timeout 50 $PY -m lab.matmul.gemm_bench --allow-cp-async $DRY \
    --plan "plain:w256s4ca+w256s4t128ca+w128s6t128ca+w128s7c1t128ca+pp128s6ca+sk2w256s4ca+w128s4c1k128ca;bias_gelu:w256s4t128ca;swiglu:glu128s4t128ca" \
    --check-shapes 333x248x72,777x4104x1032,3000x5000x2056,130x304x8,1x4096x4104 \
    --time-shapes "" --timeout 40 >"$OUT/unaligned_check/log.txt" 2>&1
echo "check step: exit $?"
grep -c -- "-> OK" "$OUT/unaligned_check/log.txt" | sed 's/^/checks passed: /'
grep -E -- "-> FAIL|^ERROR|^skip|^FAIL|^UNKNOWN|dry run" "$OUT/unaligned_check/log.txt" | head -n 20

OUT="$OUT/unaligned_time" timeout 60 $PY -m lab.matmul.gemm_bench --allow-cp-async $DRY \
    --plan "plain:w256s4t128+w256s4t128ca+w256s4ca+w128s6t128ca+pp128s6ca" \
    --check-shapes 333x248x72 \
    --time-shapes 3072x5120x2048,3072x5120x2056,3000x5000x2056,4096x4096x4104 \
    --reps 10 --timeout 45 >"$OUT/unaligned_time/log.txt" 2>&1
echo "timing step: exit $?"
grep -E -- "-> FAIL|^ERROR|^skip|^FAIL|^UNKNOWN" "$OUT/unaligned_time/log.txt" | head -n 10
tail -n 26 "$OUT/unaligned_time/log.txt"
