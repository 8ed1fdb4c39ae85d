#!/usr/bin/env bash
# Issue 49 on the GPU, one device command (at most 235 s): the check phase, then the time phase in
# its own process, so a kernel that hangs in the first still leaves the baselines' timings.
#   OUT=/some/dir bash lab/attention/run_device.sh [extra bench arguments]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./attention_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
    > "$OUT/gpu.csv" 2>&1 || true
(command -v ptxas || ls /usr/local/cuda/bin/ptxas) 2>&1 | head -n 1
timeout 80 python3 -m lab.attention.bench --phase check --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/check_log.txt" | grep -v " -> OK$" | tail -n 60
echo "check phase exit: ${PIPESTATUS[0]}"
timeout 155 python3 -m lab.attention.bench --phase time --out "$OUT" --budget-s 140 "$@" 2>&1 \
    | tee "$OUT/time_log.txt" | tail -n 90
echo "time phase exit: ${PIPESTATUS[0]}"
