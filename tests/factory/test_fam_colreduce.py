"""The column-reduction family (issue 50): lowering and refusals, the space and its one validity
predicate, emission compiled by nvJitLink, and results checked in factory.ptxsim against the
float64 reference at small and held-out odd shapes (every path: whole vectors, the element path,
thread rows, clusters, unrolled and single rows, several outputs, 16-bit data)."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.families import Unsupported
from factory.families import colreduce as C
from factory.spec import load_manifest, random_inputs, reference

EXAMPLES = sorted(glob.glob(str(Path(__file__).parents[2] / "factory/examples/colreduce_*.toml")))

M2 = """
name = "cr"
[inputs.x]
shape = ["N", "C"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
N = 64
C = 40
"""

M4 = """
name = "cr4"
[inputs.x]
shape = ["A", "B", "H", "D"]
dtype = "{dt}"
[inputs.g]
shape = ["A", "B", "H", "D"]
dtype = "{dt}"
[outputs.s]
expr = "{e1}"
dtype = "{odt}"
[outputs.t]
expr = "{e2}"
dtype = "fp32"
[[shapes]]
A = 2
B = 3
H = 5
D = 12
"""


def w2(expr, dt="fp32", odt="fp32"):
    return load_manifest(M2.format(expr=expr, dt=dt, odt=odt))


def w4(e1, e2, dt="fp32", odt="fp32"):
    return load_manifest(M4.format(e1=e1, e2=e2, dt=dt, odt=odt))


# ---------------------------------------------------------------- lowering


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_lower_to_the_column_family(path):
    w = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(w)
    assert fam.name == "colreduce"
    assert ir.inner and ir.reduced


def test_the_view_of_a_middle_run_of_axes():
    ir = C.lower(w4("sum(x * g, axis=(1, 2))", "max(x, axis=(1, 2))"))
    assert (ir.outer, ir.reduced, ir.inner) == (("A",), ("B", "H"), ("D",))
    assert [o.op for o in ir.outputs] == ["sum", "max"]
    assert dict(ir.inputs) == {"x": "fp32", "g": "fp32"}


@pytest.mark.parametrize(
    "expr, says",
    [
        ("sum(x, axis=-1)", "last axis"),
        ("sum(x, axis=None)", "last axis"),
        ("exp(x)", "not a reduction"),
        ("cumsum(x, axis=0)", "not a reduction"),
        ("sum(max(x, axis=0, keepdims=True) - x, axis=0)", "Reduce inside"),
    ],
)
def test_refusals(expr, says):
    with pytest.raises(Unsupported, match=says):
        C.lower(w2(expr))


def test_refusals_of_several_outputs_and_axes():
    with pytest.raises(Unsupported, match="not adjacent"):
        C.lower(w4("sum(x, axis=(0, 2))", "sum(g, axis=(0, 2))"))
    with pytest.raises(Unsupported, match="different shapes or axes"):
        C.lower(w4("sum(x, axis=0)", "sum(g, axis=1)"))


def test_the_row_family_still_takes_last_axis_reductions():
    assert families.family_for(w2("sum(x, axis=-1)"))[0].name == "row"
    assert families.family_for(w2("sum(x, axis=0)"))[0].name == "colreduce"


# ---------------------------------------------------------------- space and validity


def test_space_holds_only_valid_schedules_and_the_defaults_and_seeds_are_in_it():
    w = w4("sum(x * g, axis=(1, 2))", "max(x, axis=(1, 2))", dt="bf16")
    ir = C.lower(w)
    rows = [dict(w.shapes[0]), *w.heldout_shapes]
    sp = C.space(ir, rows)
    assert sp and all(C.is_valid(ir, s, d)[0] for s in sp for d in rows)
    for d in rows:
        assert C.is_valid(ir, C.default_schedule(ir, d), d)[0]
        seeds = C.seeds(ir, d)
        assert seeds and all(C.is_valid(ir, s, d)[0] for s in seeds)
    assert max(s.vec for s in sp) * 2 <= 16


def test_is_valid_says_why():
    ir = C.lower(w2("sum(x, axis=0)"))
    assert "16-byte" in C.is_valid(ir, C.Schedule(vec=8), None)[1]
    assert "half idle" in C.is_valid(ir, C.Schedule(lanes=128, vec=4), {"N": 64, "C": 40})[1]
    assert "thread rows for" in C.is_valid(ir, C.Schedule(lanes=8, split=8), {"N": 16, "C": 40})[1]
    assert C.is_valid(ir, C.Schedule(lanes=8, vec=4, split=2), {"N": 64, "C": 40})[0]


def test_the_record_round_trips_and_labels():
    s = C.Schedule(threads=512, lanes=64, vec=2, split=4, unroll=4)
    assert C.Schedule.from_dict(s.to_dict()) == s
    assert families.of_schedule(s.to_dict()).name == "colreduce"
    assert "split 4" in families.label(s.to_dict())
    f = C.FAMILY.features(s.to_dict(), {"N": 64, "C": 40}, ["N", "C"])
    assert len(f) == 7 and all(np.isfinite(f))
    w = w2("sum(x, axis=0)")
    assert C.FAMILY.roofline_of(w, {"N": 64, "C": 40}).bytes == 4 * (64 * 40 + 40)


# ---------------------------------------------------------------- emission compiles


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_compile_with_nvjitlink(path):
    from factory.compile import compile_ptx

    w = load_manifest(Path(path).read_text())
    ir = C.lower(w)
    for s in C.seeds(ir, dict(w.shapes[0]))[:3]:
        em = C.emit(ir, s)
        r = compile_ptx(em.ptx, "sm_90", cache=False)
        assert r.ok, r.log[:2000]


# ---------------------------------------------------------------- results in the interpreter


def S(threads, lanes, vec, split, unroll):  # noqa: N802 - a schedule, briefly
    return C.Schedule(threads=threads, lanes=lanes, vec=vec, split=split, unroll=unroll)


CASES = [
    # expr, input dtype, output dtype, dims, schedule
    ("sum(x, axis=0)", "fp32", "fp32", {"N": 64, "C": 40}, S(256, 16, 4, 4, 2)),
    ("sum(x, axis=0)", "fp32", "fp32", {"N": 37, "C": 7}, S(128, 8, 4, 2, 2)),  # element path
    ("sum(x, axis=0)", "fp32", "fp32", {"N": 1, "C": 41}, S(128, 8, 4, 1, 4)),
    ("mean(x, axis=0)", "bf16", "bf16", {"N": 45, "C": 24}, S(128, 8, 8, 2, 2)),
    ("max(x, axis=0)", "bf16", "fp32", {"N": 19, "C": 13}, S(128, 8, 2, 1, 4)),  # odd: elements
    ("min(x, axis=0, keepdims=True)", "fp16", "fp16", {"N": 21, "C": 32}, S(128, 16, 2, 2, 1)),
    ("prod(1.0 + 0.01 * x, axis=0)", "fp32", "fp32", {"N": 30, "C": 12}, S(128, 8, 2, 1, 2)),
    ("mean(x * x, axis=0)", "bf16", "fp32", {"N": 33, "C": 16}, S(256, 8, 2, 8, 4)),
    ("sum(where(x > 0, x, 0.0), axis=0)", "fp32", "bf16", {"N": 29, "C": 9}, S(128, 8, 1, 4, 2)),
    # eight rows in flight: the unrolled loop, then the rows left one at a time
    ("sum(x, axis=0)", "bf16", "fp32", {"N": 203, "C": 64}, S(128, 8, 8, 2, 8)),
    ("mean(x * x, axis=0)", "fp32", "fp32", {"N": 77, "C": 13}, S(128, 16, 4, 1, 8)),
]


@pytest.mark.parametrize("expr, dt, odt, dims, s", CASES, ids=lambda v: str(v))
def test_column_reductions_compute_the_reference(expr, dt, odt, dims, s):
    run_and_check(C.FAMILY, w2(expr, dt, odt), s, dims, seed=3)


@pytest.mark.parametrize(
    "dims, s",
    [
        ({"A": 2, "B": 3, "H": 5, "D": 12}, S(128, 8, 4, 1, 2)),
        ({"A": 3, "B": 7, "H": 3, "D": 5}, S(128, 8, 1, 2, 2)),  # odd everything, a cluster
        ({"A": 1, "B": 1, "H": 1, "D": 33}, S(128, 8, 2, 1, 1)),
        ({"A": 5, "B": 2, "H": 9, "D": 16}, S(256, 16, 2, 4, 4)),
    ],
    ids=str,
)
def test_two_outputs_over_middle_axes_compute_the_reference(dims, s):
    w = w4("mean(x * g, axis=(1, 2))", "max(abs(x - g), axis=(1, 2))", dt="bf16", odt="bf16")
    run_and_check(C.FAMILY, w, s, dims, seed=1)


def test_more_items_than_clusters_walk_the_grid():
    # 2048 clusters at most: emulate fewer by a small grid, so each cluster takes several items
    from factory.ptxsim import run_kernel
    from factory.spec import to_float64

    w = w4("sum(x, axis=1)", "sum(g, axis=1)")
    ir = C.lower(w)
    s = S(128, 8, 1, 2, 1)
    dims = {"A": 6, "B": 5, "H": 3, "D": 9}
    em = C.emit(ir, s)
    ins = random_inputs(w, dims, 0)
    out_shape = (6, 3, 9)
    arrays = dict(ins) | {"s": np.full(out_shape, np.nan, np.float32),
                          "t": np.full(out_shape, np.nan, np.float32)}  # fmt: skip
    out = run_kernel(em, dims, arrays, grid=2 * 3)  # 3 clusters for 6 * 3 * 2 column blocks
    ref = reference(w, ins, dims)
    for name in ("s", "t"):
        got = to_float64(np.frombuffer(out[name], np.float32).reshape(out_shape), "fp32")
        np.testing.assert_allclose(got, ref[name], rtol=1e-5, atol=1e-5)


def test_runs_give_the_same_bits():
    w = w2("sum(x, axis=0)")
    ir = C.lower(w)
    em1 = run_and_check(C.FAMILY, w, S(256, 8, 4, 4, 2), {"N": 50, "C": 32}, seed=5)
    em2 = C.emit(ir, S(256, 8, 4, 4, 2))
    assert em1.ptx == em2.ptx  # deterministic emission; the combine order is fixed in the text


# ---------------------------------------------------------------- baselines (torch on the CPU)


def test_the_torch_baseline_computes_the_reference():
    torch = pytest.importorskip("torch")
    from factory.families.colreduce import baselines

    w = w4("mean(x * g, axis=(1, 2))", "max(abs(x - g), axis=(1, 2))")
    dims = {"A": 2, "B": 3, "H": 5, "D": 12}
    ins = random_inputs(w, dims, 0)
    fn, how = baselines.idiomatic("torch_eager", w, compiled=False)
    assert "torch.mean(dim=(1, 2))" in how and "torch.amax(dim=(1, 2))" in how
    got = fn({k: torch.from_numpy(v) for k, v in ins.items()})
    ref = reference(w, ins, dims)
    for k in ("s", "t"):
        np.testing.assert_allclose(got[k].numpy(), ref[k], rtol=1e-5, atol=1e-5)
