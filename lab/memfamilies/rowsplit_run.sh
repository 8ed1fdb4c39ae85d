#!/usr/bin/env bash
# The split-row family's GPU run (lab/memfamilies/rowsplit_run.py), <= 95 s, from the
# repository root:  OUT=<dir> bash lab/memfamilies/rowsplit_run.sh
set -uo pipefail
: "${OUT:?set OUT}"
mkdir -p "$OUT/raw"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.csv" 2>&1
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
git status --short -- factory lab > "$OUT/tree-status.txt" 2>/dev/null || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  > "$OUT/versions.txt" 2>&1
timeout 92 python3 -m lab.memfamilies.rowsplit_run --out "$OUT/raw" --budget-s 86 \
  > "$OUT/run.log" 2>&1
echo "exit $?" >> "$OUT/run.log"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> "$OUT/gpu.csv" 2>&1
tail -n 30 "$OUT/run.log"
