#!/usr/bin/env bash
# Issue 49's document, ALiBi and window variants on the GPU, one device command (at most about
# 195 s, every step under a hard timeout): check the kernels against the float64 reference, then
# time them at the shapes beside flex_attention compiled, and plain attention beside
# SDPA flash and cuDNN (the "plain SDPA" the criteria compare with), then print the criteria.
#   OUT=/some/dir bash lab/attention/variants_run.sh [extra bench arguments]
#   bash lab/attention/variants_run.sh --dry-run   (no GPU: compiles the same kernels here, lists
#                                                 the cases, checks the summary script starts)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./attention_variants_out}
mkdir -p "$OUT"
PY=${PY:-python3}
# the fastest schedules of round 2 only (fewer kernels: the check and time phases fit the cap)
LABELS=128x128s2ovpp,128x128s3ovpp,128x176s2ovpp,128x128s3ov,128x176s3ovpp
ARGS="--variants plain,alibi,window,document --labels $LABELS"
if [ "${1:-}" = "--dry-run" ]; then
    timeout 150 $PY -m lab.attention.bench --dry-run --out "$OUT" $ARGS 2>&1 | tail -n 12
    echo "dry run exit: ${PIPESTATUS[0]}"
    $PY -c "import lab.attention.variants_summary" && echo "summary imports"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
    > "$OUT/gpu.csv" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
timeout 70 $PY -m lab.attention.bench --phase check --out "$OUT" $ARGS "$@" 2>&1 \
    | tee "$OUT/check_log.txt" | grep -v " -> OK$" | tail -n 40
echo "check phase exit: ${PIPESTATUS[0]}"
timeout 115 $PY -m lab.attention.bench --phase time --out "$OUT" --budget-s 105 $ARGS "$@" 2>&1 \
    | tee "$OUT/time_log.txt" | tail -n 60
echo "time phase exit: ${PIPESTATUS[0]}"
timeout 10 $PY -m lab.attention.variants_summary "$OUT/attention_time.json" 2>&1 \
    | tee "$OUT/summary.txt"
