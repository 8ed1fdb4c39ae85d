#!/usr/bin/env bash
# The GPU stage of the portal's customer jobs (issues 48, 49, 50), as an air-gapped GPU host
# runs it: every batch in lab/gpujobs/batches (exported by `manage.py export_batch`) through
# `python -m gpuworker run BATCH -o RESULTS` (the worker's own CLI: its judge, timer and
# baselines, nothing of ours), one after another, each with a time limit, all within 275 s
# (the caller gives it 285; each results file names its software versions in "env").
#   OUT=/some/dir bash lab/gpujobs/run_device.sh
# Writes $OUT/<job>.results.json (for `manage.py import_results`), $OUT/<job>.log (the worker's
# log), $OUT/runs.json (exit status and wall time a batch), $OUT/gpu.csv; the table last.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./gpujobs_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
    --format=csv >"$OUT/gpu.csv" 2>&1 || true
PYTHONPATH=. python3 -m lab.gpujobs.run_batches --out "$OUT" --total-s 275 "$@"
