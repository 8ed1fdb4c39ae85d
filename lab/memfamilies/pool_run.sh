#!/usr/bin/env bash
# pool's GPU run (issue 50: pooling, segment norms, column and segment reductions), <= 100 s,
# from the repository root:  OUT=<dir> bash lab/memfamilies/pool_run.sh
# One `lab.memfamilies.bench` invocation: each case one worker batch (the family's seeds, the
# default first, torch eager and torch.compile; no max-autotune: it does not fit the time),
# verified at the timed and held-out shapes before timing; raw results in $OUT/raw for
# lab/memfamilies/report.py. Cases in the order given; a case starts only if 1.3 x the longest
# so far still fits the budget (the bench's rule), so the last ones may be skipped (said so).
# On the H100 (memfamilies-3, call B) a case took 31-34 s (reference, compile, three seeds and
# two baselines), so 100 s holds the first two; give it ~220 s for all six. With three seeds
# the next run times: max-pool t128 (measured), t128 at 10 blocks a SM, t64; instance norm
# t128 h4 (measured), at 9 blocks a SM, with prefetch.
set -uo pipefail
: "${OUT:?set OUT}"
mkdir -p "$OUT/raw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.csv" 2>&1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
git status --short -- factory lab > "$OUT/tree-status.txt" 2>/dev/null || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  > "$OUT/versions.txt" 2>&1
timeout 94 python3 -m lab.memfamilies.bench --out "$OUT/raw" --budget-s 84 \
  --autotune-until 0 --seeds 3 \
  --case maxpool_nchw_bf16 --case instancenorm_bf16 --case bn_stats_nhwc_fp32 \
  --case bias_grad_fp32 --case bn_stats_nchw_bf16 --case bias_grad_bf16 \
  > "$OUT/run.log" 2>&1
echo "exit $?" >> "$OUT/run.log"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> "$OUT/gpu.csv" 2>&1
tail -n 30 "$OUT/run.log"
