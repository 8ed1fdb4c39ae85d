#!/usr/bin/env bash
# Issue 48's fused line with max-autotune compiled for every (op, shape) pair (the 2026-12-07
# issue48 run compiled it for 17 of 56 within its budget, so most pairs compared against eager
# alone). One device call, under 600 s, from the repository root:
#   OUT=<dir> bash lab/matmul/fused_coverage_run.sh
# The six fused ops the issue names at its eight shapes, no held-out shapes (verified in earlier
# runs), split-K and the TMA-store epilogue allowed (both passed their preflights); the compile
# budget (420 s) covers ~48 max-autotune compiles of 1-12 s. Writes $OUT/issue48_bench.json;
# `python3 -m lab.matmul.issue48_report` reads it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
: "${OUT:?set OUT}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit \
    --format=csv > "$OUT/gpu.csv" 2>&1
timeout 560 python3 -m lab.matmul.issue48_bench --allow-splitk --allow-tma-store \
    --ops bias_gelu,bias_silu,residual,relu2,swiglu,rowq_fp8 --heldout "" \
    --budget 520 --compile-budget 420 > "$OUT/log.txt" 2>&1
echo "bench exit $?"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> "$OUT/gpu.csv" 2>&1
tail -n 40 "$OUT/log.txt"
