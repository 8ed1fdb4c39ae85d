#!/usr/bin/env bash
# H200 runs, each one device call of under ten minutes (the device tool's limit). Each writes
# under $OUT and tars it into one file. loop, longrow and an earlier suite ran on 2026-12-02
# (bench/results/*-suite3, *-loop3, *-generator); norms ran too, but its results were not kept
# (the session ended before they were committed); explore ran on 2026-12-03 (*-explore).
#
#   bash lab/device/gpu_pending.sh loop    # ~6 min: the agent loop with the recorded sweeps as prior
#                                     #   evidence (issue 6), then the GPU tests of the worker,
#                                     #   customer kernels and artifact examples
#   bash lab/device/gpu_pending.sh suite   # ~6 min: the suite through the worker with every baseline,
#                                     #   max-autotune included (issue 4), with plan m: the three
#                                     #   fastest schedules per case of suite runs 5-6 and explore4
#                                     #   (PLAN=... another plan: suite run 10 took plan s, the
#                                     #   three fastest of runs 8-9 and explore4-8, and RMSNorm
#                                     #   8192's row streamed at 512 threads, kept in L2).
#                                     #   With plan s and every baseline it took 425 s (run 13)
#                                     #   and 457 s for six operators (run 14, GELU past the
#                                     #   deadline): give it DEADLINE=430 and run what is left
#                                     #   in a second call with OPS=...
#   bash lab/device/gpu_pending.sh norms   # ~7 min: what max-autotune runs for the three norms
#                                     #   (lab.probes.inductor_dump: its Triton code and autotuner
#                                     #   timings), then the suite for RMSNorm, add+RMSNorm and
#                                     #   LayerNorm with plan f (the L2::256B prefetch hint,
#                                     #   LayerNorm mean and variance in one pass,
#                                     #   32-byte accesses at 8192), where run 4 is behind (issue 4)
#   bash lab/device/gpu_pending.sh longrow # ~8 min: every generator GPU test (the example operators
#                                     #   incl. rows shared by a cluster of blocks, and the whole
#                                     #   catalogue at its suite and held-out shapes), then a sweep at 2048x65536 against the
#                                     #   streaming default
# The stream hold (judge_hold, 91849a6) first ran on 2026-12-03 (`hold`, then `suite` with
# OPS for the other six operators and plan s): bench/results/2026-12-03-h200-suite8/.
# Liger Kernel joined the suite's baselines in run 12 (bench/results/2026-12-03-h200-suite9/).
# Its GPU test had passed for softmax, RMSNorm and add+RMSNorm when the last call's timeout cut
# it; it is now tests/gpuworker/test_worker_library_baselines_gpu.py, which also checks the
# Triton and torch eager baselines against the one classification (op_roles) they now share:
#   bash lab/device/gpu_pending.sh baselines   # ~6 min, run(carry=[".whl"])
#   bash lab/device/gpu_pending.sh compiled    # ~3.5 min: the torch.compile cases of that test
#   bash lab/device/gpu_pending.sh ties        # ~7 min: RMSNorm and add+RMSNorm, three suite runs,
#                                         #   each with its own max-autotune tuning
# baselines and ties ran on 2026-12-03 at 7e9abd9, then suite run 13:
# bench/results/2026-12-03-h200-ties/ and -suite10/ (whose pytest_baselines.txt is the first
# stage's). At 4c5d998 (fc8cdbf folded the expression translation's constants in), 14:30-15:00:
# plan t in direct mode (add+RMSNorm 16384x4096 streamed at 512 threads, the row re-read from
# L2, as max-autotune runs it: no faster than the cached layouts), `baselines` (30 passed),
# `compiled` (6 passed), and suite run 14 (plan s; GELU, past the first call's deadline, in a
# second call with OPS=gelu_tanh): bench/results/2026-12-03-h200-suite11/. Plan t's command:
#   PYTHONPATH=. python3 -m bench.suite --direct --out $OUT/d --plan lab/plans/suite-2026-12-03t.json \
#       --ops add_rmsnorm --shapes 1 --baselines torch_compile --max-autotune --deadline-s 100
# (direct mode adds max-autotune to its baselines only since the commit after that run, so it
# timed torch.compile's default mode there)
# At d1e493a, 17:02-17:22 (bench/results/2026-12-03-h200-suite12/): suite run 15 in two calls
# (OPS=softmax,cross_entropy,rmsnorm,silu_mul, 237 s; then layernorm,add_rmsnorm,gelu_tanh, 169 s),
# the first `drain` (21 s: SiLU-mul's 103-105% is the byte mix, as torch's a + b of the same bytes
# shows), `gputests` (220 s, 20 passed) and `ties` (358 s); then `mover` twice (b589c22's byte
# mover, then 79b848b's unrolled one: bench/results/2026-12-03-h200-mover/). Next: the mover laid
# out one tile per block, as the row kernels and torch's elementwise kernels are (the
# grid-stride movers reach only 93-98% of the copy ceiling at one or two reads per write):
# `movers` times those layouts (lab/probes/mover.py, lab/kernels/mover.cu) beside judge_mix.
# 18:41-18:50: `movers` (one vector per thread, one tile per block, was fastest everywhere:
# judge_mix now has that layout), then `clusters` (RMSNorm's row over a cluster of blocks:
# 1.4-2.2x the time, bench/results/2026-12-03-h200-explore9/) and `mover` with the new judge_mix
# (SiLU-mul's rows within 2% of it, so not flagged): bench/results/2026-12-03-h200-mover/.
# 19:15-19:29: suite run 16 (bench/results/2026-12-03-h200-suite13/) and `onevec` (-explore10/);
# 19:34-19:37: `gap` three ways and twice beside a direct run (-gap/).
# 2026-12-04, 00:30-01:18: suite run 18 (`suite`, plan x, shared timed outputs, two calls:
# bench/results/2026-12-04-h200-suite15/), `accsplit` and `packed` (-options/), then suite run 19
# (`suite` with PLAN=bench/plans/suite-2026-12-04aa.json, two calls: -suite16/).
# 2026-12-04, 03:19-04:17: `tail` three times (bench/results/2026-12-04-h200-tail/ run1-run3),
# the generator's GPU tests alone (run4), and lab.probes.probe_tail with --cases for the elementwise
# rows walked as one run of tiles, then the examples' GPU tests of SiLU-mul and GELU (run5).
# 2026-12-04, next session: `gputests` at 3b839e4 (22 passed: -tail/run6), then `breadth`
# five times and the generator's GPU tests (bench/results/2026-12-04-h200-breadth/).
# Plan h (the suite stage's) was made here, without a GPU, from the recorded runs:
#   PYTHONPATH=. python3 -m bench.suite --make-plan bench/plans/suite-NEXT.json --top 3 \
#       --plan-from bench/results/2026-12-02-h200-suite3/run1-plan-d,...,<later runs>
# (plus the evict-last variant of GELU's best, which explore did not time).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.csv"
# Baseline packages the device image lacks (Liger Kernel), carried as wheels in .whl/ (ignored by
# git; `run` carries it): pip download liger-kernel==0.8.5 --no-deps -d .whl
for whl in .whl/*.whl; do
    [ -e "$whl" ] && python3 -m pip install -q --no-deps --no-index "$whl" 2>&1 | tail -2
done
case "${1:-}" in
loop)
    # LayerNorm first: the warm-start experiment runs on the first operator, and LayerNorm's
    # default was 4-7% off the best at 16384x4096 in the recorded sweeps (cross-entropy's
    # cold job, first in run 3, found its best in generation 0, which shows no warm start).
    python3 -m lab.probes.loop_run --out "$OUT/loop" --ops layernorm,cross_entropy,softmax,rmsnorm \
        --sweep-limit 32 --generations 4 --population 8 --customer-generations 3 --budget-s 300 \
        --prior 'bench/results/2026-12-02-h200-sweep/run*-shape*.json' 2>&1 | tee "$OUT/loop.txt"
    timeout 200 python3 -m pytest tests/gpuworker tests/factory/test_customer_kernels_gpu.py \
        tests/portal/web/test_web_artifact_examples_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q 2>&1 | tail -30 | tee "$OUT/pytest_gpu.txt"
    ;;
suite)
    python3 -m bench.suite --out "$OUT/suite" --plan "${PLAN:-lab/plans/suite-2026-12-03m.json}" \
        ${OPS:+--ops "$OPS"} --shapes 3 --baselines torch_eager,torch_compile,triton,liger \
        --max-autotune --budget-s 0.3 --deadline-s "${DEADLINE:-400}" >"$OUT/suite.txt" 2>&1
    tail -40 "$OUT/suite.txt"
    ;;
norms)
    timeout 120 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -k "layernorm or add_rmsnorm" 2>&1 | tail -5 | tee "$OUT/pytest.txt"
    timeout 180 python3 -m lab.probes.inductor_dump --out "$OUT/inductor" 2>&1 | tail -20
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-02f.json \
        --ops rmsnorm,add_rmsnorm,layernorm --shapes 3 --baselines torch_eager,torch_compile,triton \
        --max-autotune --budget-s 0.3 --deadline-s 330 2>&1 | tail -60 | tee "$OUT/suite.txt"
    ;;
explore)
    # ~7 min: the generator GPU tests (every example operator and schedule, the shared-barrier
    # row groups and L2 policies included), then plan g in direct mode (our kernels only, with
    # eager and Triton): the best schedules of suite3 with L2 evict-last loads, evict-first
    # stores and two rows per block, for the cases where max-autotune or Triton is ahead.
    # TESTS, PLAN, OPS and SHAPES pick other tests and another plan (explore2 below).
    timeout 170 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -k "${TESTS:-generated_kernels}" 2>&1 | tail -15 \
        | tee "$OUT/pytest.txt"
    python3 -m bench.suite --direct --out "$OUT/direct" \
        --plan "${PLAN:-lab/plans/suite-2026-12-02g.json}" \
        --ops "${OPS:-rmsnorm,add_rmsnorm,layernorm,silu_mul,softmax}" --shapes "${SHAPES:-3}" \
        --baselines torch_eager,triton --deadline-s 300 >"$OUT/direct.txt" 2>&1
    grep -v "^\[" "$OUT/direct.txt" | tail -30
    ;;
explore2)
    # ~2 min: plan i in direct mode, the 16384x8192 layouts of RMSNorm (3.5% behind
    # max-autotune in suite run 5), LayerNorm (90.0% of the copy ceiling) and add+RMSNorm:
    # 512 and 1024 threads per row, 32-byte accesses, 8 chunks of 128 threads, register caps
    TESTS=catalogue PLAN=lab/plans/suite-2026-12-03i.json OPS=rmsnorm,layernorm,add_rmsnorm \
        SHAPES=2 bash lab/device/gpu_pending.sh explore
    exit
    ;;
explore4)
    # ~2 min: the generator GPU tests (with the fenced column groups), then plan l in direct
    # mode: LayerNorm, RMSNorm and add+RMSNorm with their weight (and bias) loaded in fenced
    # groups of chunks (fewer registers, more blocks per SM), beside run 6's fastest layouts
    TESTS=generated_kernels PLAN=lab/plans/suite-2026-12-03l.json \
        OPS=layernorm,rmsnorm,add_rmsnorm SHAPES=3 bash lab/device/gpu_pending.sh explore
    exit
    ;;
final)
    # ~8 min: plan n in direct mode (RMSNorm 16384x8192, 0.7% behind max-autotune in suite run
    # 7: the row streamed twice with its second read from L2, two rows per block, 8 chunks),
    # then plan o, made here from suite run 7 and that exploration (the three fastest per
    # case), through the worker with every baseline: suite run 8. PLAN, OPS, SHAPES, BASELINES,
    # FROM (earlier runs for the plan), SUITE_OPS and DEADLINE set another run (final2 below).
    python3 -m bench.suite --direct --out "$OUT/direct" \
        --plan "${PLAN:-lab/plans/suite-2026-12-03n.json}" --ops "${OPS:-rmsnorm}" \
        --shapes "${SHAPES:-2}" --baselines "${BASELINES:-torch_eager,triton}" \
        --deadline-s 120 >"$OUT/direct.txt" 2>&1
    grep -v "^\[" "$OUT/direct.txt" | tail -5
    python3 -m bench.suite --make-plan "$OUT/plan-next.json" --top 3 --plan-from \
        "${FROM:-bench/results/2026-12-03-h200-suite5/run1-plan-m},$(ls -d "$OUT"/direct/*-*/ | head -1)"
    python3 -m bench.suite --out "$OUT/suite" --plan "$OUT/plan-next.json" \
        ${SUITE_OPS:+--ops "$SUITE_OPS"} \
        --shapes 3 --baselines torch_eager,torch_compile,triton --max-autotune --budget-s 0.3 \
        --deadline-s "${DEADLINE:-400}" >"$OUT/suite.txt" 2>&1
    tail -30 "$OUT/suite.txt"
    ;;
final2)
    # ~4 min (not yet run): plan p in direct mode (add+RMSNorm, 0.8% behind torch.compile at
    # 32768x4096 in suite run 8: 64 to 1024 threads per row, one or two rows per block, early
    # outputs stored last or not, evict-first stores, a register cap, the weight in fenced
    # groups), then a plan made here from run 8, explore5 and that exploration, through the
    # worker with every baseline for RMSNorm and add+RMSNorm: suite run 9
    R=bench/results
    PLAN=lab/plans/suite-2026-12-03p.json OPS=add_rmsnorm SHAPES=3 BASELINES=torch_eager \
        FROM="$R/2026-12-03-h200-suite5/run2-plan-o,$R/2026-12-03-h200-explore5" \
        SUITE_OPS=rmsnorm,add_rmsnorm DEADLINE=200 bash lab/device/gpu_pending.sh final
    exit
    ;;
hold)
    # ~3 min: the first run of the stream hold (91849a6) on the H200: the GPU worker's tests,
    # then RMSNorm through the worker with every baseline (max-autotune's samples alternated
    # 257, 62, 274, 64 us at 16384x4096 in suite run 10 without it)
    timeout 150 python3 -m pytest tests/gpuworker -m gpu -o addopts="" -p no:cacheprovider -q \
        -rs --durations=5 >"$OUT/pytest_worker.txt" 2>&1
    tail -12 "$OUT/pytest_worker.txt"
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-03s.json \
        --ops rmsnorm --shapes 3 --baselines torch_eager,torch_compile,triton --max-autotune \
        --budget-s 0.3 --deadline-s 200 >"$OUT/suite.txt" 2>&1
    tail -20 "$OUT/suite.txt"
    ;;
gputests)
    # ~4 min: every GPU test of the generator (the example operators with every schedule kind,
    # the whole catalogue with its default schedules at suite and held-out shapes), the customer
    # kernels and the GPU worker (the library baselines' tests are the `baselines` and
    # `compiled` stages: ~10 min together)
    timeout 520 python3 -m pytest tests/factory/test_generator_gpu.py \
        tests/factory/test_customer_kernels_gpu.py tests/gpuworker \
        --ignore=tests/gpuworker/test_worker_library_baselines_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=8 >"$OUT/pytest.txt" 2>&1
    tail -30 "$OUT/pytest.txt"
    ;;
longrow)
    timeout 330 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q 2>&1 | tail -30 | tee "$OUT/pytest_generator.txt"
    python3 -m lab.probes.sweep --out "$OUT/longrow" --ops softmax,rmsnorm,layernorm \
        --dims M=2048,N=65536 --plan lab/plans/sweep-longrow.json --flush read 2>&1 \
        | tail -40 | tee "$OUT/longrow.txt"
    ;;
baselines)
    # ~6 min: every library baseline (Liger, Triton, torch eager) at every catalogue operator
    # it covers, verified at a small and the held-out shapes, then the worker's own GPU tests;
    # the torch.compile cases (~30 s each) are the next stage, so that each fits one call
    timeout 500 python3 -m pytest tests/gpuworker -m gpu -k "not torch_compile" -o addopts="" \
        -p no:cacheprovider -q -rs --durations=8 >"$OUT/pytest_baselines.txt" 2>&1
    tail -20 "$OUT/pytest_baselines.txt"
    ;;
compiled)
    # ~3.5 min: torch.compile of the expression translation at six operators, verified the same way
    timeout 400 python3 -m pytest tests/gpuworker -m gpu -k torch_compile -o addopts="" \
        -p no:cacheprovider -q -rs --durations=8 >"$OUT/pytest_compiled.txt" 2>&1
    tail -20 "$OUT/pytest_compiled.txt"
    ;;
drain)
    # ~6 min (not yet run): how much of a run's writes are still in the L2 when its end event
    # fires (lab.probes.drain): SiLU-mul, whose rows are 103-104% of the copy ceiling in runs 11-14,
    # squared ReLU (one read, one write, as a copy), RMSNorm and cross-entropy, plain and
    # drained, beside torch.compile, a copy of the same bytes and the 2 GiB copy ceiling
    timeout 540 python3 -m lab.probes.drain --out "$OUT/drain" --plan lab/plans/suite-2026-12-03s.json \
        --ops silu_mul,relu2,rmsnorm,cross_entropy --shapes 3 --baselines torch_compile \
        >"$OUT/drain.txt" 2>&1
    grep -v "^\[" "$OUT/drain.txt" | tail -50
    ;;
mover)
    # ~5 min: the byte mover (judge_mix, b589c22) on the H200: the GPU worker's tests, then the
    # suite for SiLU-mul (two reads per write), cross-entropy (reads only) and RMSNorm (one read
    # per write) through the worker, whose results now carry the mover's rate at each shape
    timeout 200 python3 -m pytest tests/gpuworker/test_worker_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=5 >"$OUT/pytest_worker.txt" 2>&1
    tail -5 "$OUT/pytest_worker.txt"
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-03s.json \
        --ops "${OPS:-silu_mul,cross_entropy,rmsnorm}" --shapes 3 \
        --baselines torch_eager,torch_compile,triton,liger --max-autotune --budget-s 0.3 \
        --deadline-s "${DEADLINE:-280}" >"$OUT/suite.txt" 2>&1
    grep -v "^\[\|warn\|Online softmax\|split the reduction\|important use case\|^$" \
        "$OUT/suite.txt" | tail -12
    ;;
movers)
    # ~35 s: lab.probes.drain with the byte movers of lab/probes/mover.py beside the copy, torch's a + b
    # and our kernels: the worker's judge_mix (one vector per thread, one tile per block; the
    # fastest in the first run of this stage, as tiled_v1, 18:41 UTC 2026-12-03) and the
    # layouts it was chosen over
    timeout 300 python3 -m lab.probes.drain --out "$OUT/movers" --plan lab/plans/suite-2026-12-03s.json \
        --ops silu_mul,rmsnorm,cross_entropy,relu2 --shapes 3 \
        --baselines torch_compile,mover:judge_mix,mover:tiled_v2,mover:tiled_v4,mover:gridstride_u4 \
        >"$OUT/movers.txt" 2>&1
    grep -v "^\[" "$OUT/movers.txt" | tail -60
    ;;
clusters)
    # ~2.5 min: RMSNorm and add+RMSNorm with the row shared by a cluster of 256-thread blocks
    # (2 at 4096 columns, 4 at 8192: one or two 16-byte vectors per thread, as judge_mix moves
    # bytes fastest), beside the two best of plan s and torch.compile with max-autotune, in
    # direct mode (plan u; every layout verified at the suite and held-out shapes first)
    timeout 280 python3 -m bench.suite --direct --out "$OUT/clusters" \
        --plan lab/plans/suite-2026-12-03u.json --ops rmsnorm,add_rmsnorm --shapes 3 \
        --baselines torch_compile --max-autotune --budget-s 0.3 --deadline-s 250 \
        >"$OUT/clusters.txt" 2>&1
    grep -v "^\[\|warn\|^$" "$OUT/clusters.txt" | tail -50
    ;;
onevec)
    # ~1 min (ran 19:28 UTC 2026-12-03, bench/results/2026-12-03-h200-explore10/): one or two 16-byte vectors per thread in 256- and 512-thread row blocks (as
    # judge_mix moves bytes fastest) for the near ties: RMSNorm and add+RMSNorm at 4096 columns,
    # softmax at 16384x8192, beside the two best of plan s, torch.compile with max-autotune and
    # Triton, in direct mode (plan v; every layout verified first)
    timeout 280 python3 -m bench.suite --direct --out "$OUT/onevec" \
        --plan lab/plans/suite-2026-12-03v.json --ops rmsnorm,add_rmsnorm,softmax --shapes 3 \
        --baselines torch_compile,triton --max-autotune --budget-s 0.3 --deadline-s 250 \
        >"$OUT/onevec.txt" 2>&1
    grep -E "passed|failed|rejected" "$OUT/onevec.txt" | cut -c1-120 | tail -60
    ;;
gap)
    # ~10 s (ran 19:34-19:37 UTC 2026-12-03, bench/results/2026-12-03-h200-gap/): why torch-launched baselines time 1.5-3.5 us slower through the worker than in
    # direct mode (lab/probes/probe_gap.py: the plain Triton softmax under each protocol, one
    # difference changed at a time, the variants interleaved)
    timeout 200 python3 -m lab.probes.probe_gap --out "$OUT/gap" ${HOLDS:+--holds} ${ROUNDS:+--rounds} 2>&1 | grep -v "^\[" | tail -40
    ;;
bulk)
    # ~3 min: the GPU worker's tests (the copy ceiling and byte mover sharing one timing loop,
    # 3d98ae2, first run here), then RMSNorm and softmax rows loaded by the bulk-copy engine
    # (lab/probes/bulkrows.py, lab/kernels/bulkrows.cu: a persistent block keeps 2-4 rows in flight
    # in shared memory) beside plan s's best, torch.compile, max-autotune and Triton, in direct
    # mode; every entrant verified against the float64 reference before and after timing
    timeout 200 python3 -m pytest tests/gpuworker/test_worker_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=5 >"$OUT/pytest_worker.txt" 2>&1
    tail -3 "$OUT/pytest_worker.txt"
    B=bulk:rms_t256k4s2r@4,bulk:rms_t256k4s2b@4,bulk:rms_t256k4s3r@4,bulk:rms_t256k4s3b@4
    B=$B,bulk:rms_t256k4s4r@3,bulk:rms_t256k4s4b@3,bulk:rms_t256k4s3r@2,bulk:rms_t256k4s4r@2
    B=$B,bulk:rms_t128k4s2r@8,bulk:rms_t128k4s2b@8,bulk:rms_t128k4s4r@6,bulk:rms_t128k4s4b@6
    B=$B,bulk:rms_t256k2s2r@6,bulk:rms_t256k2s2b@6,bulk:rms_t256k2s4r@6,bulk:rms_t256k2s4b@6
    B=$B,bulk:softmax_t256k4s2r@5,bulk:softmax_t256k4s2b@5,bulk:softmax_t256k4s3r@4
    B=$B,bulk:softmax_t256k4s3b@4,bulk:softmax_t128k4s2r@8,bulk:softmax_t128k4s2b@8
    B=$B,bulk:softmax_t128k4s4r@6,bulk:softmax_t128k4s4b@6
    timeout 300 python3 -m bench.suite --direct --out "$OUT/bulk" \
        --plan lab/plans/suite-2026-12-03s.json --ops "${OPS:-rmsnorm,softmax}" --shapes 3 \
        --baselines "torch_compile,triton,$B" --max-autotune --budget-s 0.3 --deadline-s 280 \
        >"$OUT/bulk.txt" 2>&1
    grep -E "passed|failed|rejected|crashed|unavailable|Error" "$OUT/bulk.txt" | cut -c1-140 | tail -70
    ;;
place)
    # ~1 min: does the output's placement change a softmax's time? (lab/probes/probe_place.py: Triton's
    # and ours writing the same buffers at several offsets, bench.direct's protocol), then the
    # tidied lab/probes/probe_gap.py's first run on a GPU
    timeout 240 python3 -m lab.probes.probe_place --out "$OUT/place" 2>&1 | grep -v "^\[" | tail -60
    timeout 150 python3 -m lab.probes.probe_gap --out "$OUT/gap" 2>&1 | grep -v "^\[" | tail -40
    ;;
softmaxw)
    # ~1 min: softmax in Triton's own layouts (256 threads of two 16-byte vectors per row at 4096
    # columns, 512 of two at 8192; two-pass and online; three load hints) beside plan s's,
    # Triton and torch.compile, in direct mode (plan w; every layout verified first)
    timeout 280 python3 -m bench.suite --direct --out "$OUT/softmaxw" \
        --plan lab/plans/suite-2026-12-03w.json --ops softmax --shapes 3 \
        --baselines torch_compile,triton --budget-s 0.3 --deadline-s 250 \
        >"$OUT/softmaxw.txt" 2>&1
    grep -E "passed|failed|rejected|crashed|held-out" "$OUT/softmaxw.txt" | cut -c1-110 | tail -40
    ;;
run17)
    # ~5.5 min: plan x (plan s, with softmax's two-pass row in registers, ct128r1v8c4_elno and
    # ct256r1v8c4_elno, added: 124.1 us against Triton's 124.8 at 16384x8192 in softmaxw) in
    # direct mode for softmax once more, then the suite through the worker (OPS, DEADLINE)
    timeout 100 python3 -m bench.suite --direct --out "$OUT/direct" \
        --plan lab/plans/suite-2026-12-03x.json --ops softmax --shapes 3 \
        --baselines torch_compile,triton --budget-s 0.3 --deadline-s 90 >"$OUT/direct.txt" 2>&1
    grep -E "passed|held-out" "$OUT/direct.txt" | cut -c1-100 | tail -22
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-03x.json \
        ${OPS:+--ops "$OPS"} --shapes 3 --baselines torch_eager,torch_compile,triton,liger \
        --max-autotune --budget-s 0.3 --deadline-s "${DEADLINE:-400}" >"$OUT/suite.txt" 2>&1
    grep -v "^\[\|warn\|Online softmax\|split the reduction\|important use case\|^$" \
        "$OUT/suite.txt" | tail -40
    ;;
regrms)
    # ~1 min: RMSNorm by a persistent block whose weight stays in registers for its life (no
    # re-read from L2 per row), rows loaded straight into registers (lab/kernels/bulkrows.cu,
    # regrms), one row at a time or the next row in a second buffer, beside plan s's best,
    # torch.compile, max-autotune and Triton, in direct mode; every entrant verified first
    B=bulk:regrms_t256k4s1e@3,bulk:regrms_t256k4s1n@3,bulk:regrms_t256k4s2e@2
    B=$B,bulk:regrms_t256k4s2n@2,bulk:regrms_t128k4s1e@6,bulk:regrms_t128k4s1n@6
    B=$B,bulk:regrms_t128k4s2e@4,bulk:regrms_t128k4s2n@4
    timeout 280 python3 -m bench.suite --direct --out "$OUT/regrms" \
        --plan lab/plans/suite-2026-12-03s.json --ops rmsnorm --shapes 3 \
        --baselines "torch_compile,triton,$B" --max-autotune --budget-s 0.3 --deadline-s 250 \
        >"$OUT/regrms.txt" 2>&1
    grep -E "passed|failed|crashed|held-out" "$OUT/regrms.txt" | cut -c1-110 | tail -40
    ;;
foreign)
    # ~3 min: torch.compile's own kernels launched as ours are (lab/probes/probe_foreign.py): at
    # RMSNorm 16384x8192, where torch.compile leads by 0.4% in every run, its Triton cubin on
    # our stream, its PTX through our nvJitLink (as is, on the read-only path, without load
    # hints), plan x's schedules (three also by Triton's ptxas); then RMSNorm 32768x4096 and
    # add+RMSNorm 16384x4096 against max-autotune; then bench.direct and probe_place once each,
    # after run_case's launch and judging were lifted into our_launcher and judge
    timeout 150 python3 -m lab.probes.probe_foreign --out "$OUT/foreign/rmsnorm-s1" 2>&1 | tail -40
    timeout 150 python3 -m lab.probes.probe_foreign --out "$OUT/foreign/rmsnorm-s2" --shape 2 \
        --impl torch_compile_max_autotune 2>&1 | tail -40
    timeout 150 python3 -m lab.probes.probe_foreign --out "$OUT/foreign/add_rmsnorm-s0" \
        --op add_rmsnorm --shape 0 --impl torch_compile_max_autotune 2>&1 | tail -40
    timeout 120 python3 -m bench.suite --direct --out "$OUT/direct" \
        --plan lab/plans/suite-2026-12-03x.json --ops rmsnorm --shapes 1 \
        --baselines torch_compile,triton --budget-s 0.3 --deadline-s 90 >"$OUT/direct.txt" 2>&1
    grep -E "passed|failed|crashed|held-out" "$OUT/direct.txt" | cut -c1-110 | tail -20
    timeout 150 python3 -m lab.probes.probe_place --out "$OUT/place" 2>&1 | grep -v "^\[" | tail -20
    ;;
shared)
    # ~7 min: the worker's GPU tests (timed outputs in torch's allocator beside a torch
    # baseline, and in the guarded buffers), then RMSNorm and add+RMSNorm through the worker
    # with plan x, torch.compile, max-autotune and Triton, shared timed outputs, then the same
    # with guarded ones (as runs 11-17), one after the other on the same card
    timeout 200 python3 -m pytest tests/gpuworker/test_worker_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q 2>&1 | tail -5 | tee "$OUT/pytest_worker.txt"
    for mode in shared guarded; do
        timeout 200 python3 -m bench.suite --out "$OUT/$mode" \
            --plan lab/plans/suite-2026-12-03x.json --ops "${OPS:-rmsnorm,add_rmsnorm}" \
            --shapes 3 --baselines torch_compile,triton --max-autotune --budget-s 0.3 \
            --deadline-s 150 --timed-outputs "$mode" >"$OUT/$mode.txt" 2>&1
        grep -E "^\|" "$OUT"/$mode/*/summary.md | head -20
    done
    ;;
accsplit)
    # ~6 min: the generator's GPU tests (with partial accumulators by trees and the gathered
    # logit loaded first among the schedules), then plan y (plan x, and each RMSNorm,
    # add+RMSNorm and cross-entropy layout of it again with four partial accumulators per
    # thread, and for cross-entropy with the gather first, at the same residency) through the
    # worker beside torch.compile, max-autotune, Triton and Liger Kernel
    timeout 150 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -k generated_kernels 2>&1 | tail -5 | tee "$OUT/pytest.txt"
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-04y.json \
        --ops "${OPS:-cross_entropy,rmsnorm,add_rmsnorm}" --shapes 3 \
        --baselines torch_compile,triton,liger --max-autotune --budget-s 0.3 \
        --deadline-s "${DEADLINE:-330}" >"$OUT/suite.txt" 2>&1
    grep -E "^\|" "$OUT"/suite/*/summary.md | head -14
    ;;
packed)
    # ~4 min: the generator's GPU tests (the online max on packed 16-bit pairs among the
    # schedules), then plan z: cross-entropy's plan-x layouts beside streamed warps of 4-8
    # chunks in flight under a 64-register cap (packed_max keeps them from spilling), 1 or 2
    # rows per block, read-only or plain loads, through the worker beside torch.compile and
    # Liger Kernel
    timeout 150 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -k generated_kernels 2>&1 | tail -3 | tee "$OUT/pytest.txt"
    python3 -m bench.suite --out "$OUT/suite" --plan lab/plans/suite-2026-12-04z.json \
        --ops cross_entropy --shapes 3 --baselines torch_compile,liger --budget-s 0.3 \
        --deadline-s 200 >"$OUT/suite.txt" 2>&1
    grep -E "^\|" "$OUT"/suite/*/summary.md | head -6
    ;;
protocol)
    # ~2 min: RMSNorm 16384x8192, torch.compile against our two fastest layouts in bench.direct,
    # timed under the worker's habits added one at a time (lab/probes/probe_protocol.py)
    timeout 240 python3 -m lab.probes.probe_protocol --out "$OUT/protocol" 2>&1 | tail -12
    ;;
ties)
    # ~8 min: the cases where ours and the best baseline are within 1% (RMSNorm, add+RMSNorm),
    # the suite three times over, each run with an empty inductor cache, so max-autotune tunes
    # afresh each time (as a customer's first compile does); then lab.probes.repeats side by side
    mkdir -p "$OUT/ties"
    for k in 1 2 3; do
        TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 200 python3 -m bench.suite \
            --out "$OUT/ties/run$k" --plan lab/plans/suite-2026-12-03s.json \
            --ops "${OPS:-rmsnorm,add_rmsnorm}" --shapes 3 \
            --baselines torch_eager,torch_compile,triton,liger --max-autotune \
            --budget-s "${BUDGET:-0.3}" --deadline-s 120 >"$OUT/ties/run$k.txt" 2>&1
        tail -3 "$OUT/ties/run$k.txt"
    done
    python3 -m lab.probes.repeats "$OUT"/ties/run*/*-*/ --out "$OUT/ties/repeats.md" | tail -12
    ;;
tail)
    # ~8 min: ragged rows (lab/probes/probe_tail.py): the kernels of two emitters, emitted on the CPU
    # into .tailptx/old and .tailptx/new (carried; git-ignored), timed side by side with
    # torch.compile at row lengths no layout divides; then the generator's GPU tests
    python3 -m lab.probes.probe_tail --out "$OUT/tail" --sets old=.tailptx/old,new=.tailptx/new \
        --baselines torch_compile --deadline-s "${DEADLINE:-330}" >"$OUT/tail.txt" 2>&1
    tail -45 "$OUT/tail.txt"
    timeout "${TESTS_S:-380}" python3 -m pytest tests/factory/test_generator_gpu.py -m gpu \
        -o addopts="" -p no:cacheprovider -q -rf --durations=4 >"$OUT/pytest.txt" 2>&1
    tail -12 "$OUT/pytest.txt"
    ;;
breadth)
    # ~7 min: shapes of common models beyond the suite (hidden sizes 768-7168, a decode batch
    # of 64 rows and one row, long softmax rows, vocabularies of 49152-151936), our screened
    # candidates emitted on the CPU into .tailptx/breadth (with its `cases` file; carried),
    # timed beside torch eager, torch.compile, Liger and Triton (run(carry=[".tailptx", ".whl"]))
    python3 -m lab.probes.probe_tail --out "$OUT/breadth" --sets "${SETS:-new=.tailptx/breadth}" \
        --cases "${CASES:-$(cat .tailptx/breadth/cases)}" --baselines "${BASELINES:-torch_eager,torch_compile,liger,triton}" \
        --order "${ORDER:-rotate}" --reps "${REPS:-15}" --deadline-s "${DEADLINE:-420}" >"$OUT/breadth.txt" 2>&1
    tail -45 "$OUT/breadth.txt"
    ;;
shift)
    # ~8 min: the shifted tail (d284ff7, 304693f, 4e96198; bench/results/2026-12-04-h200-shift):
    # rows that are not a multiple of 8 walked from the aligned address before their start. On
    # the CPU, the same candidates twice:
    #   C=rmsnorm:16384x4999,add_rmsnorm:16384x4999,layernorm:16384x4999,softmax:16384x4999,\
    #     cross_entropy:4096x50257,softmax:2048x40001
    #   python3 lab/probes/probe_tail.py --emit-to .tailptx/old --cases "$C"
    #   python3 lab/probes/probe_tail.py --emit-to .tailptx/new --cases "$C" --tail shifted
    #   echo "$C" > .tailptx/new/cases                     # then run(carry=[".tailptx"])
    # First the generator's GPU tests (the example operators with shifted layouts, streamed
    # and held in registers, at N = 4095, 1000, 40000, 8), then the two sets timed side by side
    timeout "${TESTS_S:-480}" python3 -m pytest tests/factory/test_generator_gpu.py -m gpu \
        -o addopts="" -p no:cacheprovider -q -rf --durations=4 >"$OUT/pytest.txt" 2>&1
    tail -8 "$OUT/pytest.txt"
    python3 -m lab.probes.probe_tail --out "$OUT/shift" --sets old=.tailptx/old,new=.tailptx/new \
        --cases "$(cat .tailptx/new/cases)" --baselines torch_compile \
        --deadline-s "${DEADLINE:-200}" >"$OUT/shift.txt" 2>&1
    grep -A12 "^| case | old" "$OUT/shift.txt"
    ;;
shortrows)
    # ~7 min: rows under a warp (a330e1e, ff13d7a; never run on a GPU when they landed): their
    # GPU test (every catalogue operator at rows of 64, 100 and 128 and 4099 rows), then the
    # starting layouts at router/head widths timed beside torch.compile. Emitted here, so it
    # needs no carried set (C= other cases).
    timeout "${TESTS_S:-300}" python3 -m pytest tests/factory/test_generator_gpu.py -m gpu \
        -o addopts="" -p no:cacheprovider -q -rf -k under_a_warp >"$OUT/pytest.txt" 2>&1
    tail -6 "$OUT/pytest.txt"
    C=${C:-softmax:262144x64,rmsnorm:262144x128,layernorm:65536x100,cross_entropy:262144x64,add_rmsnorm:262144x128}
    python3 lab/probes/probe_tail.py --emit-to /tmp/short --cases "$C" | tail -1
    python3 -m lab.probes.probe_tail --out "$OUT/short" --sets short=/tmp/short --cases "$C" \
        --baselines torch_eager,torch_compile --deadline-s "${DEADLINE:-240}" >"$OUT/short.txt" 2>&1
    tail -40 "$OUT/short.txt"
    ;;
narrow)
    # ~70 s for the three cases: the slice of the space around the 8-byte default for short
    # rows off a 16-byte boundary (threads, rows a block, chunks, and every one-field
    # neighbour: hints, register caps, early columns, ...) beside torch.compile. Ran at
    # c1a1b76 (bench/results/2026-12-06-h100-narrow run1), then at f101473 and 257724f with
    # C= rows of 100 and 1000 (bench/results/2026-12-06-h100-perrow run1-run2: the path per
    # row, blocks of 128 threads, the read-only loads without an L2 policy). Not yet run
    # with ec4e9e8's default (that hint) as the default, nor on an H200.
    # With --controls: the "vectors" tail the default had before the "stream" tail, and the
    # row loop of a persistent grid (prefetch, columns held across rows) beside it.
    # Emitted here (C= other cases); probe_tail keeps every finished case if the call is cut.
    C=${C:-layernorm:1048576x100,rmsnorm:1048576x100,softmax:1048576x100}
    python3 -m lab.probes.emit_slice /tmp/narrow --caps 0 --neighbours --controls --cases "$C" | tail -1
    python3 -m lab.probes.probe_tail --out "$OUT/narrow" --sets narrow=/tmp/narrow --cases "$C" \
        --baselines torch_eager,torch_compile --deadline-s "${DEADLINE:-240}" >"$OUT/narrow.txt" 2>&1
    tail -60 "$OUT/narrow.txt"
    ;;
perrow)
    # ~7 min, what 2026-12-06's calls left (bench/results/2026-12-06-h100-perrow): `narrow` at
    # rows of 100 and 1000 with ec4e9e8's defaults (blocks of 128 threads, no L2 policy, the
    # path per row), on an H200 if one comes, then the generator's GPU tests that cover them:
    # the rows under a warp, and the catalogue at its suite and held-out shapes (~195 s alone
    # on the H200; both calls that day cut it). Ran at 94204c6 on an H100, both tests passed:
    # bench/results/2026-12-06-h100-perrow2.
    C=${C:-layernorm:1048576x100,rmsnorm:1048576x100,softmax:1048576x100,layernorm:65536x1000,rmsnorm:65536x1000,softmax:65536x1000}
    python3 -m lab.probes.emit_slice /tmp/narrow --caps 0 --neighbours --controls --cases "$C" | tail -1
    python3 -m lab.probes.probe_tail --out "$OUT/narrow" --sets narrow=/tmp/narrow --cases "$C" \
        --baselines torch_eager,torch_compile --deadline-s "${DEADLINE:-150}" >"$OUT/narrow.txt" 2>&1
    head -8 "$OUT/narrow.txt"
    timeout 300 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=5 -k "under_a_warp or catalogue" \
        >"$OUT/pytest.txt" 2>&1
    tail -12 "$OUT/pytest.txt"
    ;;
perwarp)
    # ~6 min: rows of several warps with the path chosen per thread (.tailptx/thread, emitted
    # at 42ffa0a) and per warp (.tailptx/warp, the commit after), each the default's slice
    # (`lab.probes.emit_slice --caps 0`) at 2000 and 3000 columns (64 and 128 threads a row, the
    # last warp ragged) and, as controls where no warp is ragged, LayerNorm 16384x4096 and
    # softmax 16384x8192; beside torch eager and torch.compile. Then every generator GPU test.
    # run(carry=[".tailptx"]): both sets are emitted here, not on the GPU host. Ran at 3698c0e
    # on an H100 (22 GPU tests passed): bench/results/2026-12-06-h100-perwarp.
    python3 -m lab.probes.probe_tail --out "$OUT/perwarp" --sets thread=.tailptx/thread,warp=.tailptx/warp \
        --baselines torch_eager,torch_compile --deadline-s "${DEADLINE:-200}" \
        --cases "$(cat .tailptx/warp/cases)" >"$OUT/perwarp.txt" 2>&1
    head -10 "$OUT/perwarp.txt"
    timeout 330 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=8 >"$OUT/pytest.txt" 2>&1
    tail -14 "$OUT/pytest.txt"
    ;;
perwarp2)
    # ~3 min: perwarp ran at 3698c0e (bench/results/2026-12-06-h100-perwarp); its LayerNorm
    # 16384x4096 control read 1.0% slower per warp. Here the suite's bf16 shapes for the norms
    # and softmax, the default's slice per thread (.tailptx/thread, emitted at 42ffa0a) and
    # per warp (.tailptx/warp, at 975712c), 25 reps; and, per warp only, rows of one warp at
    # 512-1024 columns (one to four chunks: one row a block against four, as the seeds hold).
    # Ran at dc33f5e on an H100: bench/results/2026-12-06-h100-perwarp/run2.
    python3 -m lab.probes.probe_tail --out "$OUT/perwarp2" --sets thread=.tailptx/thread,warp=.tailptx/warp \
        --baselines torch_eager,torch_compile --reps 25 --deadline-s "${DEADLINE:-420}" \
        --cases "$(cat .tailptx/warp/cases)" >"$OUT/perwarp2.txt" 2>&1
    head -14 "$OUT/perwarp2.txt"
    ;;
ragged)
    # ~7 min, run(carry=[".tailptx"]): 16384x5000 for LayerNorm, RMSNorm, add+RMSNorm and softmax
    # (128 threads of five chunks leave the fourth warp ragged), the default's slice per thread
    # (.tailptx/thread, emitted at 42ffa0a) and per warp (.tailptx/warp, at 1a2daf7); then
    # rows of one warp at 512-1000 with every one-field neighbour and register caps of 1280,
    # 1536 and 2048 threads (.tailptx/onewarp: LayerNorm stays 1-3% behind torch.compile
    # there); then the GPU tests of the worker, the customer kernels and the artifact examples.
    # Ran at d95833e on an H100 (13 passed): bench/results/2026-12-06-h100-perwarp/run3.
    python3 -m lab.probes.probe_tail --out "$OUT/ragged" --sets thread=.tailptx/thread,warp=.tailptx/warp \
        --baselines torch_eager,torch_compile --deadline-s 120 \
        --cases "$(cat .tailptx/warp/cases)" >"$OUT/ragged.txt" 2>&1
    head -6 "$OUT/ragged.txt"
    python3 -m lab.probes.probe_tail --out "$OUT/onewarp" --sets onewarp=.tailptx/onewarp \
        --baselines torch_compile --deadline-s 150 \
        --cases "$(cat .tailptx/onewarp/cases)" >"$OUT/onewarp.txt" 2>&1
    head -7 "$OUT/onewarp.txt"
    timeout "${TESTS_S:-240}" python3 -m pytest tests/gpuworker/test_worker_gpu.py \
        tests/gpuworker/test_worker_timer_check.py tests/factory/test_customer_kernels_gpu.py \
        tests/portal/web/test_web_artifact_examples_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs --durations=5 >"$OUT/pytest.txt" 2>&1
    tail -12 "$OUT/pytest.txt"
    ;;
rows512)
    # ~4 min, run(carry=[".tailptx"]): why rows of 512 trail torch.compile on the H100 (RMSNorm
    # 2.8%, LayerNorm 1.7% in bench/results/2026-12-06-h100-perwarp/run3): what inductor runs there
    # (its Triton code, configs and PTX), then the default's slice with every one-field
    # neighbour and a cap of 1280 threads (.tailptx/r512) beside torch.compile.
    timeout 200 python3 -m lab.probes.inductor_dump --out "$OUT/inductor" --ops rmsnorm,layernorm \
        --impl torch_compile --dims M=65536,N=512 >"$OUT/inductor.txt" 2>&1
    tail -5 "$OUT/inductor.txt"
    python3 -m lab.probes.probe_tail --out "$OUT/r512" --sets r512=.tailptx/r512 \
        --baselines torch_eager,torch_compile --deadline-s 150 \
        --cases "$(cat .tailptx/r512/cases)" >"$OUT/r512.txt" 2>&1
    head -8 "$OUT/r512.txt"
    ;;
shortrows2)
    # ~4 min, run(carry=[".tailptx"]): rows of 160-256 bf16 (131072 of them) before and after
    # they were admitted under a warp, each set the default's slice with caps of 0 and 1280
    # threads (lab.probes.emit_slice; "before" from a worktree at 092e40f), blocks of 64-256 threads
    # under a warp, 1-4 rows a block of a warp or more; then the GPU test of rows under a warp,
    # which now holds rows of 200 and 256. Ran on an H100: bench/results/2026-12-06-h100-shortrows2.
    PYTHONPATH=. timeout 200 python3 -m lab.probes.probe_tail --out "$OUT/short" \
        --sets before=.tailptx/before,after=.tailptx/after --baselines torch_eager,torch_compile \
        --deadline-s 170 --cases "$(cat .tailptx/after/cases)" >"$OUT/short.txt" 2>&1
    head -12 "$OUT/short.txt"
    timeout 200 python3 -m pytest tests/factory/test_generator_gpu.py -m gpu -o addopts="" \
        -p no:cacheprovider -q -rs -k rows_under_a_warp >"$OUT/pytest.txt" 2>&1
    tail -3 "$OUT/pytest.txt"
    ;;
rowsperthread)
    # ~1 min, run(carry=[".tailptx"]): several rows a thread (rows_per_thread) at rows of
    # 160-512 bf16 beside the default and torch.compile, the set written on the CPU first by
    # bench/results/2026-12-06-h100-rowsperthread/emit_rows_per_thread.py .tailptx/rpt
    PYTHONPATH=. timeout 300 python3 -m lab.probes.probe_tail --out "$OUT/rpt" --sets s=.tailptx/rpt \
        --baselines torch_compile --reps 25 --deadline-s 280 \
        --cases "$(cat .tailptx/rpt/cases)" >"$OUT/rpt.txt" 2>&1
    sed -n 2,17p "$OUT/rpt.txt"
    ;;
tailwarp)
    # ~1 min, run(carry=[".tailptx/tw"]): a warp a row of one chunk a lane at rows it does not
    # fill, under each tail (bench/results/2026-12-06-cpu-tailwarp: written, not yet run)
    PYTHONPATH=. timeout 200 python3 -m lab.probes.probe_tail --out "$OUT/tw" --sets t=.tailptx/tw \
        --baselines torch_compile --reps 15 --deadline-s 180 \
        --cases "$(cat .tailptx/tw/cases)" >"$OUT/tw.txt" 2>&1
    sed -n 2,7p "$OUT/tw.txt"
    ;;
*)
    echo "usage: OUT=DIR bash lab/device/gpu_pending.sh loop|suite|hold|norms|explore|explore2|explore4|final|final2|gputests|longrow|baselines|compiled|drain|mover|movers|clusters|onevec|gap|bulk|place|softmaxw|run17|regrms|foreign|shared|protocol|accsplit|packed|tail|breadth|shift|shortrows|narrow|perrow|perwarp|perwarp2|ragged|ties|rows512|shortrows2|rowsperthread|tailwarp" >&2
    exit 2
    ;;
esac
# (written beside $OUT first: tar fails with "file changed as we read it" on its own output)
T=$(mktemp -d) && tar -C "$OUT" -czf "$T/all.tgz" . && mv "$T/all.tgz" "$OUT/" && ls -la "$OUT"
