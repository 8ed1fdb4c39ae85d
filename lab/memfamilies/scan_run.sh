#!/usr/bin/env bash
# scan's device request (issue 50; engineer "scan"), at most 100 s on one H100:
#   OUT=<dir> bash lab/memfamilies/scan_run.sh
# The cases in order of importance (the bench skips what its 85 s budget cannot hold): the
# token-axis cumsum (new one-pass column kernel), argmax over a vocabulary (never run; a pair
# per vector column), the 8M-long rows (lookback at 1024 threads an SM), many short rows (a
# row a warp, never run). Each case: our seeds
# and torch eager / torch.compile in one gpuworker batch, verified against float64 first.
set -u
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT/raw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    > "$OUT/gpu.csv" 2>&1 || true
python3 -m lab.memfamilies.bench --out "$OUT/raw" --budget-s 85 --autotune-until 0 \
    --seeds 4 --time-per-candidate-s 0.5 \
    --case cumsum_tokens_bf16 --case argmax_vocab_bf16 --case cumsum_long_rows_fp32 \
    --case cumsum_rows_fp32 > "$OUT/bench.log" 2>&1
rc=$?
tail -n 30 "$OUT/bench.log"
exit $rc
