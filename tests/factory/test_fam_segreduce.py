"""The segment-reduction family (issue 50): reductions keeping a leading or middle run of axes
(NCHW batch-norm and instance-norm statistics). Lowering and refusals, space and validity,
emission compiled by nvJitLink, results in factory.ptxsim against the float64 reference at small
odd shapes: whole vectors and elements, thread rows, clusters, several outputs, 16-bit data."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.families import Unsupported
from factory.families import segreduce as F
from factory.spec import load_catalogue, load_manifest

EXAMPLES = sorted(glob.glob(str(Path(__file__).parents[2] / "factory/examples/segreduce_*.toml")))

M = """
name = "bn"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "{dt}"
[outputs.mu]
expr = "{e1}"
dtype = "fp32"
[outputs.v]
expr = "{e2}"
dtype = "{odt}"
[[shapes]]
N = 4
C = 8
H = 6
W = 6
"""


def w(e1, e2, dt="fp32", odt="fp32"):
    return load_manifest(M.format(e1=e1, e2=e2, dt=dt, odt=odt))


def S(t, ln, v, sp, u=1):  # noqa: N802 - a schedule, briefly
    return F.Schedule(threads=t, lanes=ln, vec=v, split=sp, unroll=u)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_lower_to_the_segment_family_and_compile(path):
    from factory.compile import compile_ptx

    wl = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(wl)
    assert fam.name == "segreduce"
    for s in F.seeds(ir, dict(wl.shapes[0]))[:3]:
        r = compile_ptx(F.emit(ir, s).ptx, "sm_90", cache=False)
        assert r.ok, r.log[:2000]


def test_the_view():
    ir = F.lower(w("mean(x, axis=(0, 2, 3))", "sum(x, axis=(0, 2, 3))"))
    assert (ir.before, ir.kept, ir.after) == (("N",), ("C",), ("H", "W"))
    ir = F.lower(w("mean(x, axis=(2, 3))", "sum(x, axis=(2, 3))"))
    assert (ir.before, ir.kept, ir.after) == ((), ("N", "C"), ("H", "W"))


@pytest.mark.parametrize(
    "e, says",
    [
        ("sum(x, axis=(1, 3))", "not adjacent"),
        ("sum(x, axis=(0, 1))", "last axis is kept"),
        ("sum(x, axis=None)", "every axis"),
        ("sum(x, axis=-1)", "row family"),
    ],
)
def test_refusals(e, says):
    with pytest.raises(Unsupported, match=says):
        F.lower(w(e, e))


def test_the_row_family_keeps_every_catalogue_workload():
    # but the pure elementwise ones (the flat family) and few long rows (the split-row family)
    other = {"silu_mul": "flat", "gelu_tanh": "flat", "gelu_erf": "flat", "relu2": "flat",
             "axpby": "flat", "softmax_long_rows": "rowsplit",
             # lowered by families asked before this one (attention, matmul, column reduction,
             # scan): never offered to it
             "attention_causal": "attention", "attention_softcap": "attention",
             "matmul_bias_gelu": "matmul", "swiglu_up": "matmul", "bias_grad": "colreduce",
             "cumsum_rows": "scan", "maxpool2d": "pool", "instancenorm": "segnorm",
             "greedy_sampling": "argreduce", "mse_loss": "allreduce",
             "batchnorm_stats": "segreduce"}  # fmt: skip
    for name, wl in load_catalogue().items():
        assert families.name_for(wl) == other.get(name, "row"), name


def test_space_validity_defaults_and_seeds():
    wl = w("mean(x, axis=(0, 2, 3))", "max(x, axis=(0, 2, 3))", dt="bf16")
    ir = F.lower(wl)
    rows = [dict(wl.shapes[0]), *wl.heldout_shapes]
    sp = F.space(ir, rows)
    assert sp and all(F.is_valid(ir, s, d)[0] for s in sp for d in rows)
    for d in [*rows, {"N": 64, "C": 256, "H": 56, "W": 56}, {"N": 1, "C": 3, "H": 1, "W": 1}]:
        assert F.is_valid(ir, F.default_schedule(ir, d), d)[0], d
        assert all(F.is_valid(ir, s, d)[0] for s in F.seeds(ir, d))
    s = S(256, 64, 4, 2)
    assert F.Schedule.from_dict(s.to_dict()) == s and "cluster of 2" in families.label(s.to_dict())
    assert len(F.FAMILY.features(s.to_dict(), rows[0], ["N", "C", "H", "W"])) == 6


CASES = [
    ("mean(x, axis=(0, 2, 3))", "mean(x * x, axis=(0, 2, 3))", "fp32", "fp32",
     {"N": 3, "C": 5, "H": 4, "W": 6}, S(64, 8, 4, 1)),
    ("mean(x, axis=(0, 2, 3))", "max(x, axis=(0, 2, 3))", "bf16", "bf16",
     {"N": 5, "C": 3, "H": 7, "W": 7}, S(128, 16, 2, 2)),
    ("sum(x, axis=(2, 3))", "min(x, axis=(2, 3))", "fp32", "fp32",
     {"N": 2, "C": 3, "H": 5, "W": 9}, S(64, 8, 4, 1)),
    ("sum(x, axis=(1, 2, 3))", "mean(x, axis=(1, 2, 3))", "fp16", "fp16",
     {"N": 3, "C": 3, "H": 3, "W": 8}, S(128, 32, 4, 4)),
    ("prod(1.0 + 0.01 * x, axis=(0, 3))", "sum(x, axis=(0, 3))", "fp32", "fp32",
     {"N": 7, "C": 2, "H": 3, "W": 5}, S(64, 8, 1, 8)),
    # vectors in flight: whole sweeps of two or four, then the rest one at a time (B = 72 and
    # 104, 32 elements a sweep), and an odd B that takes the element path throughout
    ("mean(x, axis=(0, 2, 3))", "mean(x * x, axis=(0, 2, 3))", "bf16", "fp32",
     {"N": 3, "C": 3, "H": 8, "W": 9}, S(64, 8, 4, 2, 2)),
    ("sum(x, axis=(2, 3))", "max(x, axis=(2, 3))", "fp32", "fp32",
     {"N": 2, "C": 3, "H": 13, "W": 8}, S(64, 8, 4, 1, 4)),
    ("mean(x, axis=(0, 2, 3))", "sum(x, axis=(0, 2, 3))", "fp32", "fp32",
     {"N": 2, "C": 2, "H": 5, "W": 7}, S(64, 8, 2, 2, 4)),
]  # fmt: skip


@pytest.mark.parametrize("e1, e2, dt, odt, dims, s", CASES, ids=str)
def test_segment_reductions_compute_the_reference(e1, e2, dt, odt, dims, s):
    run_and_check(F.FAMILY, w(e1, e2, dt, odt), s, dims, seed=2)


def test_more_kept_indices_than_clusters_walk_the_grid():
    from factory.ptxsim import run_kernel
    from factory.spec import random_inputs, reference, to_float64

    wl = w("mean(x, axis=(0, 2, 3))", "sum(x, axis=(0, 2, 3))")
    ir = F.lower(wl)
    dims = {"N": 2, "C": 7, "H": 3, "W": 4}
    em = F.emit(ir, S(64, 8, 4, 2))
    ins = random_inputs(wl, dims, 0)
    arrays = dict(ins) | {k: np.full((7,), np.nan, np.float32) for k in ("mu", "v")}
    out = run_kernel(em, dims, arrays, grid=2 * 3)  # 3 clusters for 7 channels
    ref = reference(wl, ins, dims)
    for k in ("mu", "v"):
        got = to_float64(np.frombuffer(out[k], np.float32), "fp32")
        np.testing.assert_allclose(got, ref[k], rtol=1e-5, atol=1e-5)


def test_records_from_before_unroll_name_the_same_schedule():
    old = {"family": "segreduce", "threads": 256, "lanes": 64, "vec": 4, "split": 1}
    assert F.FAMILY.canonical(F.Schedule.from_dict(old).to_dict()) == old
    assert F.FAMILY.canonical(S(256, 64, 4, 1, 2).to_dict())["unroll"] == 2
