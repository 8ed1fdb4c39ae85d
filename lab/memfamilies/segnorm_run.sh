#!/usr/bin/env bash
# segnorm's cases on the GPU (issue 50), <= 100 s, from the repository root:
#   OUT=<dir> bash lab/memfamilies/segnorm_run.sh
# One `lab.memfamilies.bench` invocation, two candidates a case (the bench's first two seeds):
# instance norm bf16, then group norm bf16 and instance norm fp32 (never run on a GPU).
# torch eager and torch.compile, no max-autotune; each kernel verified at the timed and
# held-out shapes before timing; raw results in $OUT/raw for lab/memfamilies/report.py. A case
# took 21-41 s, so the first one or two fit. The `moments` seed this ran first was 25% slower
# than the default (bench/results/2026-12-07-h100-memfamilies-5) and is no longer a seed.
set -uo pipefail
: "${OUT:?set OUT}"
mkdir -p "$OUT/raw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.csv" 2>&1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
timeout 95 python3 -m lab.memfamilies.bench --out "$OUT/raw" --budget-s 88 \
  --autotune-until 0 --seeds 2 --time-per-candidate-s 0.5 \
  --case instancenorm_bf16 --case groupnorm_bf16 --case instancenorm_fp32 \
  > "$OUT/run.log" 2>&1
echo "exit $?" >> "$OUT/run.log"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> "$OUT/gpu.csv" 2>&1
tail -n 30 "$OUT/run.log"
