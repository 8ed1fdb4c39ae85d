#!/usr/bin/env bash
# Issue 48's GPU run in one command (under 300 s). Two preflights, each a gemm_bench run that
# checks its kernels at tails and skinny shapes before timing them (a hang ends only that step):
#   1. split-K (45 s cap), timed at 128x8192x8192;
#   2. the TMA-store epilogue (schedule.TMA_STORE_VERIFIED; 45 s cap): 128x256 at 3 stages with
#      a whole-tile staging buffer and at 4 stages with half of it, SwiGLU's 128x128 at 4 stages,
#      checked with M, N and K tails and many tiles per CTA, then timed interleaved with the
#      current kernels (w256s4, and w256s3: the same 3-stage ring without staging) and cuBLAS.
# Then the issue's bench over the time left, with split-K and the TMA-store schedules among its
# candidates only where every check of their preflight passed. Results under $OUT/splitk,
# $OUT/tmastore and $OUT/issue48; the bench's table and summary are printed last.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
mkdir -p "$OUT/splitk" "$OUT/tmastore" "$OUT/issue48"

passed() {  # $1: a gemm_bench.json; $2: its name. Exit 0 if it has checks and all passed.
    python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:  # no file: the step died before its first check
    print(f"{sys.argv[2]} preflight: no results ({e})")
    sys.exit(1)
checks = r.get("checks", [])
ok = bool(checks) and all(c["ok"] for c in checks) and "hang" not in r and not r.get("errors")
print(f"{sys.argv[2]} preflight: {len(checks)} checks, {'all passed' if ok else 'NOT all passed'}")
sys.exit(0 if ok else 1)
PY
}

OUT="$OUT/splitk" timeout 45 python3 -m lab.matmul.gemm_bench --allow-splitk \
    --plan "plain:sk2w256s4+sk4c1w128s4;bias_gelu:sk2w256s4;swiglu:sk2glu128s4" \
    --check-shapes 333x250x72,1x4096x4096,128x8192x8192,130x300x8 \
    --time-shapes 128x8192x8192 --reps 10 --timeout 30 >"$OUT/splitk/log.txt" 2>&1
SK=""
if passed "$OUT/splitk/gemm_bench.json" split-K; then SK="--allow-splitk"; fi
tail -n 8 "$OUT/splitk/log.txt"

OUT="$OUT/tmastore" timeout 45 python3 -m lab.matmul.gemm_bench --allow-tma-store \
    --plan "plain:w256s4+w256s3+w256s3t256+w256s4t128;bias_gelu:w256s4+w256s3t256+w256s4t128;swiglu:glu128s4+glu128s4t128" \
    --check-shapes 333x248x72,1x4096x4096,4095x4104x4000,130x304x8 \
    --time-shapes 4096x4096x4096,8192x8192x8192 --reps 10 --timeout 30 \
    >"$OUT/tmastore/log.txt" 2>&1
TS=""
if passed "$OUT/tmastore/gemm_bench.json" TMA-store; then TS="--allow-tma-store"; fi
tail -n 16 "$OUT/tmastore/log.txt"

# the bench gets what is left of 290 s, and stops starting new cases 35 s before its end
LEFT=$((290 - SECONDS))
OUT="$OUT/issue48" timeout "$LEFT" python3 -m lab.matmul.issue48_bench $SK $TS \
    --budget $((LEFT - 35)) --compile-budget 100 "$@" 2>&1 | tee "$OUT/issue48/log.txt" |
    grep -v "^check\|^done"
