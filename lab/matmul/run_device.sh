#!/usr/bin/env bash
# One device call: each bench invocation is its own process, so a hang or a sticky CUDA error in
# one leaves the others' results. Output JSON goes to $OUT/<tag>/.
set -u
export PYTHONUNBUFFERED=1
run() {
    tag=$1; shift
    mkdir -p "$OUT/$tag"
    OUT="$OUT/$tag" timeout 240 python3 -m lab.matmul.gemm_bench "$@" 2>&1 | tee "$OUT/$tag/log.txt" | grep -v "^check" | tail -n 40
}
"$@"
