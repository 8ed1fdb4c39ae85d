"""The defaults set from the fourth H100 run of the memory-bound cases (bench/results/
2026-12-07-h100-memfamilies-4): at each case's timed shape the family's default is the seed
that won there (its PTX was compared with the run's ptx_sha256, see that README), it compiles
for sm_90a without spills, and the same schedule computes the reference in factory.ptxsim at
small odd shapes of the case's own operator (tails of rows, columns and planes)."""

from __future__ import annotations

import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.spec import load_manifest
from factory.spec.manifest import with_pooled_dims
from lab.memfamilies import bench

# case -> the measured winner's schedule at the timed shape (the run's c1 in each case)
WINNERS = {
    "cumsum_tokens_bf16": {"family": "scan", "threads": 256, "vec": 8, "mode": "columns",
                           "chunks": 1, "split": 1, "lanes": 8, "rows": 8, "ahead": 0},
    "maxpool_nchw_bf16": {"family": "pool", "threads": 128, "lanes": 16, "vec": 4,
                          "layout": "strip", "unroll": 2, "minblocks": 10},
    "instancenorm_bf16": {"family": "segnorm", "threads": 128, "vec": 8, "hold": 4,
                          "prefetch": 0, "minblocks": 9},
    "bn_stats_nhwc_fp32": {"family": "colreduce", "threads": 256, "lanes": 8, "vec": 4,
                           "split": 4, "unroll": 8},
    "bias_grad_fp32": {"family": "colreduce", "threads": 256, "lanes": 8, "vec": 4, "split": 4,
                       "unroll": 8},
}  # fmt: skip


def _case(case):
    w = load_manifest(bench.CASES[case])
    fam, ir = families.family_for(w)
    return w, fam, ir


@pytest.mark.parametrize("case", sorted(WINNERS))
def test_the_default_at_the_timed_shape_is_the_measured_winner(case):
    from factory.compile import compile_ptx

    w, fam, ir = _case(case)
    dims = dict(w.shapes[0])
    d = fam.default_schedule(ir, dims)
    assert d == type(d).from_dict(WINNERS[case])
    assert fam.seeds(ir, dims)[0] == d
    r = compile_ptx(fam.emit(ir, d, "sm_90").ptx, "sm_90a", cache=False)
    assert r.ok and r.spill_store_bytes == 0 and r.spill_load_bytes == 0, r.log[:2000]


def test_the_replaced_defaults_stay_seeds():
    """What each default was before the run, still among the first seeds (timed again)."""
    before = {
        "cumsum_tokens_bf16": {"lanes": 32, "split": 4},
        "maxpool_nchw_bf16": {"minblocks": 0},
        "instancenorm_bf16": {"minblocks": 0},
        "bn_stats_nhwc_fp32": {"unroll": 4},
        "bias_grad_fp32": {"unroll": 4},
    }
    for case, change in before.items():
        w, fam, ir = _case(case)
        dims = dict(w.shapes[0])
        old = type(fam.default_schedule(ir, dims)).from_dict({**WINNERS[case], **change})
        assert old in fam.seeds(ir, dims)[:3], case


def test_the_token_scan_narrows_strips_before_a_cluster():
    """Narrower strips while a thread row reads a whole 128-byte line of a row; a cluster
    only where the strips at that width are still under ~1.5 blocks an SM."""
    w, fam, ir = _case("cumsum_tokens_bf16")
    few = fam.default_schedule(ir, {"B": 1, "S": 8192, "D": 1024})  # 16 strips of 64
    assert (few.lanes, few.vec) == (8, 8) and few.split > 1
    many = fam.default_schedule(ir, {"B": 64, "S": 2048, "D": 1024})
    assert (many.lanes, many.split) == (32, 1)  # enough blocks a warp wide


def test_sixteen_bit_column_reductions_keep_four_rows_in_flight():
    """Eight rows of 16-byte bf16 loads (64 values a thread, 96-98 registers) never timed."""
    w = load_manifest(bench.CASES["bias_grad_bf16"])
    fam, ir = families.family_for(w)
    dims = dict(w.shapes[0])
    d = fam.default_schedule(ir, dims)
    assert d.unroll == 4 and fam.seeds(ir, dims)[1].unroll == 8


# the winners' schedules at small odd shapes: scan's 32 thread rows x 8 rows with the last
# round short and a strip past D; max-pool's bands with odd planes; instance norm's held
# plane with slots past its end; the column sums' eight-row loop, then the rows left
SMALL = [
    ("cumsum_tokens_bf16", {"B": 2, "S": 300, "D": 70}),
    ("maxpool_nchw_bf16", {"N": 1, "C": 3, "H": 17, "W": 45}),
    ("instancenorm_bf16", {"N": 2, "C": 3, "H": 7, "W": 33}),
    ("bn_stats_nhwc_fp32", {"N": 3, "H": 5, "W": 71, "C": 37}),
    ("bias_grad_fp32", {"T": 1100, "C": 41}),
]


@pytest.mark.parametrize("case, dims", SMALL, ids=lambda v: str(v))
def test_the_winners_compute_the_reference_at_small_odd_shapes(case, dims):
    w, fam, ir = _case(case)
    s = type(fam.default_schedule(ir, dict(w.shapes[0]))).from_dict(WINNERS[case])
    if case.startswith("maxpool"):
        dims = with_pooled_dims(w.outputs, dims)
    run_and_check(fam, w, s, dims, seed=11)
