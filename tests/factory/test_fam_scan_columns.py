"""The scan family's column kernel (factory.families.scan.columns): rows held in registers a
round, thread rows folded in shared memory, a cluster's blocks in rank order. Checked in
factory.ptxsim against the float64 reference at small odd shapes (rows past R in the last
round, columns past Q, Q not a multiple of vec, fewer lanes than a warp, several thread rows,
clusters), forward and reverse, inclusive and exclusive, sum and product; bitwise equal runs;
the defaults fit the shapes they are made for and compile for sm_90a without spills."""

from __future__ import annotations

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory import families
from factory.families import scan as SC
from factory.ptxsim import run_kernel
from factory.spec import load_manifest, random_inputs

M3 = """
name = "cs3"
[inputs.x]
shape = ["B", "S", "D"]
dtype = "{dt}"
[inputs.z]
shape = ["B", "S", "D"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
B = 2
S = 9
D = 16
"""


def wl(expr, dt="fp32", odt="fp32"):
    text = M3.format(expr=expr, dt=dt, odt=odt)
    if "z" not in expr.replace("keepdims", ""):
        text = text.replace('[inputs.z]\nshape = ["B", "S", "D"]\n' + f'dtype = "{dt}"\n', "")
    return load_manifest(text)


def cs(t, v, ln, k, sp=1, ahead=0):
    return SC.Schedule(threads=t, vec=v, mode="columns", split=sp, lanes=ln, rows=k, ahead=ahead)


CASES = [
    # expr, in dtype, out dtype, dims, schedule
    ("cumsum(x, axis=1)", "fp32", "fp32", {"B": 2, "S": 37, "D": 16}, cs(32, 4, 4, 4)),
    ("cumsum(x, axis=1)", "fp32", "fp32", {"B": 3, "S": 29, "D": 7}, cs(64, 4, 2, 2, 2)),
    ("cumsum(x, axis=1)", "bf16", "bf16", {"B": 2, "S": 45, "D": 24}, cs(64, 8, 2, 4, 2)),
    ("cumsum(x, axis=1, exclusive=True)", "bf16", "fp32", {"B": 2, "S": 23, "D": 16},
     cs(32, 8, 2, 2, 4)),
    ("cumsum(x, axis=1, reverse=True)", "fp32", "bf16", {"B": 2, "S": 31, "D": 12},
     cs(64, 2, 8, 2, 2)),
    ("cumsum(x, axis=1, reverse=True, exclusive=True)", "fp16", "fp32",
     {"B": 1, "S": 50, "D": 9}, cs(32, 1, 4, 4, 2)),
    ("cumprod(1.0 + 0.01 * x, axis=1)", "fp32", "fp32", {"B": 2, "S": 40, "D": 10},
     cs(32, 2, 2, 4, 8)),
    ("cumsum(x * z, axis=0)", "bf16", "fp32", {"B": 21, "S": 3, "D": 8}, cs(32, 8, 1, 4)),
    ("cumsum(x - z, axis=1)", "fp32", "fp32", {"B": 2, "S": 33, "D": 40}, cs(128, 4, 16, 1)),
    ("cumsum(x, axis=1)", "fp32", "fp32", {"B": 2, "S": 5, "D": 3}, cs(32, 2, 1, 16)),  # R < round
    # the next round's loads issued ahead: several rounds, items, tails, clusters
    ("cumsum(x, axis=1)", "bf16", "bf16", {"B": 3, "S": 45, "D": 24}, cs(64, 8, 2, 2, 2, 1)),
    ("cumsum(x - z, axis=1, reverse=True)", "fp32", "fp32", {"B": 2, "S": 70, "D": 20},
     cs(32, 4, 4, 2, 1, 1)),
    ("cumprod(1.0 + 0.01 * x, axis=1, exclusive=True)", "fp16", "fp32",
     {"B": 2, "S": 33, "D": 9}, cs(32, 1, 8, 4, 4, 1)),
]  # fmt: skip


@pytest.mark.parametrize("expr, dt, odt, dims, s", CASES, ids=str)
def test_column_rounds_compute_the_reference(expr, dt, odt, dims, s):
    w = wl(expr, dt, odt)
    assert families.family_for(w)[0].name == "scan"
    run_and_check(SC.FAMILY, w, s, dims, seed=3)


def test_column_rounds_give_the_same_bits_twice():
    w = wl("cumsum(x, axis=1)", "bf16", "fp32")
    ir = SC.lower(w)
    dims = {"B": 2, "S": 41, "D": 16}
    em = SC.emit(ir, cs(32, 8, 2, 2, 4))
    ins = random_inputs(w, dims, 5)
    outs = []
    for _ in range(2):
        y = np.full((2, 41, 16), np.nan, np.float32)
        outs.append(run_kernel(em, dims, {"x": ins["x"], "y": y})["y"])
    assert outs[0] == outs[1]


@pytest.mark.parametrize(
    "dims",
    [
        {"B": 16, "S": 8192, "D": 1024},
        {"B": 15, "S": 8191, "D": 1023},
        {"B": 1, "S": 1 << 20, "D": 64},
        {"B": 4096, "S": 64, "D": 1024},
        {"B": 3, "S": 5, "D": 3},
        {"B": 1, "S": 1, "D": 1},
        {"B": 7, "S": 100000, "D": 1},
    ],
    ids=str,
)
def test_column_defaults_and_seeds_fit_their_shapes(dims):
    for dt in ("bf16", "fp32"):
        ir = SC.lower(wl("cumsum(x, axis=1)", dt, dt))
        d = SC.default_schedule(ir, dims)
        assert d.mode == "columns" and SC.is_valid(ir, d, dims)[0], d
        seeds = SC.seeds(ir, dims)
        assert seeds[0] == d and all(SC.is_valid(ir, s, dims)[0] for s in seeds)


def test_the_token_axis_default_holds_whole_vectors_and_compiles_without_spills():
    from factory.compile import compile_ptx

    ir = SC.lower(wl("cumsum(x, axis=1)", "bf16", "bf16"))
    dims = {"B": 16, "S": 8192, "D": 1024}
    d = SC.default_schedule(ir, dims)
    assert (d.vec, d.lanes, d.split) == (8, 8, 1) and d.rows >= 4  # narrower strips, no cluster
    for s in SC.seeds(ir, dims)[:3]:
        em = SC.emit(ir, s)
        assert "ld.global.nc.v4.b32" in em.ptx and "st.global.v4.b32" in em.ptx
        r = compile_ptx(em.ptx, "sm_90a", cache=False)
        assert r.ok, r.log[:2000]
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, s.tag()


def test_column_space_is_well_formed():
    ir = SC.lower(wl("cumsum(x, axis=1)", "bf16", "bf16"))
    dims = {"B": 16, "S": 8192, "D": 1024}
    sp = SC.space(ir, [dims])
    assert sp and all(s.mode == "columns" for s in sp)
    assert all(4 * SC.smem_words(s.threads, s.lanes, s.vec) <= 48 * 1024 for s in sp)
    rows = SC.lower(load_manifest(M3.format(expr="cumsum(x)", dt="fp32", odt="fp32")))
    assert "lanes, rows and ahead" in SC.is_valid(rows, SC.Schedule(mode="row", rows=2), None)[1]
    assert "64 elements" in SC.is_valid(ir, cs(256, 8, 32, 16), None)[1]


@pytest.mark.parametrize(
    "dt, s",
    [
        ("bf16", cs(512, 8, 32, 8, 4)),
        ("bf16", cs(256, 4, 32, 16, 8)),
        ("fp32", cs(512, 4, 32, 8, 4)),
        ("fp32", cs(512, 2, 16, 16, 1)),
        ("fp32", cs(32, 4, 1, 8, 2)),
        ("bf16", cs(256, 8, 32, 8, 4, 1)),  # a round's words and the next round's
        ("fp32", cs(128, 4, 32, 8, 4, 1)),
        ("bf16", cs(128, 8, 32, 4, 8, 1)),
    ],
    ids=str,
)
def test_the_largest_register_tiles_compile_without_spills(dt, s):
    """The space's bounds (64 elements and 128 bytes a round a thread, held as loaded words,
    twice that ahead; at most 512 threads, at least 512 threads an SM) are where ptxas for
    sm_90a still needs no local memory."""
    from factory.compile import compile_ptx

    ir = SC.lower(wl("cumprod(1.0 + 0.01 * x, axis=1, reverse=True, exclusive=True)", dt, dt))
    assert SC.is_valid(ir, s, None)[0]
    r = compile_ptx(SC.emit(ir, s).ptx, "sm_90a", cache=False)
    assert r.ok and r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (r.registers, r.log[:500])
    wider = SC.Schedule.from_dict({**s.to_dict(), "rows": 2 * s.rows})
    assert not SC.is_valid(ir, wider, None)[0]
