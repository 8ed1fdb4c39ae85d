"""argreduce's row path keeps one (value, index) pair per vector column in its vector loop (no
tie rule there: a thread meets each column's elements in increasing index order) and folds
them with the full rule after the loop. Checked exactly in factory.ptxsim where that matters:
ties, NaNs and the worst value repeated within one pair's chain (the same column across the
unrolled loads and across iterations), ties between a thread's columns, rows of only -inf or
+inf, and rows whose length leaves no whole vector (the element path)."""

from __future__ import annotations

import numpy as np
import pytest
from test_fam_helpers import run_and_check

from factory.families import argreduce as AR
from factory.spec import load_manifest

M = """
name = "am"
[inputs.x]
shape = ["M", "N"]
dtype = "{dt}"
[outputs.i]
expr = "{op}(x, axis=-1)"
dtype = "int64"
[[shapes]]
M = 2
N = 64
"""


def rows(n: int, op: str) -> np.ndarray:
    """Rows built so that one thread's column chain meets each case (32 threads x 4 a vector,
    unroll 2: a chain's elements are k + j, k + 128 + j, k + 256 + j, ...)."""
    best = 3.0 if op == "argmax" else -3.0
    worst = -np.inf if op == "argmax" else np.inf
    x = np.zeros((9, n), np.float32)
    x[0, [5, 5 + 128, 5 + 256]] = best  # ties in one chain: the first
    x[1, [6 + 256, 6 + 128]] = best  # the unrolled load before the next iteration
    x[2, [9, 10, 11]] = best  # ties across a thread's columns
    x[3, [7 + 128, 7 + 384]] = np.nan  # NaN twice in one chain: the first
    x[3, 7] = best
    x[4, [3, 300]] = np.nan  # NaN in different chains
    x[5, :] = worst  # nothing better than the start: index 0
    x[6, :] = -worst
    x[7, :] = worst
    x[7, n - 1] = np.nan
    x[8, :] = np.arange(n, dtype=np.float32) % 7  # many ties of the best, spread
    return x


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("n", [1024, 1027])  # whole vectors, and the element path
def test_pairs_per_column_keep_numpys_first_index(op, n):
    wl = load_manifest(M.format(dt="fp32", op=op))
    x = rows(n, op)
    if op == "argmin":
        x[8] = -x[8]
    s = AR.Schedule(threads=32, vec=4, unroll=2)
    em = run_and_check(AR.FAMILY, wl, s, {"M": 9, "N": n}, inputs={"x": x})
    if n % 4 == 0:
        assert "setp.neu.f32" in em.ptx


def test_bf16_rows_of_a_vocabulary_shape_in_small():
    wl = load_manifest(M.format(dt="bf16", op="argmax"))
    s = AR.Schedule(threads=64, vec=8, unroll=2)
    run_and_check(AR.FAMILY, wl, s, {"M": 3, "N": 4096}, seed=5)


@pytest.mark.parametrize("dt, expr", [("bf16", "argmax(x, axis=-1)"),
                                      ("bf16", "argmin(x * x - 0.5 * exp(x), axis=-1)"),
                                      ("fp32", "argmax(x, axis=-1)")])  # fmt: skip
def test_row_layouts_fill_the_sm_without_spills(dt, expr):
    """.minnctapersm holds the row path to 32 registers (42 past 32 bytes of loads a thread):
    every schedule of the space still compiles for sm_90a without local memory."""
    from factory.compile import compile_ptx

    ir = AR.lower(load_manifest(M.format(dt=dt, op="argmax").replace("argmax(x, axis=-1)", expr)))
    for s in AR.space(ir, None)[::3]:
        em = AR.emit(ir, s)
        assert ".minnctapersm" in em.ptx
        r = compile_ptx(em.ptx, "sm_90a", cache=False)
        assert r.ok and r.spill_store_bytes == 0 and r.stack_bytes == 0, (s.tag(), r.registers)
