#!/usr/bin/env bash
# Issue 48's GPU run in one command (under 300 s): first the split-K kernels alone (each checked
# at tails and skinny shapes; a hang ends only this step), then the issue's bench, with split-K
# among its candidates only if every split-K check passed. Results under $OUT/splitk and
# $OUT/issue48; the bench's table and summary are printed last.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
mkdir -p "$OUT/splitk" "$OUT/issue48"
OUT="$OUT/splitk" timeout 60 python3 -m lab.matmul.gemm_bench --allow-splitk \
    --plan "plain:sk2w256s4+sk4c1w128s4;bias_gelu:sk2w256s4;swiglu:sk2glu128s4" \
    --check-shapes 333x250x72,1x4096x4096,128x8192x8192,130x300x8 \
    --time-shapes 128x8192x8192 --reps 10 --timeout 40 >"$OUT/splitk/log.txt" 2>&1
SK=""
if python3 - "$OUT/splitk/gemm_bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
checks = r.get("checks", [])
ok = checks and all(c["ok"] for c in checks) and "hang" not in r and not r.get("errors")
print(f"split-K preflight: {len(checks)} checks, {'all passed' if ok else 'NOT all passed'}")
sys.exit(0 if ok else 1)
PY
then SK="--allow-splitk"; fi
tail -n 12 "$OUT/splitk/log.txt"
OUT="$OUT/issue48" timeout 235 python3 -m lab.matmul.issue48_bench $SK --budget 200 \
    --compile-budget 100 "$@" 2>&1 | tee "$OUT/issue48/log.txt" | grep -v "^check\|^done"
