"""Pooling (issue 50): maxpool/avgpool in the language (derived dims for the pooled axes, added
to every shape row; refusals), the float64 reference against torch's F.max_pool*/avg_pool*,
and the pool family: lowering, space and validity, nvJitLink, results in factory.ptxsim at
small odd shapes (padding, strides, 1-D and 2-D windows, 16-bit data, a pre-map)."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.families import Unsupported
from factory.families import pool as F
from factory.spec import load_manifest, random_inputs, reference, to_float64
from factory.spec.expr import Input, Pool
from factory.spec.manifest import with_pooled_dims
from factory.spec.parse import ExprError, ExprParser
from factory.spec.types import SpecError

EXAMPLES = sorted(glob.glob(str(Path(__file__).parents[2] / "factory/examples/pool_*.toml")))

M = """
name = "mp"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
N = 2
C = 3
H = 16
W = 16
"""


def w(expr, dt="fp32", odt="fp32"):
    return load_manifest(M.format(expr=expr, dt=dt, odt=odt))


def test_pool_nodes_and_derived_dims():
    p = ExprParser({"x": Input("x", ("N", "C", "H", "W"), "fp32")})
    n = p.parse("maxpool(x, window=(3, 3), stride=2, padding=1)")
    assert isinstance(n, Pool) and n.shape == ("N", "C", "H_3_2_1", "W_3_2_1")
    n = p.parse("avgpool(x, window=4)")
    assert n.shape == ("N", "C", "H", "W_4_4_0") and n.stride == (4,)
    q = ExprParser({"x": Input("x", ("N", 10), "fp32")})
    assert q.parse("maxpool(x, window=3, stride=2)").shape == ("N", 4)


@pytest.mark.parametrize(
    "text, says",
    [
        ("maxpool(x)", "needs window"),
        ("maxpool(x, window=(2, 2, 2))", "one or two"),
        ("maxpool(x, window=3, padding=2)", "more than half"),
        ("maxpool(x, window=(3, 3), stride=(1, 2, 3))", "same axes"),
        ("maxpool(x, window=0)", "at least 1"),
        ("avgpool(x, window=2, dilation=2)", "unexpected keyword"),
    ],
)
def test_refusals_in_the_language(text, says):
    p = ExprParser({"x": Input("x", ("N", "C", "H", "W"), "fp32")})
    with pytest.raises(ExprError, match=says):
        p.parse(text)


def test_shape_rows_carry_the_pooled_sizes_and_held_out_rows_keep_a_window():
    wl = w("avgpool(x, window=(2, 2))")
    assert wl.shapes[0]["H_2_2_0"] == 8 and wl.shapes[0]["W_2_2_0"] == 8
    for row in wl.heldout_shapes:
        assert row["H"] >= 2 and row["H_2_2_0"] == row["H"] // 2
    assert with_pooled_dims(wl.outputs, {"N": 1, "C": 1, "H": 5, "W": 9}) == {
        "N": 1, "C": 1, "H": 5, "W": 9, "H_2_2_0": 2, "W_2_2_0": 4}  # fmt: skip
    bad = M.format(expr="maxpool(x, window=3)", dt="fp32", odt="fp32")
    bad += "[[heldout_shapes]]\nN = 1\nC = 1\nH = 1\nW = 2\n"
    with pytest.raises(SpecError, match="wider than W"):
        load_manifest(bad)


@pytest.mark.parametrize(
    "expr, fn",
    [
        ("maxpool(x, window=(3, 3), stride=2, padding=1)", ("max_pool2d", (3, 2, 1))),
        ("avgpool(x, window=(3, 3), stride=2, padding=1)", ("avg_pool2d", (3, 2, 1))),
        ("maxpool(x, window=3, stride=1, padding=1)", ("max_pool1d", (3, 1, 1))),
        ("avgpool(x, window=4)", ("avg_pool1d", (4, 4, 0))),
    ],
)
def test_the_reference_is_torchs_pooling(expr, fn):
    torch = pytest.importorskip("torch")
    wl = w(expr)
    dims = dict(wl.heldout_shapes[-1])
    ins = random_inputs(wl, dims, 0)
    ref = reference(wl, ins, dims)["y"]
    x = torch.from_numpy(to_float64(ins["x"], "fp32"))
    name, (k, s, p) = fn
    f = getattr(torch.nn.functional, name)
    if name.endswith("1d"):
        got = f(x.reshape(-1, 1, x.shape[-1]), k, s, p).reshape(ref.shape)
    else:
        got = f(x, k, s, p)
    np.testing.assert_allclose(ref, got.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_examples_lower_to_the_pool_family_and_compile(path):
    from factory.compile import compile_ptx

    wl = load_manifest(Path(path).read_text())
    fam, ir = families.family_for(wl)
    assert fam.name == "pool"
    dims = dict(wl.shapes[0])
    assert F.roofline(wl, dims).bytes > 0
    for s in F.seeds(ir, dims)[:3]:
        r = compile_ptx(F.emit(ir, s).ptx, "sm_90", cache=False)
        assert r.ok, r.log[:2000]


def test_lowering_refusals_and_the_space():
    with pytest.raises(Unsupported, match="not a maxpool"):
        F.lower(w("sum(x, axis=0)"))
    wl = w("maxpool(x, window=(3, 3), stride=2, padding=1)", dt="bf16")
    ir = F.lower(wl)
    assert ir.window == (3, 3) and ir.dims == ("N", "C", "H", "W", "H_3_2_1", "W_3_2_1")
    rows = [dict(wl.shapes[0]), *wl.heldout_shapes]
    sp = F.space(ir, rows)
    assert sp and all(F.is_valid(ir, s, d)[0] for s in sp for d in rows)
    big = with_pooled_dims(wl.outputs, {"N": 32, "C": 64, "H": 112, "W": 112})
    for d in [*rows, big]:
        assert all(F.is_valid(ir, s, d)[0] for s in F.seeds(ir, d))
    s = F.default_schedule(ir, big)
    assert F.Schedule.from_dict(s.to_dict()) == s and "pool" in families.label(s.to_dict())


def S(t, ln, v):  # noqa: N802 - a schedule, briefly
    return F.Schedule(threads=t, lanes=ln, vec=v)


CASES = [
    ("maxpool(x, window=(3, 3), stride=2, padding=1)", "fp32", "fp32",
     {"N": 2, "C": 3, "H": 9, "W": 11}, S(64, 8, 2)),
    ("avgpool(x, window=(2, 2))", "bf16", "bf16", {"N": 1, "C": 2, "H": 7, "W": 9}, S(64, 16, 1)),
    ("maxpool(x, window=3, stride=1, padding=1)", "fp16", "fp32",
     {"N": 1, "C": 3, "H": 2, "W": 13}, S(128, 8, 4)),
    ("avgpool(x * x, window=(3, 2), stride=(1, 2), padding=(1, 0))", "fp32", "fp32",
     {"N": 1, "C": 2, "H": 5, "W": 8}, S(64, 8, 2)),
    ("maxpool(where(x > 0, x, -inf), window=(2, 3), stride=(2, 1))", "fp32", "fp32",
     {"N": 1, "C": 1, "H": 6, "W": 7}, S(64, 8, 1)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", CASES, ids=str)
def test_pooling_computes_the_reference(expr, dt, odt, dims, s):
    wl = w(expr, dt, odt)
    run_and_check(F.FAMILY, wl, s, with_pooled_dims(wl.outputs, dims), seed=2)


def ST(t, ln, v, u):  # noqa: N802 - a strip schedule, briefly
    return F.Schedule(threads=t, lanes=ln, vec=v, layout="strip", unroll=u)


# The strip layout: vector path where W is a multiple of vec * stride_w (W = 40, 24, 32), the
# element path at odd W, several column segments a row (lanes x vec < OW), bands that end
# inside a step (unroll), the carried rows (kh > sh), gaps between windows (kh < sh), 1-D.
STRIP_CASES = [
    ("maxpool(x, window=(3, 3), stride=2, padding=1)", "bf16", "bf16",
     {"N": 1, "C": 3, "H": 13, "W": 40}, ST(64, 8, 2, 2)),
    ("maxpool(x, window=(3, 3), stride=2, padding=1)", "bf16", "bf16",
     {"N": 2, "C": 1, "H": 9, "W": 11}, ST(64, 8, 4, 2)),
    ("maxpool(x, window=(3, 3), stride=2, padding=1)", "fp32", "fp32",
     {"N": 1, "C": 2, "H": 10, "W": 24}, ST(128, 8, 2, 4)),
    ("avgpool(x, window=(2, 2))", "bf16", "bf16", {"N": 1, "C": 2, "H": 7, "W": 32},
     ST(64, 8, 4, 1)),
    ("maxpool(x, window=3, stride=1, padding=1)", "fp16", "fp32",
     {"N": 1, "C": 3, "H": 2, "W": 48}, ST(64, 8, 8, 2)),
    ("avgpool(x * x, window=(3, 2), stride=(1, 2), padding=(1, 0))", "fp32", "fp32",
     {"N": 1, "C": 2, "H": 6, "W": 16}, ST(64, 8, 2, 2)),
    ("maxpool(where(x > 0, x, -inf), window=(2, 3), stride=(3, 1))", "fp32", "fp32",
     {"N": 1, "C": 1, "H": 11, "W": 20}, ST(64, 8, 4, 2)),
    ("maxpool(x, window=(5, 5), stride=2, padding=2)", "bf16", "fp32",
     {"N": 1, "C": 1, "H": 12, "W": 36}, ST(64, 8, 2, 4)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", STRIP_CASES, ids=str)
def test_strip_layout_computes_the_reference(expr, dt, odt, dims, s):
    wl = w(expr, dt, odt)
    run_and_check(F.FAMILY, wl, s, with_pooled_dims(wl.outputs, dims), seed=3)


def test_strip_is_the_default_where_it_fits_and_compiles_without_spills():
    from factory.compile import compile_ptx

    wl = w("maxpool(x, window=(3, 3), stride=2, padding=1)", dt="bf16", odt="bf16")
    ir = F.lower(wl)
    big = with_pooled_dims(wl.outputs, {"N": 168, "C": 64, "H": 112, "W": 112})
    d = F.default_schedule(ir, big)
    assert d.layout == "strip" and d.vec * 2 * 2 == 16
    for s in F.seeds(ir, big)[:3]:
        r = compile_ptx(F.emit(ir, s).ptx, "sm_90a", cache=False)
        assert r.ok and "0 bytes spill" in r.log, r.log[:2000]


def test_records_from_before_the_strip_layout_name_the_same_schedule():
    old = {"family": "pool", "threads": 256, "lanes": 32, "vec": 2}
    assert F.FAMILY.canonical(F.Schedule.from_dict(old).to_dict()) == old
    strip = ST(256, 16, 4, 2).to_dict()
    assert F.FAMILY.canonical(strip) == {k: v for k, v in strip.items() if k != "minblocks"}


# 1-D pools in the strip layout: the rows of the leading axes dealt thread rows x unroll to a
# block (several blocks' worth, the last one short), several column segments a row.
STRIP_1D_CASES = [
    ("avgpool(x, window=4)", "fp32", "fp32", {"N": 1, "C": 3, "H": 5, "W": 32}, ST(64, 32, 1, 2)),
    ("maxpool(x, window=3, stride=2, padding=1)", "bf16", "bf16",
     {"N": 2, "C": 3, "H": 3, "W": 40}, ST(64, 8, 2, 4)),
    ("maxpool(x, window=3, stride=2, padding=1)", "bf16", "fp32",
     {"N": 2, "C": 3, "H": 3, "W": 40}, ST(128, 16, 2, 1)),
    ("avgpool(x * x, window=2)", "fp16", "fp16", {"N": 1, "C": 7, "H": 1, "W": 19},
     ST(64, 16, 4, 4)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", STRIP_1D_CASES, ids=str)
def test_strip_layout_of_1d_pools_computes_the_reference(expr, dt, odt, dims, s):
    wl = w(expr, dt, odt)
    em = run_and_check(F.FAMILY, wl, s, with_pooled_dims(wl.outputs, dims), seed=5)
    assert "ceildiv" in em.launch.grid[0]


def test_1d_strip_default_deals_rows_to_thread_rows():
    wl = load_manifest(Path(EXAMPLES[0]).read_text())  # pool_avgpool1d
    ir = F.lower(wl)
    d = F.default_schedule(ir, dict(wl.shapes[0]))
    assert ir.nd == 1 and d.layout == "strip" and d.threads // d.lanes > 1 and d.unroll == 4


def test_blocks_a_sm_cap_the_registers_and_keep_the_results():
    from factory.compile import compile_ptx

    wl = w("maxpool(x, window=(3, 3), stride=2, padding=1)", dt="bf16", odt="bf16")
    ir = F.lower(wl)
    s = F.Schedule(threads=128, lanes=16, vec=4, layout="strip", unroll=2, minblocks=10)
    big = with_pooled_dims(wl.outputs, {"N": 168, "C": 64, "H": 112, "W": 112})
    assert F.default_schedule(ir, big) == s  # the default since the -4 run
    em = F.emit(ir, s)
    assert ".minnctapersm 10" in em.ptx
    r = compile_ptx(em.ptx, "sm_90a", cache=False)
    assert r.ok and "0 bytes spill" in r.log and r.registers <= 48, r.log[:2000]
    assert not F.is_valid(ir, F.Schedule(minblocks=10), None)[0]  # the window layout: none
    run_and_check(F.FAMILY, wl, s, with_pooled_dims(wl.outputs, {"N": 1, "C": 2, "H": 9,
                                                                 "W": 48}), seed=8)  # fmt: skip
