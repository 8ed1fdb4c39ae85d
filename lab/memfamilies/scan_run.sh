#!/usr/bin/env bash
# scan's device request (issue 50; engineer "scan"), at most 100 s on one H100:
#   OUT=<dir> bash lab/memfamilies/scan_run.sh
# The cases in order of importance (the bench skips what its 85 s budget cannot hold): the
# token-axis cumsum (57.7% of copy at 59c7ab5; since then the cluster's totals are read once a
# column, and a no-cluster seed on narrower strips is second), the 8M-long rows (never measured
# since the lookback runs 1024 threads an SM), argmax over a vocabulary (85.1% at 59c7ab5;
# since then a pair per vector column, 256 threads), many short rows (99.5%). Each case: our
# seeds and torch eager / torch.compile in one gpuworker batch, verified against float64 first.
set -u
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT/raw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    > "$OUT/gpu.csv" 2>&1 || true
python3 -m lab.memfamilies.bench --out "$OUT/raw" --budget-s 85 --autotune-until 0 \
    --seeds 5 --time-per-candidate-s 0.5 \
    --case cumsum_tokens_bf16 --case cumsum_long_rows_fp32 --case argmax_vocab_bf16 \
    --case cumsum_rows_fp32 > "$OUT/bench.log" 2>&1
rc=$?
tail -n 30 "$OUT/bench.log"
exit $rc
