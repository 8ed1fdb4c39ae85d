"""Generated PTX run on the CPU in factory.ptxsim, the interpreter for the PTX subset our emitters
print: every emitted code path (vector and tail paths, register and streaming rows, online
max/sum, next-row prefetch, gathers, several reductions, clusters, rows under a warp, several
rows a thread) is checked against factory.spec's float64 reference, and each warp's lanes are
checked to take one path where the emitter promises it."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from factory import families
from factory.emit import EmitError, emit
from factory.families.row.ir import lower
from factory.families.row.schedules import Schedule, default_schedule, is_valid
from factory.ptxsim import run_kernel
from factory.spec import load_catalogue, random_inputs, reference, to_float64


def row_catalogue():
    """The catalogue operators the row IR lowers and the row emitter writes: the row family's and
    those of the families that refine its shape (flat, rowsplit). Attention, matmul and the
    other families are simulated in their own tests."""
    return {
        name: w
        for name, w in load_catalogue().items()
        if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
    }


# ---------------------------------------------------------------- the checks


def check(
    name: str,
    schedule: Schedule,
    dims: dict,
    seed: int = 0,
    grid: int | None = None,
    inputs: dict | None = None,
    workload=None,
    skew: dict = {},
    warps: list | None = None,
):
    w = workload or load_catalogue()[name]
    ir = lower(w)
    em = emit(ir, schedule)
    inputs = random_inputs(w, dims, seed) | (inputs or {})
    arrays = dict(inputs)
    for o in w.outputs:
        shape = tuple(int(dims[d]) if isinstance(d, str) else d for d in o.shape)
        dt = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32}[o.dtype]
        if o.dtype == "fp32":
            arrays[o.name] = np.full(shape, np.nan, dtype=np.float32)
        else:  # all ones: a NaN in either 16-bit format
            arrays[o.name] = np.full(shape, 0xFFFF, dtype=np.uint16).view(dt)
    out = run_kernel(em, dims, arrays, grid, skew, warps)
    ref = reference(w, inputs, dims)
    for o in w.outputs:
        got = np.frombuffer(out[o.name], dtype=arrays[o.name].dtype).reshape(arrays[o.name].shape)
        got = to_float64(got, o.dtype)
        want = np.asarray(ref[o.name], dtype=np.float64).reshape(got.shape)
        tol = w.tolerance[o.dtype]
        assert np.isfinite(got).all(), f"{o.name}: unwritten or non-finite elements"
        rel = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
        assert rel <= tol.rel_norm, f"{o.name}: relative error {rel:.2e}"
        bad = ~(np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want))
        assert not bad.any(), f"{o.name}: {int(bad.sum())} elements out of tolerance"


def _small(name: str, **kw) -> Schedule:
    ir = lower(load_catalogue()[name])
    # (a row of 512: a warp of two chunks, the layout the cases below adjust)
    base = default_schedule(ir, {ir.row_dim: 512, **{d: 2 for d in ir.batch_dims}})
    return replace(base, **({"threads_per_row": 32, "rows_per_block": 1, "chunks": 2} | kw))


# Row lengths around a warp's register capacity of 32 threads x 8 x 2 chunks = 512: a tail, an
# exact fit, a multiple of 8 below it, an odd length, and past it (the streaming fallback).
CASES = [
    ("softmax", {}, [40, 512, 264, 600]),
    ("softmax", {"prefetch_rows": True, "persistent_blocks_per_sm": 1}, [512, 77]),
    ("softmax", {"keep_intermediates": False}, [300]),
    ("softmax", {"mode": "stream", "online": True, "chunks": 1}, [520, 37]),
    ("cross_entropy", {"mode": "stream", "online": True, "chunks": 2}, [700, 33]),
    ("cross_entropy", {}, [512, 100]),
    # the default below 4096 rows: four warps share a streamed row through shared memory
    (
        "cross_entropy",
        {"mode": "stream", "online": True, "chunks": 4, "threads_per_row": 128},
        [4200],
    ),
    ("layernorm", {}, [512, 129]),
    ("layernorm", {"prefetch_rows": True, "persistent_blocks_per_sm": 1}, [256]),
    ("add_rmsnorm", {}, [512, 70]),
    ("add_rmsnorm", {"late_stores": True}, [512, 70, 600]),
    ("add_rmsnorm", {"late_stores": True, "early_cols": True}, [512, 70]),
    ("layernorm", {"early_cols": True}, [512, 129, 600]),
    ("layernorm", {"moments": True}, [512, 129, 600, 5]),
    ("layernorm", {"moments": True, "threads_per_row": 64}, [512, 77, 1100]),
    ("layernorm", {"moments": True, "mode": "stream", "chunks": 1}, [700, 33]),
    ("rmsnorm", {"min_threads_per_sm": 1024}, [136]),
    # the weight and bias loaded, and y stored, one chunk at a time (fenced groups); 4 chunks
    ("layernorm", {"col_groups": 4, "chunks": 4}, [1024, 1000, 129, 1100]),
    ("layernorm", {"col_groups": 2, "chunks": 4, "moments": True}, [1024, 77]),
    ("rmsnorm", {"col_groups": 2, "threads_per_row": 64, "rows_per_block": 2}, [512, 77]),
    ("add_rmsnorm", {"col_groups": 2, "late_stores": True}, [512, 70]),
    # two multi-warp row groups per block on the block barrier; 3 rows, so the second block's
    # second group has no row: it follows the last row with its stores off
    ("rmsnorm", {"threads_per_row": 64, "rows_per_block": 2}, [512, 77]),
    ("layernorm", {"threads_per_row": 64, "rows_per_block": 2, "moments": True}, [300]),
    ("cross_entropy", {"threads_per_row": 64, "rows_per_block": 2}, [256, 99]),
    ("softmax", {"threads_per_row": 64, "rows_per_block": 2, "mode": "stream"}, [700]),
    # L2 cache policies on row loads and on stores
    ("add_rmsnorm", {"load_hint": "nc_l2last", "store_hint": "l2first"}, [512, 70]),
    ("softmax", {"load_hint": "nc_l2first", "store_hint": "l2last"}, [512, 33]),
    # a streamed row kept in L2 for its second read, the weight with the evict-last policy
    ("rmsnorm", {"mode": "stream", "chunks": 1, "load_hint": "nc_l2reuse"}, [512, 77]),
    ("layernorm", {"mode": "stream", "load_hint": "nc_l2reuse", "col_hint": "nc_l2last"}, [700]),
    ("add_rmsnorm", {"col_hint": "nc_l2last", "early_cols": True}, [512, 70]),
    ("rmsnorm", {"load_hint": "plain_l2last", "col_hint": "nc_l2last"}, [512, 77]),
    ("silu_mul", {}, [512, 9]),
    ("gelu_tanh", {}, [256, 31]),
    ("log_softmax", {"mode": "stream", "online": True, "chunks": 1}, [300]),
    ("masked_softmax", {}, [64]),
    # online max/sum where a thread's first group is all masked (-1e30): its own max is -1e30
    ("masked_softmax", {"online": True}, [129, 513]),
    ("masked_softmax", {"mode": "stream", "online": True, "chunks": 1}, [129, 300]),
    ("row_sum", {}, [100]),
    ("l2norm", {}, [48]),
    # partial accumulators per thread (pairwise trees), in both modes and in the tail path
    ("rmsnorm", {"acc_split": 4}, [512, 77]),
    ("rmsnorm", {"acc_split": 2, "mode": "stream", "chunks": 2}, [700, 33]),
    ("layernorm", {"acc_split": 8, "col_groups": 2, "chunks": 4}, [1024, 129]),
    ("softmax", {"acc_split": 4, "online": True}, [512, 33]),
    ("masked_softmax", {"acc_split": 2, "mode": "stream", "online": True, "chunks": 1}, [129]),
    ("row_max", {"acc_split": 4}, [100, 3]),
    # the gathered logit loaded as the row starts, streamed and cached, with and without trees
    (
        "cross_entropy",
        {"mode": "stream", "online": True, "chunks": 2, "early_gather": True},
        [700, 33],
    ),
    ("cross_entropy", {"early_gather": True, "acc_split": 4}, [512, 100]),
    # the online max on packed pairs (rows of a multiple of 8 take the whole-chunk path, the
    # others only the tail's): streamed (five chunks, a tail one chunk at a time), cached,
    # with trees
    (
        "cross_entropy",
        {"mode": "stream", "online": True, "chunks": 5, "packed_max": True},
        [1360, 2560, 33, 700],
    ),
    ("softmax", {"online": True, "packed_max": True, "acc_split": 2}, [512, 77, 600]),
    ("log_softmax", {"mode": "stream", "online": True, "chunks": 2, "packed_max": True}, [1200]),
    # one copy of the row's code per path (split_paths): whole rows, a tail of whole vectors,
    # a tail element by element (odd lengths, misaligned), the streaming fallback past 512
    ("layernorm", {"split_paths": True, "tail": "vectors"}, [512, 264, 129, 600]),
    ("layernorm", {"split_paths": True, "tail": "vectors", "moments": True}, [512, 264, 77]),
    ("layernorm", {"split_paths": True, "tail": "strided", "early_cols": True}, [512, 301]),
    ("rmsnorm", {"split_paths": True, "threads_per_row": 64, "rows_per_block": 2}, [512, 77]),
    ("add_rmsnorm", {"split_paths": True, "late_stores": True, "tail": "vectors"}, [512, 264]),
    ("softmax", {"split_paths": True, "online": True, "tail": "vectors"}, [512, 264, 33, 600]),
    ("cross_entropy", {"split_paths": True, "early_gather": True}, [512, 100]),
    ("silu_mul", {"split_paths": True, "col_groups": 2}, [512, 9]),
    (
        "cross_entropy",
        {
            "mode": "stream",
            "online": True,
            "chunks": 4,
            "threads_per_row": 128,
            "early_gather": True,
            "acc_split": 8,
        },
        [1100],
    ),
    # the tail as whole vectors (tail="vectors"): rows of a multiple of 8 that the layout does not
    # divide take it (cached rows under the capacity, a streamed row's last step), an odd row
    # length the element-by-element tail beside it, an exact fit neither
    ("rmsnorm", {"tail": "vectors"}, [264, 504, 77, 512]),
    ("add_rmsnorm", {"tail": "vectors", "late_stores": True}, [264, 70, 600]),
    ("layernorm", {"tail": "vectors", "moments": True, "col_groups": 2, "chunks": 4}, [1000, 77]),
    ("layernorm", {"tail": "vectors", "early_cols": True}, [392, 600]),
    ("softmax", {"tail": "vectors"}, [264, 40, 77, 600]),
    ("softmax", {"tail": "vectors", "online": True, "packed_max": True}, [136, 77]),
    ("softmax", {"tail": "vectors", "mode": "stream", "online": True, "chunks": 2}, [1096, 33]),
    (
        "cross_entropy",
        {"tail": "vectors", "mode": "stream", "online": True, "chunks": 5, "packed_max": True},
        [1448, 700],
    ),
    ("silu_mul", {"tail": "vectors", "threads_per_row": 64, "rows_per_block": 2}, [520, 9]),
    ("gelu_tanh", {"tail": "vectors", "prefetch_rows": True, "persistent_blocks_per_sm": 1}, [136]),
    (
        "rmsnorm",
        {"tail": "vectors", "mode": "stream", "chunks": 2, "load_hint": "nc_l2reuse"},
        [584],
    ),
    # the element tail strided T apart (tail="strided"), at lengths that are not multiples of 8
    # (every row takes it), and at a multiple of 8 under the capacity (the same tail)
    ("rmsnorm", {"tail": "strided"}, [77, 511, 264]),
    ("add_rmsnorm", {"tail": "strided", "late_stores": True}, [70, 601]),
    ("layernorm", {"tail": "strided", "moments": True, "col_groups": 2, "chunks": 4}, [1001, 5]),
    ("layernorm", {"tail": "strided", "threads_per_row": 64, "rows_per_block": 2}, [300]),
    ("softmax", {"tail": "strided", "online": True, "packed_max": True}, [77, 129]),
    ("softmax", {"tail": "strided", "mode": "stream", "online": True, "chunks": 2}, [1097]),
    ("cross_entropy", {"tail": "strided", "mode": "stream", "online": True, "chunks": 2}, [701]),
    ("silu_mul", {"tail": "strided"}, [9, 333]),
    ("gelu_tanh", {"tail": "strided", "prefetch_rows": True, "persistent_blocks_per_sm": 1}, [131]),
    ("row_max", {"tail": "strided", "acc_split": 4}, [99]),
    # streamed rows walked from the aligned address at or before their start (tail="shifted"):
    # three rows start 0, N%8 and 2N%8 elements past a 16-byte boundary; a step of 512 (32
    # threads x 8 x 2 chunks) or 256; one row shorter than a step (its only step is the first
    # and the last), rows of a multiple of 8 (no shift), of 1097 (three steps, the middle whole)
    ("cross_entropy", {"tail": "shifted", "mode": "stream", "online": True}, [1097, 701, 37]),
    ("cross_entropy", {"tail": "shifted", "mode": "stream", "online": True, "chunks": 1}, [523]),
    ("softmax", {"tail": "shifted", "mode": "stream", "online": True}, [1099, 520, 45]),
    ("softmax", {"tail": "shifted", "mode": "stream", "keep_intermediates": False}, [605]),
    ("log_softmax", {"tail": "shifted", "mode": "stream", "online": True}, [1030]),
    ("row_sum", {"tail": "shifted", "mode": "stream", "acc_split": 2}, [1101]),
    ("silu_mul", {"tail": "shifted", "mode": "stream", "threads_per_row": 64}, [1277]),
    ("rmsnorm", {"tail": "shifted", "mode": "stream"}, [1101, 515]),
    # rows held in registers (32 threads x 8 x 2 chunks = 512 places: shorter rows shifted,
    # 509 filling the window to 509 + a <= 516 places, longer rows through the stream fallback)
    ("softmax", {"tail": "shifted"}, [501, 77, 509, 601]),
    ("softmax", {"tail": "shifted", "online": True, "rows_per_block": 4}, [333, 35]),
    ("rmsnorm", {"tail": "shifted"}, [499, 77]),
    ("rmsnorm", {"tail": "shifted", "early_cols": True, "threads_per_row": 64}, [999]),
    ("add_rmsnorm", {"tail": "shifted", "chunks": 4, "col_groups": 2}, [1021, 3]),
    ("layernorm", {"tail": "shifted", "threads_per_row": 64}, [1001, 13]),
    # a row of odd width loads its columns one chunk at a time (3 groups of 1)
    ("layernorm", {"tail": "shifted", "chunks": 3, "col_groups": 3}, [761, 700, 9]),
    ("l2norm", {"tail": "shifted"}, [413]),
    ("cross_entropy", {"tail": "shifted", "online": True}, [467]),
    # elementwise rows walked as one run of tiles of 512 (flat): 3 rows of 77 (one short tile),
    # of 512 (three whole ones), of 333 (one whole, one short), of 9; a last tile of whole
    # vectors (3 x 80) under the vector tail; 2048-element tiles of 64 threads x 4 chunks
    ("silu_mul", {"flat": True}, [77, 512, 333, 9]),
    ("silu_mul", {"flat": True, "tail": "vectors"}, [80, 77]),
    ("gelu_tanh", {"flat": True, "threads_per_row": 64, "chunks": 4}, [700, 1001]),
]


@pytest.mark.parametrize(("name", "kw", "lengths"), CASES)
def test_emitted_ptx_computes_the_reference_in_the_cpu_interpreter(name, kw, lengths):
    w = load_catalogue()[name]
    ir = lower(w)
    s = _small(name, **kw)
    for n in lengths:
        dims = {ir.row_dim: n, **{d: 3 for d in ir.batch_dims}}
        check(name, s, dims, seed=n)
        if s.persistent_blocks_per_sm:
            check(name, s, dims, seed=n + 1, grid=2)  # blocks that loop: 2 rows, then 1


def test_a_block_of_several_warps_reduces_through_shared_memory():
    ir = lower(load_catalogue()["softmax"])
    s = replace(
        default_schedule(ir, {"M": 2, "N": 512}), threads_per_row=64, rows_per_block=1, chunks=1
    )
    check("softmax", s, {"M": 2, "N": 500}, seed=1)
    s = replace(s, mode="stream", online=True)
    check("softmax", s, {"M": 2, "N": 700}, seed=2)


def test_the_interpreter_catches_a_wrong_kernel():
    w = load_catalogue()["softmax"]
    ir = lower(w)
    em = emit(ir, _small("softmax"))
    broken = em.ptx.replace("rcp.rn.f32", "sqrt.rn.f32")  # y = e * sqrt(sum) instead of e / sum
    with pytest.raises(AssertionError):
        dims = {"M": 2, "N": 64}
        inputs = random_inputs(w, dims, 0)
        out = run_kernel(
            replace(em, ptx=broken), dims, dict(inputs) | {"y": np.full((2, 64), 0xFFFF, np.uint16)}
        )
        got = to_float64(np.frombuffer(out["y"], dtype=np.uint16).reshape(2, 64), "bf16")
        want = reference(w, inputs, dims)["y"]
        assert np.abs(got - want).max() < 1e-2


def example_ir(name: str):
    """A hand-built DAG of tests/factory/test_ir_examples.py, lowered."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_ir_examples import EXAMPLES

    return EXAMPLES[name]()


def check_dag(ir, em, dims: dict, seed: int) -> None:
    """Run `em` in the interpreter over fresh inputs at `dims` and compare every output with
    the float64 evaluation of the IR's DAG (fp32 outputs to 1e-5, 16-bit ones to 5e-3)."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_generator_gpu import STORAGE, make_inputs, to_f64
    from test_ir_examples import eval64

    m, n = dims["M"], dims["N"]
    host, f64 = make_inputs(ir, dims, np.random.default_rng(seed))
    arrays = dict(host)
    for o in ir.outputs:
        shape = (m, n) if o.role == "row" else (m,)
        arrays[o.name] = np.full(shape, np.nan).astype(STORAGE[o.dtype])
    out = run_kernel(em, dims, arrays)
    for o in ir.outputs:
        got = np.frombuffer(out[o.name], dtype=arrays[o.name].dtype)
        got = to_f64(got.reshape(arrays[o.name].shape), o.dtype)
        want = np.broadcast_to(eval64(o.node, f64), (m, n) if o.role == "row" else (m, 1))
        want = want.reshape(got.shape)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        tol = 1e-5 if o.dtype == "fp32" else 5e-3
        assert np.isfinite(got).all() and rel < tol, (o.name, dims, rel)


@pytest.mark.parametrize("name", ["gelu_tanh_fp16", "masked_scaled_sum", "softmax_fp32"])
def test_hand_built_dags_with_fp16_fp32_compares_and_precise_math_run_correctly(name):
    """fp16 and fp32 storage, where/compare, erf, min, per-row scalars, and the precise (not
    fast-math) division, sqrt and tanh paths, against the float64 evaluation of the same DAG."""
    ir = example_ir(name)
    # (the default at a row of 512: a warp of two chunks, as the layout asks)
    s = replace(default_schedule(ir, {"M": 3, "N": 512}), threads_per_row=32, chunks=2)
    if name == "gelu_tanh_fp16":
        s = replace(s, fast_math=False)  # the precise tanh: polynomial near 0, exp form beyond
    em = emit(ir, s)
    for n in (256, 45):
        check_dag(ir, em, {"M": 3, "N": n}, seed=n)


def test_the_online_max_on_packed_bf16_pairs_keeps_wide_logits_finite():
    """Logits 12 times the catalogue's range (|x| up to 96): any shift but the row's max lets
    exp overflow, so a wrong packed max fails here (within the range, the shift cancels)."""
    w = load_catalogue()["cross_entropy"]
    ir = lower(w)
    for kw in ({"mode": "stream", "chunks": 3}, {}):
        s = _small("cross_entropy", online=True, packed_max=True, **kw)
        assert "max.bf16x2" in emit(ir, s).ptx
        dims = {"M": 3, "V": 1040}  # a multiple of 8: the whole-chunk path runs
        x = random_inputs(w, dims, 5)["logits"]
        wide = (np.asarray(x, np.uint16).astype(np.uint32) << 16).view(np.float32) * 12
        logits = (wide.view(np.uint32) >> 16).astype(np.uint16)
        check("cross_entropy", s, dims, seed=5, inputs={"logits": logits})


def test_the_online_max_on_packed_fp16_pairs_computes_the_reference():
    """packed_max with fp16 logits (max.f16x2), streamed with a tail and cached."""
    from pathlib import Path

    from factory.spec import load_manifest

    text = (Path(__file__).parents[2] / "factory/catalogue/softmax.toml").read_text()
    w = load_manifest(text.replace('dtype = "bf16"', 'dtype = "fp16"'))
    assert w.inputs[0].dtype == "fp16"
    ir = lower(w)
    base = default_schedule(ir, {"M": 2, "N": 512})  # (a warp a row)
    for kw, n in (({"mode": "stream", "chunks": 3}, 1000), ({"chunks": 2}, 504)):
        s = replace(base, threads_per_row=32, rows_per_block=1, online=True, packed_max=True, **kw)
        assert "max.f16x2" in emit(ir, s).ptx
        check("softmax", s, {"M": 3, "N": n}, seed=n, workload=w)


# A row shared by a cluster of blocks (small blocks here, 1024 on the GPU): each block reduces its
# part, publishes it in shared memory and reads the others' through distributed shared memory.
CLUSTER_CASES = [
    ("softmax", {}, [1500, 2048, 3000]),  # a tail, an exact fit, the streaming fallback
    ("softmax", {"mode": "stream", "online": True, "chunks": 1}, [2100]),
    ("cross_entropy", {"mode": "stream", "online": True, "chunks": 1}, [2500]),
    ("cross_entropy", {"online": True}, [1800]),
    ("layernorm", {}, [2000]),
    ("add_rmsnorm", {}, [1999]),
    # one copy of the row's code per path, across the cluster: whole, vectors, elements, stream
    ("softmax", {"split_paths": True, "tail": "vectors"}, [2048, 1504, 1500, 3000]),
    ("layernorm", {"split_paths": True, "early_cols": True}, [2048, 2000]),
]


@pytest.mark.parametrize(("name", "kw", "lengths"), CLUSTER_CASES)
def test_a_row_shared_by_a_cluster_computes_the_reference(name, kw, lengths):
    ir = lower(load_catalogue()[name])
    s = _small(name, **({"threads_per_row": 128, "cluster_blocks": 2, "chunks": 2} | kw))
    em = emit(ir, s)
    assert em.launch.cluster == (2, 1, 1) and em.launch.block == (64, 1, 1)
    assert ".reqnctapercluster 2, 1, 1" in em.ptx and "ld.shared::cluster.f32" in em.ptx
    for n in lengths:
        check(name, s, {ir.row_dim: n, **{d: 3 for d in ir.batch_dims}}, seed=n)


def test_the_interpreter_catches_a_cluster_that_skips_the_other_blocks():
    ir = lower(load_catalogue()["softmax"])
    s = _small("softmax", threads_per_row=128, cluster_blocks=2, chunks=2)
    em = emit(ir, s)
    # every block reads rank 0's partials twice: rank 1's half of the row is left out of the sum
    # (the max alone would not show: softmax does not depend on the constant subtracted)
    broken = re.sub(r"(mapa\.shared::cluster\.u32 %r\d+, %r\d+), 1;", r"\1, 0;", em.ptx)
    assert broken != em.ptx
    with pytest.raises(AssertionError):
        w = load_catalogue()["softmax"]
        dims = {"M": 2, "N": 2000}
        inputs = random_inputs(w, dims, 0)
        out = run_kernel(
            replace(em, ptx=broken),
            dims,
            dict(inputs) | {"y": np.full((2, 2000), 0xFFFF, np.uint16)},
        )
        got = to_float64(np.frombuffer(out["y"], dtype=np.uint16).reshape(2, 2000), "bf16")
        want = np.asarray(reference(w, inputs, dims)["y"], dtype=np.float64).reshape(got.shape)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_moments_keep_the_variance_of_rows_far_from_zero():
    """LayerNorm with one pass for the mean and variance, on rows around 4000 with a spread of
    about 40 (the variance 10^4 times smaller than the squared mean, where a one-pass sum of
    squares starts to cancel): Chan's merge of per-thread deviations stays within tolerance."""
    w = load_catalogue()["layernorm"]
    ir = lower(w)
    s = replace(_small("layernorm"), threads_per_row=64, moments=True)
    em = emit(ir, s)
    dims = {"M": 3, "N": 600}  # a tail: some threads hold fewer elements than others
    inputs = random_inputs(w, dims, 7)
    x = 4000.0 + 40.0 * np.random.default_rng(7).standard_normal((3, 600))
    inputs["x"] = (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    out = run_kernel(em, dims, dict(inputs) | {"y": np.full((3, 600), 0xFFFF, np.uint16)})
    got = to_float64(np.frombuffer(out["y"], dtype=np.uint16).reshape(3, 600), "bf16")
    want = np.asarray(reference(w, inputs, dims)["y"], dtype=np.float64)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < w.tolerance["bf16"].rel_norm, rel


@pytest.mark.parametrize(
    "kw",
    [{}, {"online": True}, {"mode": "stream", "online": True, "chunks": 1}],
    ids=["two-pass", "online", "streamed-online"],
)
def test_masked_softmax_with_a_causal_mask_and_a_fully_masked_row(kw):
    # Row i keeps columns 0..i (a causal mask), so most threads see only masked elements, and
    # the last row keeps nothing: softmax of an all -1e30 row is uniform, as the reference says.
    # The online path once took exp(v - m) as one fma against a rounded -m*log2(e), whose
    # rounding at m = -1e30 is ~1e23: exp2 of it is inf, and the row came out NaN.
    m, n = 4, 300
    keep = (np.arange(n)[None, :] <= np.arange(m)[:, None]).astype(np.int32)
    keep[-1] = 0
    check("masked_softmax", _small("masked_softmax", **kw), {"M": m, "N": n}, inputs={"keep": keep})


@pytest.mark.parametrize("skew", [{"y": 2}, {"x": 6, "y": 6}, {"x": 4}, {"w": 2}])
def test_shifted_rows_at_any_offset_of_their_tensors_compute_the_reference(skew):
    # {"y": 2}: the output two bytes off the input's alignment, so no shift fits both: every
    # step moves element by element; {"x": 6, "y": 6}: both 6 bytes past a 16-byte boundary,
    # congruent, so the first row starts shifted too; {"x": 4}: the input alone off
    for name, kw in (("softmax", {"mode": "stream", "online": True}), ("rmsnorm", {})):
        s = _small(name, tail="shifted", **kw)
        for n in (701, 64, 333):
            check(name, s, {"N": n, "M": 3}, seed=n, skew=skew)


def test_split_paths_take_one_copy_of_the_row_per_path():
    # the per-pass branch between whole chunks and the tail is gone: the row picks its path
    # once, and a shifted row (rows at every offset) walks its own copy
    ir = lower(load_catalogue()["layernorm"])
    joined = emit(ir, _small("layernorm", tail="vectors")).ptx
    split = emit(ir, _small("layernorm", tail="vectors", split_paths=True)).ptx
    assert "_p0_tail_" in joined and "$L_row_tail_" not in joined
    assert "$L_row_tail_" in split and "$L_row_elems_" in split
    cached = split.split("$L_long_row_")[1]  # the rows in registers (the stream path follows)
    assert "$L_p0_tail_" not in cached and "$L_load_tail_" not in cached
    dims = {"N": 512, "M": 2}
    for kw in ({"mode": "stream"}, {"flat": True}, {"prefetch_rows": True}):
        assert not is_valid(ir, _small("layernorm", split_paths=True, **kw), dims)[0]
    s = _small("rmsnorm", tail="shifted", split_paths=True)
    check("rmsnorm", s, {"N": 333, "M": 9}, seed=3)
    check("rmsnorm", s, {"N": 333, "M": 3}, seed=4, skew={"x": 6, "y": 6})


@pytest.mark.parametrize("n", [701, 333, 4999])
def test_shifted_rows_of_norms_at_every_row_offset(n):
    # M = 9 rows of an odd length start at every offset within 16 bytes, so the chunks that
    # straddle a row's ends hold zeros in up to 7 places: RMSNorm's and add+RMSNorm's sums of
    # squares and LayerNorm's mean add them as they are, LayerNorm's variance must not (its
    # rows around 50 with a spread of 1: each such zero would add 2500 to the sum)
    x = 50.0 + np.random.default_rng(n).standard_normal((9, n))
    far = {"x": (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)}
    for name, kw in (
        ("layernorm", {}),
        ("layernorm", {"early_cols": True, "threads_per_row": 64}),
        ("add_rmsnorm", {}),
        ("rmsnorm", {"mode": "stream", "chunks": 1}),
    ):
        s = _small(name, tail="shifted", **kw)
        if s.mode == "cached":  # the fewest chunks that hold the row and the places before it
            s = replace(s, chunks=-(-(n + 7) // (s.threads_per_row * s.vec_elems)))
        check(name, s, {"N": n, "M": 9}, seed=n, inputs=far if name == "layernorm" else None)


def test_sums_that_take_zero_padding_as_it_is():
    from factory.families.row.kernel import RowKernel

    def padded(name, workload=None):
        ir = lower(workload or load_catalogue()[name])
        rk = RowKernel(ir, _small(name, tail="shifted"))
        rk.render()
        return [rk._zero_padded(r) for r in ir.reductions]

    assert padded("rmsnorm") == [True]  # sum of x * x
    assert padded("add_rmsnorm") == [True]  # sum of (x + r)^2
    assert padded("l2norm") == [True]
    assert padded("softmax") == [False, False]  # a max, and a sum of exp(x - max)
    assert sorted(padded("layernorm")) == [False, True]  # the mean, the variance
    from factory.spec import catalogue_manifest, load_manifest

    # erf as emitted (a rational approximation) is not exactly 0 at 0
    text = catalogue_manifest("rmsnorm").replace("mean(x * x,", "mean(erf(x) * erf(x),")
    assert padded("rmsnorm", load_manifest(text)) == [False]


def test_shifted_rows_of_four_byte_elements_zero_the_places_outside_the_row():
    # fp32 rows of 203 (812 bytes: every row at another offset within 16 bytes): a chunk that
    # straddles a row's end loads element by element, and the places past the end must read 0
    # (a max over them would take whatever the registers held)
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from test_generator_gpu import STORAGE, make_inputs, to_f64
    from test_ir_examples import EXAMPLES, eval64

    ir = EXAMPLES["softmax_fp32"]()
    s = replace(default_schedule(ir, {"M": 5, "N": 256}), threads_per_row=32, chunks=2)
    s = replace(s, tail="shifted", vec_elems=4)
    dims = {"M": 5, "N": 203}
    assert is_valid(ir, s, dims)[0]
    em = emit(ir, s)
    assert "$L_shift_elems_" in em.ptx
    host, f64 = make_inputs(ir, dims, np.random.default_rng(203))
    arrays = dict(host) | {o.name: np.full((5, 203), np.nan, STORAGE[o.dtype]) for o in ir.outputs}
    out = run_kernel(em, dims, arrays)
    for o in ir.outputs:
        got = to_f64(np.frombuffer(out[o.name], dtype=STORAGE[o.dtype]).reshape(5, 203), o.dtype)
        want = np.broadcast_to(eval64(o.node, f64), (5, 203))
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.parametrize(
    "name", ["softmax", "layernorm", "add_rmsnorm", "cross_entropy", "masked_softmax", "row_max"]
)
def test_rows_under_a_warp_compute_the_reference_and_every_lane_reaches_each_shuffle(name):
    """Several rows share a warp (4-16 threads each): each reduces over its own lanes. With 7
    rows, the last block's groups past the end work on the last row with their stores off, so
    that every lane of the warp reaches each shuffle (the interpreter refuses a shuffle from
    part of a warp). Rows at the layout's length, with a tail, and longer than it holds (the
    stream path of the same kernel)."""
    ir = lower(load_catalogue()[name])
    cases = [(64, 8, 4, {}), (37, 4, 8, {}), (100, 16, 2, {"tail": "strided"}), (5, 4, 8, {})]
    # 8-byte chunks, which start every row of 100 bf16 aligned (200-byte rows)
    cases += [
        (100, t, 32 // t, {"vec_elems": 4, "chunks": 32 // t, "tail": "vectors"}) for t in (8, 16)
    ]
    if ir.online:
        cases.append((60, 8, 4, {"online": True}))
    for n, t, r, kw in cases:
        for length in (n, 300):
            dims = {ir.batch_dims[0]: 7, ir.row_dim: length}
            s = default_schedule(ir, {ir.batch_dims[0]: 7, ir.row_dim: n})
            s = replace(s, threads_per_row=t, rows_per_block=r, **kw)
            check(name, s, dims, seed=n + length)


def test_the_interpreter_catches_rows_under_a_warp_that_reduce_across_rows():
    w = load_catalogue()["rmsnorm"]
    ir = lower(w)
    dims = {"M": 4, "N": 64}
    s = replace(default_schedule(ir, dims), rows_per_block=4)
    em = emit(ir, s)
    assert "shfl.sync.bfly.b32" in em.ptx and ", 8, 31, -1" not in em.ptx
    # a butterfly over the whole warp sums the four rows that share it
    wrong = em.ptx.replace(", 4, 31, -1;", ", 8, 31, -1;")
    assert wrong != em.ptx
    inputs = random_inputs(w, dims, 0)
    out = run_kernel(
        replace(em, ptx=wrong), dims, dict(inputs) | {"y": np.full((4, 64), 0xFFFF, np.uint16)}
    )
    got = to_float64(np.frombuffer(out["y"], dtype=np.uint16).reshape(4, 64), "bf16")
    want = reference(w, inputs, dims)["y"]
    assert np.abs(got - want).max() > 0.05


@pytest.mark.parametrize(
    "name", ["layernorm", "rmsnorm", "softmax", "add_rmsnorm", "cross_entropy"]
)
def test_rows_under_a_warp_in_a_persistent_grid_leave_the_row_loop_as_one_warp(name):
    """A grid of one or two blocks loops over 7 or 37 rows: the last pass of a warp has groups
    past the last row, which work on it with their stores off, so that every lane reaches each
    shuffle (the interpreter refuses a shuffle from part of a warp); with the next row
    prefetched or not, and per-column vectors held across rows (early_cols) or not."""
    ir = lower(load_catalogue()[name])
    cols = any(t.role == "col" for t in ir.inputs)
    for n, kw in [(100, {"vec_elems": 4, "chunks": 4}), (64, {}), (300, {})]:
        base = default_schedule(ir, {ir.batch_dims[0]: 64, ir.row_dim: min(n, 100)})
        for prefetch, early in [(False, False), (True, False), (False, True), (True, True)]:
            if early and not cols:
                continue
            s = replace(
                base,
                threads_per_row=8,
                rows_per_block=4,
                persistent_blocks_per_sm=1,
                prefetch_rows=prefetch,
                early_cols=early,
                **kw,
            )
            for m, grid in [(7, 1), (37, 2)]:
                dims = {ir.batch_dims[0]: m, ir.row_dim: n}
                check(name, s, dims, seed=n + m, grid=grid)


def test_the_interpreter_catches_a_warp_whose_rows_leave_the_loop_apart():
    w = load_catalogue()["rmsnorm"]
    ir = lower(w)
    dims = {"M": 7, "N": 64}
    s = replace(default_schedule(ir, dims), rows_per_block=4, persistent_blocks_per_sm=1)
    em = emit(ir, s)
    lines = em.ptx.splitlines()
    at = next(i for i, ln in enumerate(lines) if "leave the loop together" in ln) + 1
    # the exit test on each group's own row instead of the warp's first row
    op, dst, src, _lead = lines[at].replace(",", " ").replace(";", " ").split()
    assert op == "sub.u32"
    lines[at] = f"    mov.u32 {dst}, {src};"
    wrong = replace(em, ptx="\n".join(lines) + "\n")
    inputs = random_inputs(w, dims, 0)
    arrays = dict(inputs) | {"y": np.full((7, 64), 0xFFFF, np.uint16)}
    with pytest.raises(AssertionError, match="shuffle|lanes|warp"):
        run_kernel(wrong, dims, arrays, grid=1)
    run_kernel(em, dims, arrays, grid=1)  # (the kernel as emitted runs)


def branch_traces(name: str, s: Schedule, dims: dict, seed: int) -> list:
    """check() the kernel, and return each warp's per-lane traces of taken branches."""
    warps: list = []
    check(name, s, dims, seed=seed, warps=warps)
    return warps


def one_path(lanes: list) -> bool:
    """Whether every lane of a warp took the same branches."""
    return lanes == lanes[:1] * len(lanes)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax", "cross_entropy"])
def test_the_threads_of_a_row_under_a_warp_take_one_path(name):
    """A joined kernel (no split_paths) chooses between whole chunks and the tail per row when
    the row is under a warp, not per thread: at rows of 100 in 8 threads of four 8-byte chunks
    only thread 0's chunks are whole, and a choice per thread would run both paths in every
    warp. Every lane of a warp then takes the same branches: in registers (100, 128), and
    streamed (300, with a ragged last step), with the tail "stream" and "vectors". So does a
    row of one warp in registers (the default at 1000 columns: 32 threads of four chunks)."""
    ir = lower(load_catalogue()[name])
    base = default_schedule(ir, {ir.batch_dims[0]: 64, ir.row_dim: 100})
    assert base.threads_per_row == 8 and base.split_paths
    cases = [
        (replace(base, split_paths=False, **kw), (100, 128, 300))
        for kw in [{}, {"tail": "vectors"}, {"threads_per_row": 4, "chunks": 8}]
    ]
    warp_row = default_schedule(ir, {ir.batch_dims[0]: 64, ir.row_dim: 1000})
    assert warp_row.threads_per_row == 32 and not warp_row.split_paths
    cases.append((warp_row, (1000, 1024)))
    for s, lengths in cases:
        for n in lengths:
            warps = branch_traces(name, s, {ir.batch_dims[0]: 8, ir.row_dim: n}, seed=n)
            assert warps and all(map(one_path, warps)), (s, n)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax", "cross_entropy"])
def test_the_lanes_of_a_warp_take_one_path_in_rows_of_several_warps(name):
    """In a row of several warps the path is chosen per warp: at 2000 columns in 64 threads of
    four 16-byte chunks, the second warp's last six lanes hold the row's end, and a choice per
    thread ran both paths in that warp. In registers (the defaults at 2000 and 3000, 64 and 128
    threads a row) and streamed (64 threads, a ragged last step at 4000)."""
    ir = lower(load_catalogue()[name])
    rows = ir.batch_dims[0]
    at = {n: default_schedule(ir, {rows: 64, ir.row_dim: n}) for n in (2000, 3000)}
    streamed = replace(at[2000], mode="stream", online=bool(ir.online), tail="elements")
    assert is_valid(ir, streamed, {rows: 2, ir.row_dim: 4000})[0]
    cases = [(at[2000], (2000, 2040)), (at[3000], (3000,)), (streamed, (4000,))]
    assert at[2000].threads_per_row == 64 and at[3000].threads_per_row in (64, 128)
    for s, lengths in cases:
        for n in lengths:
            warps = branch_traces(name, s, {rows: 2, ir.row_dim: n}, seed=n)
            assert len(warps) == 2 * s.threads_per_row // 32, (s, n)
            assert all(map(one_path, warps)), (s, n)


@pytest.mark.parametrize("name", sorted(row_catalogue()))
def test_every_catalogue_default_keeps_each_warp_on_one_path(name):
    """Every catalogue operator's default at a row whose last warp is ragged (2000: 64 threads
    of four chunks) and at one no 16-byte vector divides (4999: the strided tail, or the
    elementwise rows walked as one run of tiles): the lanes of each warp take the same
    branches. (A streamed row of one warp keeps its choice per thread, cross-entropy's default
    at 4096 rows and more, so it is taken here at 1024 rows, where 128 threads share a row. A
    streamed row under the shifted tail, cross-entropy's at 4999, still chooses per thread
    too: its first and last steps straddle the row's ends; a choice per warp there is not
    yet timed on a GPU.)"""
    ir = lower(load_catalogue()[name])
    rows = ir.batch_dims[0]
    for n in (2000, 4999):
        s = default_schedule(ir, {rows: 1024, ir.row_dim: n})
        assert s.threads_per_row > 32 or s.mode == "cached", (s, n)
        if s.mode == "stream" and s.tail == "shifted":
            assert name == "cross_entropy" and n == 4999, (s, n)
            continue
        warps = branch_traces(name, s, {rows: 2, ir.row_dim: n}, seed=n)
        assert warps and all(map(one_path, warps)), (s.tag(), n)


@pytest.mark.parametrize("name", ["layernorm", "softmax", "add_rmsnorm"])
def test_the_stream_tail_streams_rows_not_of_whole_vectors(name):
    """Tail "stream" holds only whole vectors in registers: a row whose length is not a multiple
    of the vector, or whose tensors are not 16-byte aligned, takes the long-row path."""
    ir = lower(load_catalogue()[name])
    s = default_schedule(ir, {ir.batch_dims[0]: 64, ir.row_dim: 100})
    assert s.tail == "stream" and s.threads_per_row == 8
    for n in (100, 102, 37, 4):
        check(name, s, {ir.batch_dims[0]: 5, ir.row_dim: n}, seed=n)
    first = ir.inputs[0].name
    check(name, s, {ir.batch_dims[0]: 5, ir.row_dim: 100}, seed=1, skew={first: 8})
    loop = replace(s, persistent_blocks_per_sm=1, prefetch_rows=True)
    check(name, loop, {ir.batch_dims[0]: 9, ir.row_dim: 100}, seed=2, grid=1, skew={first: 8})


@pytest.mark.parametrize("name", sorted(row_catalogue()))
def test_the_defaults_for_rows_of_129_to_256_compute_the_reference_on_one_path_a_warp(name):
    """Rows of 129-256 bf16 take 8 threads of up to four 16-byte chunks by default (a warp of
    one chunk each before: bench/results/2026-12-06-h100-shortrows2): every catalogue operator's
    default at 160 and 256 columns (three chunks and four), over 7 rows (the last block's groups
    past the end with their stores off), at its own length and 3 shorter (not of whole vectors:
    streamed under the "stream" tail), and at 256 columns also at 300 (past what its registers
    hold: the stream path), computes the reference; and each warp's lanes take the same
    branches."""
    ir = lower(load_catalogue()[name])
    rows = ir.batch_dims[0]
    assert default_schedule(ir, {rows: 4096, ir.row_dim: 200}).threads_per_row == 8
    for n, lengths in [(160, (160, 157)), (256, (256, 253, 300))]:
        s = default_schedule(ir, {rows: 4096, ir.row_dim: n})
        assert s.threads_per_row == 8 and s.threads_per_block == 128, (s.tag(), n)
        assert s.chunks == -(-n // (8 * s.vec_elems)), (s.tag(), n)
        for length in lengths:
            dims = {rows: 7, ir.row_dim: length}
            warps = branch_traces(name, s, dims, seed=n + length)  # (check()s it too)
            assert warps and all(map(one_path, warps)), (s.tag(), length)


@pytest.mark.parametrize("name", ["softmax_fp32", "masked_scaled_sum", "gelu_tanh_fp16"])
def test_hand_built_dags_at_rows_newly_under_a_warp_compute_the_reference(name):
    """Rows of 65-128 fp32 elements (260-512 bytes) and of 129-256 fp16 take fewer threads than
    a warp since 9021f09: fp32 storage, compares, per-row scalars and precise math in that
    default (8 threads of four 16-byte chunks), at its own length, 3 shorter (streamed under
    the "stream" tail) and at 300 (the stream path), against the float64 DAG."""
    ir = example_ir(name)
    n = 200 if ir.min_elem_bytes() == 2 else 100
    s = default_schedule(ir, {"M": 4096, "N": n})
    assert s.threads_per_row == 8 and s.chunks == 4, s.tag()
    em = emit(ir, s)
    for length in (n, n - 3, 300):
        check_dag(ir, em, {"M": 7, "N": length}, seed=length)


@pytest.mark.parametrize(
    "name,n,k,r",
    [
        ("layernorm", 200, 2, 16),  # per-column vectors, two reductions
        ("add_rmsnorm", 200, 2, 16),  # two row outputs, one ready before the last pass
        ("cross_entropy", 200, 2, 16),  # a gathered element and a per-row output
        ("softmax", 512, 4, 1),  # a warp a row, four rows a thread, one warp a block
    ],
)
def test_several_rows_a_thread_compute_the_reference(name, n, k, r):
    """rows_per_thread: a row group loads k rows, then reduces and stores each. Over 7 rows
    (a block covers r x k rows: the rows past the end are the last row again with their stores
    off), at the layout's own length, 3 shorter (not of whole vectors: streamed, one row after
    the other) and past what the registers hold, every output matches the reference and every
    warp's lanes take one path."""
    ir = lower(load_catalogue()[name])
    rows = ir.batch_dims[0]
    base = default_schedule(ir, {rows: 4096, ir.row_dim: n})
    s = replace(base, rows_per_thread=k, rows_per_block=r)
    assert is_valid(ir, s, {rows: 4096, ir.row_dim: n})[0], s.tag()
    em = emit(ir, s)
    assert em.launch.grid[0] == f"ceildiv({rows}, {r * k})"
    assert em.ptx.count("ld.global.nc.v4") >= k * s.chunks  # every row's loads, one copy each
    for length in (n, n - 3, n + 100):
        dims = {rows: 7, ir.row_dim: length}
        warps = branch_traces(name, s, dims, seed=length + k)
        assert warps and all(map(one_path, warps)), (s.tag(), length)


def test_several_rows_a_thread_only_where_a_row_group_holds_its_rows():
    """rows_per_thread is for rows of a warp or less in registers, one row group a block: the
    predicate turns away the rest with its reason, and the emitter refuses them too."""
    ir = lower(load_catalogue()["rmsnorm"])
    dims = {"M": 4096, "N": 512}
    s = replace(default_schedule(ir, dims), rows_per_thread=2)
    assert is_valid(ir, s, dims) == (True, "")
    assert s.tag() != replace(s, rows_per_thread=1).tag()
    assert s.to_dict()["rows_per_thread"] == 2
    assert "rows_per_thread" not in replace(s, rows_per_thread=1).to_dict()
    assert Schedule.from_dict(s.to_dict()) == s
    for bad in (
        {"threads_per_row": 64, "chunks": 1},
        {"persistent_blocks_per_sm": 4},
        {"mode": "stream", "chunks": 1},
        {"tail": "shifted"},
    ):
        t = replace(s, **bad)
        ok, why = is_valid(ir, t, dims)
        assert not ok and "rows_per_thread" in why, (bad, why)
        with pytest.raises(EmitError):
            emit(ir, t)
    assert not is_valid(ir, replace(s, rows_per_thread=3), dims)[0]
