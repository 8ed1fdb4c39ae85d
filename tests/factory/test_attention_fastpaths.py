"""The attention kernel's unmasked fast paths on the CPU: the document mask's per-tile flag (a
KV tile whose keys all carry the query tile's one id skips the id compare), checked against
brute force, in the numpy model of the loop against the float64 reference (a wrong flag fails),
and in the emitted PTX (compiles for sm_90a without spills)."""

import numpy as np
import pytest
from test_attention_helpers import f64, simulate_bound, workload

from factory import families
from factory.families.attention import ir as I
from factory.families.attention import schedule as S
from factory.families.attention import tiling as T
from factory.spec import load_manifest
from factory.spec.reference import random_inputs, reference
from lab.attention.variants import manifest


def test_pure_tiles_hold_only_the_query_tiles_one_id_and_are_tight_for_sorted_ids():
    rng = np.random.default_rng(5)
    found = 0
    for case in range(400):
        bm, bn = int(rng.choice([64, 128])), int(rng.choice([64, 128]))
        sq = int(rng.integers(1, 900))
        skv = sq
        n_docs = int(rng.choice([1, 2, 4, 9]))
        ids = np.sort(rng.integers(0, n_docs, sq)).astype(np.float32)
        if case % 3 == 0:
            ids = rng.permutation(ids)  # unsorted: right, just fewer pure tiles
        if case % 7 == 0:
            ids[rng.integers(0, sq)] = np.nan  # matches nothing, not even itself
        i0 = int(rng.integers(0, T.ceildiv(sq, bm))) * bm
        n = T.ceildiv(skv, bn)
        first = int(rng.integers(0, n))
        end = int(rng.integers(first, n + 1))
        tpa, tpb = T.id_pure_tiles(first, end, i0, bm, sq, skv, bn, ids)
        rows = ids[i0 : min(i0 + bm, sq)]
        for t in range(first, end):
            keys = ids[t * bn : min(t * bn + bn, skv)]
            every = bool((rows[:, None] == keys[None, :]).all())
            if tpa <= t < tpb:
                assert every, (case, t, tpa, tpb)
                found += 1
            elif case % 3 and case % 7 and every and t * bn + bn <= skv:
                # sorted ids without NaN: every tile of the query tile's document is flagged
                raise AssertionError((case, t, tpa, tpb, "missed"))
    assert found > 200


def _doc_case(causal, shape, bounds, seed=3):
    w = workload("document", causal, 64, shape)
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=seed)
    doc = np.zeros((shape["B"], shape["S"]), np.int32)
    for b in range(shape["B"]):
        for n, start in enumerate(bounds[b]):
            doc[b, start:] = n
    x["doc"] = doc
    ref = reference(w, x, dims)
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    extra = {"doc": f64(w, x, "doc")}
    return w, ir, ref, q, k, v, extra


# documents of 0-600 tokens whose edges fall inside tiles, one edge on a tile boundary
BOUNDS = [[0, 40, 300, 384, 990], [0, 512, 700]]
SHAPE = {"B": 2, "H": 2, "HKV": 1, "S": 1001}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bm, bn", [(128, 128), (128, 64), (64, 64)])
def test_the_model_with_pure_tiles_unmasked_matches_the_reference(causal, bm, bn):
    w, ir, ref, q, k, v, extra = _doc_case(causal, SHAPE, BOUNDS)
    assert T.id_pure_path(ir)
    _, mask_fn = T.ir_functions(ir)
    stats = {}
    out, lse, _ = T.simulate(
        ir,
        bm,
        bn,
        q,
        k,
        v,
        extra,
        mask_fn=lambda i, j, h, b: mask_fn(i, j, h, b, extra),
        stats=stats,
    )
    err = np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"])
    assert err < 5e-3, err
    np.testing.assert_allclose(lse, ref["lse"], atol=1e-4, rtol=1e-4)
    assert stats["unmasked"] > 0 and stats["masked"] > 0  # both paths run


def test_the_model_catches_a_pure_flag_one_tile_too_wide(monkeypatch):
    w, ir, ref, q, k, v, extra = _doc_case(False, SHAPE, BOUNDS)
    _, mask_fn = T.ir_functions(ir)
    good = T.id_pure_tiles

    def wide(*a):
        pa, pb = good(*a)
        return (max(0, pa - 1), pb + 1) if pb > pa else (pa, pb)  # a straddling tile too

    monkeypatch.setattr(T, "id_pure_tiles", wide)
    out, _, _ = T.simulate(
        ir, 64, 64, q, k, v, extra, mask_fn=lambda i, j, h, b: mask_fn(i, j, h, b, extra)
    )
    assert np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"]) > 0.02


def test_another_elementwise_term_keeps_every_tile_masked():
    text = manifest("document", False, 64, lse=False).replace(
        "mask=['doc[i] == doc[j]']", "mask=['doc[i] == doc[j]', 'j * 2 <= i + 300']"
    )
    ir = I.lower(load_manifest(text))
    assert ir.id_matches == ("doc",) and not T.id_pure_path(ir)
    from factory.families.attention.emit import emit

    ptx = emit(ir, S.AttentionSchedule(128, 128, 2)).ptx
    assert "%tpa" not in ptx


def _compile_clean(e, ir, s):
    from factory.compile import compile_ptx
    from factory.families.attention.wholeprog import compile_whole, find_ptxas

    compilers = [compile_ptx] if S.fits_relocatable(ir, s) else []
    if find_ptxas() is not None:
        compilers.append(compile_whole)
    assert compilers
    for comp in compilers:
        r = comp(e.ptx, "sm_90a")
        assert r.ok, r.log[:2000]
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (s, comp)
        assert r.stack_bytes == 0, (s, comp)
        assert "C7509" not in r.log


def _every_fifth_and_the_wide_tile(w, d):
    """The lowered IR and every fifth schedule of its space, plus the 128x128 overlapped
    ping-pong schedule (2 stages at d 128, else 3)."""
    fam, ir = families.family_for(w)
    scheds = fam.space(ir, list(w.shapes))[::5]
    stages = 2 if d == 128 else 3
    scheds.append(S.AttentionSchedule(128, 128, stages, overlap=True, pingpong=True))
    return ir, scheds


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_document_ptx_has_both_paths_and_compiles_without_spills(causal, d):
    from factory.families.attention.emit import emit

    ir, scheds = _every_fifth_and_the_wide_tile(workload("document", causal, d), d)
    for s in scheds:
        e = emit(ir, s)
        # the flag narrows the unmasked path's use: the id compare (a per-key load of doc)
        # sits only in the masked softmax, so the loop holds one unmasked and one masked copy
        assert "%tpa" in e.ptx and "setp.neu.and.f32" in e.ptx and "%full+" in e.ptx
        assert e.ptx.count("// softmax (masked tile)") == e.ptx.count("// softmax\n")
        _compile_clean(e, ir, s)


# ---- ALiBi: one-sided tiles build the bias from one value a row ----------------------------


def test_alibi_is_recognised_in_its_forms_only():
    from factory.spec import expr as E

    for v in ("plain", "softcap", "window", "document"):
        assert I.alibi_of(I.lower(workload(v, False)).score) is None
    k, coef = I.alibi_of(I.lower(workload("alibi", True)).score)
    assert k == 1.0 and isinstance(coef, E.Gather) and coef.x.name == "slope"
    from factory.spec.attention import PLACEHOLDERS

    s_, i_, j_ = (PLACEHOLDERS[n] for n in "sij")
    ab = E.Unary("abs", E.Binary("sub", j_, i_, ()), ())
    c = E.Const(0.5)
    assert I.alibi_of(
        E.Binary("sub", E.Binary("mul", s_, E.Const(2.0), ()), E.Binary("mul", ab, c, ()), ())
    ) == (2.0, c)
    # abs(i - 2 j), abs(i - j + 1), a coefficient reading i: the per-element form
    bad = [
        E.Unary("abs", E.Binary("sub", i_, E.Binary("mul", j_, E.Const(2.0), ()), ()), ()),
        E.Unary("abs", E.Binary("add", E.Binary("sub", i_, j_, ()), E.Const(1.0), ()), ()),
    ]
    for x in bad:
        assert I.alibi_of(E.Binary("sub", s_, E.Binary("mul", c, x, ()), ())) is None
    assert I.alibi_of(E.Binary("sub", s_, E.Binary("mul", i_, ab, ()), ())) is None


def test_the_incremental_bias_stays_within_its_stated_error_bound():
    rng = np.random.default_rng(9)
    worst = 0.0
    for _ in range(300):
        coef = float(np.float32(rng.uniform(0.001, 0.1)))
        bn = int(rng.choice([64, 128, 176]))
        side = int(rng.choice([1, -1]))
        i = np.arange(int(rng.integers(0, 16384)), 0, -1)[:16]
        if side > 0:
            j0 = int(rng.integers(0, max(1, i.min() - bn + 2)))
            j0 = min(j0, i.min() - bn + 1)
        else:
            j0 = int(rng.integers(i.max(), 16384 + 1))
        if j0 < 0:
            continue
        j = j0 + np.arange(bn)
        exact = -coef * np.abs(i[:, None] - j[None, :]) * T.LOG2E
        got = T.alibi_bias(coef, side, i, j0, bn).astype(np.float64)
        c = coef * T.LOG2E
        bound = 2.0**-24 * (4 * np.abs(exact) + c * bn) + 1e-30
        assert (np.abs(got - exact) <= bound).all()
        worst = max(worst, float((np.abs(got - exact) / bound).max()))
    assert worst > 0.05  # the bound is not vacuous


def _alibi_case(causal, seq, slopes):
    """The ALiBi workload at d 64, one batch, two query heads on one kv head and `seq` tokens,
    with the given per-head slopes: its IR, float64 reference and float32 q, k, v and extras."""
    shape = {"B": 1, "H": 2, "HKV": 1, "S": seq}
    w = workload("alibi", causal, 64, shape)
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=4)
    x["slope"] = np.array(slopes, np.float32)
    ref = reference(w, x, dims)
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    extra = {e.name: f64(w, x, e.name) for e in ir.extra}
    return ir, ref, q, k, v, extra


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bm, bn", [(128, 128), (128, 64), (64, 64)])
def test_the_model_with_one_sided_alibi_tiles_matches_the_reference(causal, bm, bn):
    ir, ref, q, k, v, extra = _alibi_case(causal, 700, [0.004, 0.0625])
    stats = {}
    out, lse, _ = simulate_bound(ir, bm, bn, q, k, v, extra, stats=stats)
    err = np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"])
    assert err < 5e-3, err
    np.testing.assert_allclose(lse, ref["lse"], atol=1e-4, rtol=1e-4)
    assert stats["alibi_sided"] > 0


def test_the_model_catches_a_diagonal_tile_taken_as_one_sided(monkeypatch):
    ir, ref, q, k, v, extra = _alibi_case(False, 400, [0.05, 0.1])
    good = T.alibi_side
    monkeypatch.setattr(T, "alibi_side", lambda i0, r, j0, bn: good(i0, r, j0, bn) or 1)
    out, _, _ = simulate_bound(ir, 64, 64, q, k, v, extra)
    assert np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"]) > 0.02


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_alibi_ptx_has_the_one_sided_paths_and_compiles_without_spills(causal, d):
    from factory.families.attention.emit import emit

    ir, scheds = _every_fifth_and_the_wide_tile(workload("alibi", causal, d), d)
    for s in scheds:
        e = emit(ir, s)
        assert "(ALiBi, keys before the rows)" in e.ptx
        assert ("(ALiBi, keys after the rows)" in e.ptx) == (not causal)
        _compile_clean(e, ir, s)


# ---- the band per warp, and its integer test on masked tiles --------------------------------


def test_the_integer_band_test_matches_brute_force():
    rng = np.random.default_rng(2)
    for _ in range(3000):
        skv = int(rng.integers(1, 3000))
        i = int(rng.integers(0, 3000))
        lo = [None, -1023, -40, 0][int(rng.integers(0, 4))]
        hi = [None, 0, 5, 1023][int(rng.integers(0, 4))]
        j0 = int(rng.integers(0, 3000)) // 64 * 64
        colb = int(rng.choice([0, 2, 4, 6]))
        lo_h, hi_h = T.band_columns(i, j0, colb, skv, lo, hi)
        for n in (0, 1, 8, 9, 56, 57, 120, 121, 168, 169):
            j = j0 + colb + n
            want = j < skv and (lo is None or j >= i + lo) and (hi is None or j <= i + hi)
            assert (n <= hi_h and (lo_h is None or lo_h <= n)) == want


def _window_case(causal, shape, window):
    w = workload("window", causal, 64, shape, window=window)
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=8)
    ref = reference(w, x, dims)
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    _, mask_fn = T.ir_functions(ir)
    return ir, ref, q, k, v, lambda i, j, h, b: mask_fn(i, j, h, b, {})


@pytest.mark.parametrize("causal", [False, True])
def test_warps_inside_the_band_skip_the_mask_and_the_model_matches_the_reference(causal):
    ir, ref, q, k, v, mask_fn = _window_case(causal, {"B": 1, "H": 2, "HKV": 1, "S": 777}, 256)
    per_tile = 0
    for bm, bn in ((128, 64), (128, 128), (64, 64)):
        stats = {}
        out, lse, _ = T.simulate(ir, bm, bn, q, k, v, {}, mask_fn=mask_fn, stats=stats)
        err = np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"])
        assert err < 5e-3, (bm, bn, err)
        np.testing.assert_allclose(lse, ref["lse"], atol=1e-4, rtol=1e-4)
        # the tiles one flag for the whole tile would mask, counted in warps
        n_q = T.ceildiv(777, bm)
        for qt in range(n_q):
            first, end = T.kv_tiles(qt * bm, bm, 777, bn, ir.band_lo, ir.band_hi)
            for t in range(first, end):
                full = T.tile_is_full(qt * bm, bm, t * bn, bn, 777, ir.band_lo, ir.band_hi)
                per_tile += 0 if full else 2 * bm // T.WARP_ROWS
        if (bm, bn) == (128, 64):
            assert stats["masked"] < per_tile  # some warps of crossing tiles skip the mask
        per_tile = 0


def test_the_model_catches_a_warp_flag_that_checks_half_its_rows(monkeypatch):
    ir, ref, q, k, v, mask_fn = _window_case(True, {"B": 1, "H": 2, "HKV": 1, "S": 500}, 200)
    good = T.tile_is_full
    monkeypatch.setattr(T, "tile_is_full", lambda i0, rows, *a: good(i0, rows // 2, *a))
    out, _, _ = T.simulate(ir, 128, 64, q, k, v, {}, mask_fn=mask_fn)
    assert np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"]) > 0.02


@pytest.mark.parametrize("variant", ["window", "plain", "softcap"])
@pytest.mark.parametrize("causal", [False, True])
def test_band_masked_tiles_compare_integers_and_compile_without_spills(variant, causal):
    from factory.families.attention.emit import emit

    w = workload(variant, causal, 128, window=1024)
    fam, ir = families.family_for(w)
    scheds = fam.space(ir, list(w.shapes))[::6]
    scheds.append(S.AttentionSchedule(128, 128, 2, overlap=True, pingpong=True))
    for s in scheds:
        e = emit(ir, s)
        # a band's masked tiles: integer bounds a row, no conversion of i or j to float
        masked = e.ptx.split("// softmax (masked tile)")[1].split("max.f32")[0]
        assert "cvt.rn.f32.u32" not in masked
        banded = ir.band_lo is not None or ir.band_hi is not None
        assert ("setp.ge.s32" in masked) == banded
        if s.block_n < s.block_m:  # the band flag per warp (from %tid.x)
            assert "%tid.x" in e.ptx.split("// softmax")[0].split("S = Q K^T")[-1]
        _compile_clean(e, ir, s)
