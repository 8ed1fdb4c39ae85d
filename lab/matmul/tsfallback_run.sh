#!/usr/bin/env bash
# The TMA-store kernels' register-store fallback (schedule.TMA_STORE_FALLBACK_VERIFIED) on the
# GPU, under 100 s, three gemm_bench steps each under a hard `timeout`:
#   1. checks (35 s cap): staged kernels emitted with the fallback, at output rows that are not
#      a multiple of 16 bytes (N = 250, 4099, 300, 4100 - 16-bit; fp8 also at N = 248), where
#      they store from registers, and at N = 248 (16-bit), where they stage as before; the
#      output poisoned first, float64 reference, two runs bitwise equal;
#   2. timing with the fallback emitted (35 s cap): 128x256 staged vs unstaged vs cuBLAS at
#      4096x4096x4096 (the staged path of the larger kernel) and 4096x4100x4096 (the fallback:
#      should match the unstaged kernel);
#   3. timing without it (25 s cap): the same staged kernel as verified, at 4096x4096x4096, to
#      compare with step 2 (different processes: a few percent apart is noise).
# Results under $OUT/tsfb_check, $OUT/tsfb_time, $OUT/tsfb_base; the tables are printed last.
# `lab/matmul/tsfallback_run.sh --dry-run` runs the steps without a GPU (PY=.venv/bin/python).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
PY=${PY:-python3}
DRY=""
if [ "${1:-}" = "--dry-run" ]; then DRY="--dry-run"; fi
mkdir -p "$OUT/tsfb_check" "$OUT/tsfb_time" "$OUT/tsfb_base"

OUT="$OUT/tsfb_check" timeout 35 $PY -m lab.matmul.gemm_bench --allow-tma-store-fallback \
    --allow-cp-async $DRY \
    --plan "plain:w256s4t128+w128s7c1t128+w256s4t128ca;bias_gelu:w256s4t128;swiglu:glu128s4t128;rowq_fp8:w256s4t256;groupq_fp8:w256s4t128" \
    --check-shapes 333x250x72,777x4099x1032,130x300x8,1x4100x4096,333x248x72 \
    --time-shapes "" --timeout 30 >"$OUT/tsfb_check/log.txt" 2>&1
echo "check step: exit $?"
grep -c -- "-> OK" "$OUT/tsfb_check/log.txt" | sed 's/^/checks passed: /'
grep -E -- "-> FAIL|^ERROR|^skip|^FAIL|^UNKNOWN|dry run" "$OUT/tsfb_check/log.txt" | head -n 20

OUT="$OUT/tsfb_time" timeout 35 $PY -m lab.matmul.gemm_bench --allow-tma-store-fallback $DRY \
    --plan "plain:w256s4t128+w256s4" --check-shapes 333x250x72 \
    --time-shapes 4096x4096x4096,4096x4100x4096 --reps 10 --timeout 25 \
    >"$OUT/tsfb_time/log.txt" 2>&1
echo "timing step (fallback emitted): exit $?"

OUT="$OUT/tsfb_base" timeout 25 $PY -m lab.matmul.gemm_bench $DRY \
    --plan "plain:w256s4t128+w256s4" --check-shapes 333x248x72 \
    --time-shapes 4096x4096x4096 --reps 10 --timeout 15 >"$OUT/tsfb_base/log.txt" 2>&1
echo "timing step (as verified): exit $?"
echo "--- with the fallback emitted"
tail -n 7 "$OUT/tsfb_time/log.txt"
echo "--- as verified"
tail -n 4 "$OUT/tsfb_base/log.txt"
