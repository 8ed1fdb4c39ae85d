#!/usr/bin/env bash
# The padded-pitch path for K % 16 != 0 on the GPU, under 120 s (one step under a hard
# `timeout 110`): lab/matmul/padk_probe.py checks then times, at 3072x5120x2056, 3000x5000x2056
# and 4096x4096x4104, cuBLAS at K, our staged 128x256 kernel at K, the copies of A and B (or A
# alone) into buffers of pitch K' = K rounded up to 16, the kernel on them at K', and copy plus
# kernel under one pair of events. Results in $OUT/padk/padk_probe.json and log.txt; the table is
# printed last. `lab/matmul/padk_run.sh --dry-run` compiles the kernel without a GPU.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
PY=${PY:-python3}
if [ "${1:-}" = "--dry-run" ]; then exec $PY -m lab.matmul.padk_probe --dry-run; fi
mkdir -p "$OUT/padk"
OUT="$OUT/padk" timeout 110 $PY -m lab.matmul.padk_probe --reps 20 --timeout 80 \
    >"$OUT/padk/log.txt" 2>&1
echo "padk step: exit $?"
grep -E -- "-> FAIL|^ERROR" "$OUT/padk/log.txt" | head -n 10
tail -n 24 "$OUT/padk/log.txt"
