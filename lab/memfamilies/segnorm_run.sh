#!/usr/bin/env bash
# segnorm's moments seed on the GPU (issue 50: instance norm at 0.94x torch.compile in the -4
# run), <= 100 s, from the repository root:  OUT=<dir> bash lab/memfamilies/segnorm_run.sh
# One `lab.memfamilies.bench` invocation, two candidates a case: c0 the default (instance norm
# bf16: held t128 v8 h4 at 9 blocks a SM, 194.2 us in -4), c1 the same with both moments from
# one block-wide fold (8 blocks a SM: at 9 it spills); then group norm bf16 and instance norm
# fp32 (never run on a GPU) the same way. torch eager and torch.compile, no max-autotune; each
# kernel verified at the timed and held-out shapes before timing; raw results in $OUT/raw for
# lab/memfamilies/report.py. A case took 21-24 s in -4, so all three should fit.
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
