"""The scan family's many-short-rows layout ("warp": a row a warp, several chunks of
32 x vec elements loaded before the first is scanned, no block barrier): factory.ptxsim against
the float64 reference at odd row lengths (tails, unaligned rows, rows past the last warp,
several rounds), forward and reverse, inclusive and exclusive, sum and product; bitwise equal
runs; chosen for many short rows and compiled for sm_90a without spills."""

from __future__ import annotations

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory.families import scan as SC
from factory.ptxsim import run_kernel
from factory.spec import load_manifest, random_inputs

M = """
name = "wr"
[inputs.x]
shape = ["M", "N"]
dtype = "{dt}"
[outputs.y]
expr = "{expr}"
dtype = "{odt}"
[[shapes]]
M = 4
N = 100
"""


def w(expr, dt="fp32", odt="fp32"):
    return load_manifest(M.format(expr=expr, dt=dt, odt=odt))


def ws(t, v, c):
    return SC.Schedule(threads=t, vec=v, mode="warp", chunks=c)


CASES = [
    ("cumsum(x, axis=-1)", "fp32", "fp32", {"M": 5, "N": 1024}, ws(64, 4, 8)),  # rows past M
    ("cumsum(x, axis=-1)", "fp32", "fp32", {"M": 3, "N": 1001}, ws(32, 4, 2)),  # rounds, tail
    ("cumsum(x, axis=-1, exclusive=True)", "bf16", "bf16", {"M": 4, "N": 301}, ws(64, 8, 1)),
    ("cumsum(x, axis=-1, reverse=True)", "fp32", "bf16", {"M": 3, "N": 517}, ws(64, 2, 4)),
    ("cumsum(x, reverse=True, exclusive=True)", "fp16", "fp32", {"M": 2, "N": 97}, ws(32, 8, 2)),
    ("cumprod(1.0 + 0.01 * x, axis=-1)", "fp32", "fp32", {"M": 3, "N": 200}, ws(128, 1, 4)),
    ("cumsum(x)", "fp32", "fp32", {"M": 1, "N": 1}, ws(32, 4, 1)),
]


@pytest.mark.parametrize("expr, dt, odt, dims, s", CASES, ids=str)
def test_warp_rows_compute_the_reference(expr, dt, odt, dims, s):
    em = run_and_check(SC.FAMILY, w(expr, dt, odt), s, dims, seed=4)
    assert "bar.sync" not in em.ptx


def test_warp_rows_give_the_same_bits_twice():
    wl = w("cumsum(x, axis=-1)")
    ir = SC.lower(wl)
    dims = {"M": 3, "N": 777}
    em = SC.emit(ir, ws(64, 4, 2))
    ins = random_inputs(wl, dims, 9)
    outs = [
        run_kernel(em, dims, {"x": ins["x"], "y": np.full((3, 777), np.nan, np.float32)})["y"]
        for _ in range(2)
    ]
    assert outs[0] == outs[1]


def test_many_short_rows_take_a_row_a_warp_and_compile_without_spills():
    from factory.compile import compile_ptx

    for dt, n in (("fp32", 1024), ("bf16", 1024), ("fp32", 4096), ("bf16", 33)):
        ir = SC.lower(w("cumsum(x, axis=-1)", dt, dt))
        dims = {"M": 65536, "N": n}
        d = SC.default_schedule(ir, dims)
        assert d.mode == "warp" and SC.is_valid(ir, d, dims)[0], (dt, n, d)
        seeds = SC.seeds(ir, dims)
        assert any(s.mode == "row" for s in seeds)  # a row a block stays among the seeds
        for s in seeds:
            r = compile_ptx(SC.emit(ir, s).ptx, "sm_90a", cache=False)
            assert r.ok and r.spill_store_bytes == 0, (s.tag(), r.log[:500])
    ir = SC.lower(w("cumsum(x, axis=-1)"))
    assert SC.default_schedule(ir, {"M": 64, "N": 1024}).mode == "lookback"  # too few rows
    assert SC.default_schedule(ir, {"M": 65536, "N": 65536}).mode == "row"  # long rows
    assert "half idle" in SC.is_valid(ir, ws(256, 4, 8), {"M": 65536, "N": 100})[1]
