"""Norms over several trailing axes (issue 50): the segnorm family (instance norm, an RMS over
H and W, a softmax over a plane): lowering and refusals, space and validity, nvJitLink, results
in factory.ptxsim against the float64 reference (two-stage statistics, vector and element
paths, 16-bit data)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from test_fam_helpers import run_and_check
from test_segnorm_helpers import inorm_manifest

from factory import families
from factory.families import Unsupported
from factory.families import segnorm as F
from factory.spec import load_catalogue, load_manifest

EXAMPLES = sorted(glob.glob(str(Path(__file__).parents[2] / "factory/examples/segnorm_*.toml")))


def w(expr, dt="fp32", odt="fp32"):
    return load_manifest(inorm_manifest(expr, dt, odt))


def S(t, v):  # noqa: N802 - a schedule, briefly
    return F.Schedule(threads=t, vec=v)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_lower_to_segnorm_and_compile(path):
    from factory.compile import compile_ptx

    wl = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(wl)
    assert fam.name == "segnorm" and [len(s) for s in ir.stages] == [1, 1]
    for s in F.seeds(ir, dict(wl.shapes[0]))[:3]:
        r = compile_ptx(F.emit(ir, s).ptx, "sm_90", cache=False)
        assert r.ok, r.log[:2000]


@pytest.mark.parametrize(
    "expr, says",
    [
        ("x - mean(x, axis=-1, keepdims=True)", "one trailing axis"),
        ("x - mean(x, axis=(1, 2), keepdims=True)", "trailing run"),
        ("exp(x)", "no reduction"),
    ],
)
def test_refusals(expr, says):
    with pytest.raises(Unsupported, match=says):
        F.lower(w(expr))


def test_the_row_family_keeps_its_workloads():
    # pure elementwise operators are the flat family's, few long rows the split-row family's
    split = {"silu_mul": "flat", "gelu_tanh": "flat", "gelu_erf": "flat", "relu2": "flat",
             "axpby": "flat", "softmax_long_rows": "rowsplit",
             # lowered by families asked before this one (attention, matmul, column reduction,
             # scan): never offered to it
             "attention_causal": "attention", "attention_softcap": "attention",
             "matmul_bias_gelu": "matmul", "swiglu_up": "matmul", "bias_grad": "colreduce",
             "cumsum_rows": "scan", "maxpool2d": "pool", "instancenorm": "segnorm",
             "greedy_sampling": "argreduce", "mse_loss": "allreduce",
             "batchnorm_stats": "segreduce"}  # fmt: skip
    for name, wl in load_catalogue().items():
        assert families.name_for(wl) == split.get(name, "row"), name
    assert families.name_for(w("x - mean(x, axis=-1, keepdims=True)")) == "row"


def test_space_validity_defaults_and_seeds():
    wl = w("(x - mu) * rsqrt(var + eps)", dt="bf16", odt="bf16")
    ir = F.lower(wl)
    rows = [dict(wl.shapes[0]), *wl.heldout_shapes, {"N": 32, "C": 128, "H": 64, "W": 64}]
    sp = F.space(ir, rows)
    assert sp and all(F.is_valid(ir, s, d)[0] for s in sp for d in rows)
    for d in rows:
        assert all(F.is_valid(ir, s, d)[0] for s in F.seeds(ir, d))
    s = F.default_schedule(ir, rows[-1])
    assert F.Schedule.from_dict(s.to_dict()) == s and "segment" in families.label(s.to_dict())


CASES = [
    ("(x - mu) * rsqrt(var + eps)", "fp32", "fp32", {"N": 2, "C": 3, "H": 5, "W": 8}, S(64, 4)),
    ("(x - mu) * rsqrt(var + eps)", "bf16", "bf16", {"N": 1, "C": 3, "H": 7, "W": 9}, S(64, 8)),
    ("x * rsqrt(mean(x * x, axis=(-2, -1), keepdims=True) + eps)", "fp16", "fp32",
     {"N": 2, "C": 2, "H": 3, "W": 50}, S(128, 2)),
    ("exp(x - max(x, axis=(2, 3), keepdims=True))", "fp32", "fp32",
     {"N": 1, "C": 2, "H": 4, "W": 4}, S(64, 1)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", CASES, ids=str)
def test_segment_norms_compute_the_reference(expr, dt, odt, dims, s):
    run_and_check(F.FAMILY, w(expr, dt, odt), s, dims, seed=2)


def test_group_norm_as_a_rank_five_view():
    """GroupNorm(G) of an NCHW tensor: declared as its view [N, G, C/G, H, W] (no copy), the
    statistics over the last three axes."""
    m = """
name = "groupnorm"
[inputs.x]
shape = ["N", "G", "Cg", "H", "W"]
dtype = "bf16"
[constants]
eps = 1e-5
[let]
mu = "mean(x, axis=(2, 3, 4), keepdims=True)"
var = "mean((x - mu) ** 2, axis=(-3, -2, -1), keepdims=True)"
[outputs.y]
expr = "(x - mu) * rsqrt(var + eps)"
dtype = "bf16"
[[shapes]]
N = 2
G = 4
Cg = 8
H = 16
W = 16
"""
    wl = load_manifest(m)
    fam, ir = families.family_for(wl)
    assert fam.name == "segnorm" and ir.first == 2
    dims = {"N": 2, "G": 3, "Cg": 2, "H": 3, "W": 5}
    run_and_check(F.FAMILY, wl, F.default_schedule(ir, dims), dims, seed=1)


def SH(t, v, h):  # noqa: N802 - a held schedule, briefly
    return F.Schedule(threads=t, vec=v, hold=h)


# The held path (segment in registers) where N <= threads x vec x hold and N % vec == 0, with
# slots past the segment's end (N = 40 of 64 x 1 x 2 ... ); the streaming fallback where the
# segment is longer (N = 400 > 64 x 4 x 1) or not a multiple of the vector (N = 63).
IN = "(x - mu) * rsqrt(var + eps)"
HELD_CASES = [
    (IN, "bf16", "bf16", {"N": 2, "C": 3, "H": 8, "W": 40}, SH(64, 8, 1)),
    (IN, "fp32", "fp32", {"N": 1, "C": 3, "H": 5, "W": 8}, SH(64, 1, 1)),
    (IN, "fp32", "fp32", {"N": 2, "C": 2, "H": 6, "W": 30}, SH(64, 4, 2)),
    (IN, "bf16", "fp32", {"N": 1, "C": 2, "H": 20, "W": 20}, SH(64, 4, 1)),
    (IN, "bf16", "bf16", {"N": 1, "C": 2, "H": 7, "W": 9}, SH(64, 8, 4)),
    ("x * rsqrt(mean(x * x, axis=(-2, -1), keepdims=True) + eps)", "fp16", "fp16",
     {"N": 2, "C": 2, "H": 3, "W": 50}, SH(128, 2, 1)),
    ("exp(x - max(x, axis=(2, 3), keepdims=True))", "fp32", "fp32",
     {"N": 1, "C": 2, "H": 4, "W": 4}, SH(64, 1, 8)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", HELD_CASES, ids=str)
def test_held_segments_compute_the_reference(expr, dt, odt, dims, s):
    run_and_check(F.FAMILY, w(expr, dt, odt), s, dims, seed=4)


def test_instance_norm_default_holds_the_plane_and_compiles_without_spills():
    from factory.compile import compile_ptx

    wl = w("(x - mu) * rsqrt(var + eps)", dt="bf16", odt="bf16")
    ir = F.lower(wl)
    dims = {"N": 128, "C": 256, "H": 64, "W": 64}
    d = F.default_schedule(ir, dims)
    assert d.hold and d.threads * d.vec * d.hold >= 64 * 64
    for s in F.seeds(ir, dims)[:3]:
        r = compile_ptx(F.emit(ir, s).ptx, "sm_90a", cache=False)
        assert r.ok and "0 bytes spill" in r.log, r.log[:2000]


def test_records_from_before_the_held_path_name_the_same_schedule():
    old = {"family": "segnorm", "threads": 256, "vec": 4}
    assert F.FAMILY.canonical(F.Schedule.from_dict(old).to_dict()) == old
    assert F.FAMILY.canonical(SH(128, 8, 4).to_dict())["hold"] == 4


def SP(t, v, h):  # noqa: N802 - a held schedule with the next segment in flight
    return F.Schedule(threads=t, vec=v, hold=h, prefetch=1)


# Held segments with the next one loaded while one is computed: several segments a block (the
# grid cut to 2 or 3 blocks, so both register sets are used, and odd and even counts end the
# loop at either set), slots past a segment's end, 16-bit pairs widened at each use; and a
# shape where no segment is held (N = 63: the streaming passes).
PREFETCH_CASES = [
    (IN, "bf16", "bf16", {"N": 3, "C": 3, "H": 8, "W": 40}, SP(64, 8, 1), 2),
    (IN, "bf16", "bf16", {"N": 2, "C": 4, "H": 8, "W": 40}, SP(64, 8, 1), 3),
    (IN, "fp32", "fp32", {"N": 2, "C": 3, "H": 6, "W": 30}, SP(64, 4, 2), 2),
    (IN, "fp16", "fp32", {"N": 1, "C": 5, "H": 5, "W": 8}, SP(64, 2, 1), 3),
    ("x * rsqrt(mean(x * x, axis=(-2, -1), keepdims=True) + eps)", "bf16", "bf16",
     {"N": 2, "C": 2, "H": 3, "W": 50}, SP(128, 2, 1), 3),
    (IN, "bf16", "bf16", {"N": 1, "C": 4, "H": 7, "W": 9}, SP(64, 8, 1), 2),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s, grid", PREFETCH_CASES, ids=str)
def test_prefetched_segments_compute_the_reference(expr, dt, odt, dims, s, grid):
    import numpy as np

    from factory.ptxsim import run_kernel
    from factory.spec import random_inputs, reference, to_float64

    wl = w(expr, dt, odt)
    em = F.emit(F.lower(wl), s)
    ins = random_inputs(wl, dims, 6)
    shape = tuple(dims[d] for d in ("N", "C", "H", "W"))
    fill = (
        np.full(shape, np.nan, np.float32) if odt == "fp32" else np.full(shape, 0xFFFF, np.uint16)
    )
    out = run_kernel(em, dims, {"x": ins["x"], "y": fill}, grid=grid)
    got = np.frombuffer(out["y"], dtype=fill.dtype).reshape(shape)
    got = to_float64(got, odt)
    want = np.asarray(reference(wl, ins, dims)["y"], dtype=np.float64)
    tol = wl.tolerance[odt]
    assert np.isfinite(got).all(), "unwritten elements"
    assert (np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want)).all()


def test_prefetch_is_a_seed_and_compiles_without_spills():
    from factory.compile import compile_ptx

    wl = w(IN, dt="bf16", odt="bf16")
    ir = F.lower(wl)
    dims = {"N": 128, "C": 256, "H": 64, "W": 64}
    sp = [s for s in F.seeds(ir, dims) if s.prefetch]
    assert sp and sp[0] == F.Schedule(threads=128, vec=8, hold=4, prefetch=1)
    assert F.seeds(ir, dims)[2] == sp[0]  # after the default and the held one at 7
    r = compile_ptx(F.emit(ir, sp[0]).ptx, "sm_90a", cache=False)
    assert r.ok and "0 bytes spill" in r.log, r.log[:2000]
    assert not F.is_valid(ir, F.Schedule(threads=128, vec=8, prefetch=1), dims)[0]


def test_blocks_a_sm_cap_the_registers_and_keep_the_results():
    from factory.compile import compile_ptx

    wl = w(IN, dt="bf16", odt="bf16")
    ir = F.lower(wl)
    s = F.Schedule(threads=128, vec=8, hold=4, minblocks=9)
    em = F.emit(ir, s)
    assert (
        ".minnctapersm 9" in em.ptx
        and F.default_schedule(ir, {"N": 128, "C": 256, "H": 64, "W": 64}) == s
    )
    r = compile_ptx(em.ptx, "sm_90a", cache=False)
    assert r.ok and "0 bytes spill" in r.log and r.registers <= 56, r.log[:2000]
    assert not F.is_valid(ir, F.Schedule(threads=256, vec=8, hold=2, minblocks=9), None)[0]
    run_and_check(F.FAMILY, wl, s, {"N": 1, "C": 3, "H": 8, "W": 64}, seed=7)
