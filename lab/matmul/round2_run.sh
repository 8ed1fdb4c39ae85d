#!/usr/bin/env bash
# Issue 48, second round on the GPU (one device call, at most 195 s, the most important step
# first). Each step is its own process with its own time cap (a hang or a sticky CUDA error ends only that step) and its own
# folder under $OUT; every kernel is checked against the float64 reference (fresh inputs, output
# poisoned first, two runs bitwise equal) before it is timed.
#   1. verify/:  the changed code paths, checks only, with M, N, K tails, one row, K of one
#                k-block (split-K CTAs without k-blocks): split-K without the wgmma
#                serialisation (C7515), 4-way split of the 128x256 tile, the group-scaled fp8
#                scale without the div.rn call (C7509), the tail path's column predicates, fp8
#                outputs staged through shared memory and stored by TMA (128-column boxes)
#   2. skinny/:  the plain GEMM's candidates for 512x4096x4096 and 128x8192x8192 (tile_k 128
#                among them: 256 contiguous bytes a row per stage), timed interleaved with
#                cuBLAS (torch.matmul); residual the same against eager addmm
#   3. plain/:   issue48_bench for the plain GEMM at the issue's shapes and the held-out ones
#   4. fused/:   issue48_bench for the fp8 outputs and bias+GELU at 4096^3 and 8192^3 against
#                eager and max-autotune
#   5. maxnreg/: the same kernels compiled by nvJitLink (setmaxnreg ignored, C7504) and by
#                ptxas as a whole program (setmaxnreg honoured), at 4096^3 and 8192^3; and the
#                128x256 tile with tile_k 128 (two stages of 96 KB)
#   6. align/:   w256s4t128 at K = 2056 (rows of 4112 bytes) and 2048, to see whether rows not a
#                multiple of 128 bytes slow the TMA loads (the held-out shapes ran at 16-44%)
# The last lines printed are each step's table.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-.}
END=195
mkdir -p "$OUT/verify" "$OUT/skinny" "$OUT/maxnreg" "$OUT/align" "$OUT/fused" "$OUT/plain"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv \
    >"$OUT/gpu.csv" 2>&1

cap() {  # the smaller of $1 seconds and what is left of END, at least 1 (timeout 0 = none)
    local left=$((END - SECONDS))
    if [ "$left" -lt 1 ]; then left=1; fi
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

OUT="$OUT/verify" timeout "$(cap 38)" python3 -m lab.matmul.gemm_bench \
    --allow-splitk --allow-tma-store --allow-wide-k \
    --plan "plain:w256s4t128+sk2w256s4+sk4w256s4+sk2w128s4+w128s4c1k128+sk4w256s2k128+w256s2k128t128;bias_gelu:w256s4t128+sk4w256s4+sk2w128s3k128;residual:w128s5t128+sk2w128s4;rowq_fp8:w256s4+sk2w256s4+w256s4t256+w128s5t128;groupq_fp8:w256s4+w128s5+sk2w256s4+w256s4t256+w256s4t128;swiglu:glu128s4t128+sk2glu128s4;batched_row:w256s4t128" \
    --check-shapes 333x240x72,1x4096x4096,777x4112x1032,130x304x8 \
    --time-shapes "" --timeout 35 >"$OUT/verify/log.txt" 2>&1
echo "verify: $(grep -c -- '-> OK' "$OUT/verify/log.txt") OK, $(grep -c -- '-> FAIL' "$OUT/verify/log.txt") FAIL, $(grep -c '^ERROR\|HANG' "$OUT/verify/log.txt") errors ($SECONDS s)"

OUT="$OUT/skinny" timeout "$(cap 45)" python3 -m lab.matmul.gemm_bench \
    --allow-splitk --allow-tma-store --allow-wide-k \
    --plan "plain:w128s5+w128s5t128+w128s6t128+w256s5c1+w256s5c1t128+w128s4c1+w128s4c1t128+w128s8c1+w128s7c1t128+sk2w256s4+sk4w256s4+sk2w128s4+sk2w128s6+sk2c1w256s4+w128s4c1k128+sk2w128s3k128+sk4w256s2k128;residual:w128s5t128+w128s4c1+w128s8c1+sk4w256s4+sk2w128s4" \
    --check-shapes 333x248x72,777x4104x1032 \
    --time-shapes 512x4096x4096,128x8192x8192 --reps 15 --timeout 36 \
    >"$OUT/skinny/log.txt" 2>&1
echo "skinny: done ($SECONDS s)"

LEFT=$(cap 32)
OUT="$OUT/plain" timeout "$LEFT" python3 -m lab.matmul.issue48_bench --allow-splitk \
    --allow-tma-store --ops plain --no-compile --budget $((LEFT - 12)) \
    >"$OUT/plain/log.txt" 2>&1
echo "plain: done ($SECONDS s)"

LEFT=$(cap 42)
OUT="$OUT/fused" timeout "$LEFT" python3 -m lab.matmul.issue48_bench --allow-splitk \
    --allow-tma-store --ops rowq_fp8,groupq_fp8,bias_gelu \
    --shapes 4096x4096x4096,8192x8192x8192 --heldout "" \
    --budget $((LEFT - 12)) --compile-budget 25 >"$OUT/fused/log.txt" 2>&1
echo "fused: done ($SECONDS s)"

OUT="$OUT/maxnreg" timeout "$(cap 20)" python3 -m lab.matmul.gemm_bench \
    --allow-splitk --allow-tma-store --allow-wide-k \
    --plan "plain:w256s4t128+w256s4t128@ptxas+w256s4+w256s4@ptxas+w256s2k128t128" \
    --check-shapes 333x248x72,777x4104x1032 \
    --time-shapes 4096x4096x4096,8192x8192x8192 --reps 10 --timeout 14 \
    >"$OUT/maxnreg/log.txt" 2>&1
echo "maxnreg: done ($SECONDS s)"

# the held-out shapes ran at 16-44% of peak (3000x5000x2056 at 0.66x cuBLAS): is it K's rows
# not being a multiple of 128 bytes? The same kernel at K = 2056 and 2048, and tile-aligned
OUT="$OUT/align" timeout "$(cap 12)" python3 -m lab.matmul.gemm_bench --allow-tma-store \
    --plan "plain:w256s4t128+w256s4" --check-shapes "" \
    --time-shapes 3000x5000x2056,3000x5000x2048,3072x5120x2048,3072x5120x2056 --reps 10 \
    --timeout 9 >"$OUT/align/log.txt" 2>&1
echo "align: done ($SECONDS s)"

# with what is left: the family's GPU tests of the staged epilogue (the verify step above covers
# every changed path; these are the suite's own)
if [ $((END - SECONDS)) -gt 8 ]; then
    timeout "$(cap 30)" python3 -m pytest -q -m gpu -p no:django -p no:cacheprovider \
        tests/factory/test_matmul_tma_store.py >"$OUT/gputests.txt" 2>&1
    echo "gpu tests: $(tail -n 1 "$OUT/gputests.txt") ($SECONDS s)"
fi

for step in verify skinny maxnreg align; do
    echo "== $step"
    grep -v "^check\|^child\|^{" "$OUT/$step/log.txt" | tail -n 32
done
for step in plain fused; do
    echo "== $step"
    grep -v "^check\|^done\|^E1207\|^ \|^AUTOTUNE\|^strides\|^dtypes\|^{" "$OUT/$step/log.txt" |
        tail -n 30
done
