"""The attention family on the CPU: the mask's band analysis, the tile skip arithmetic against
brute force, a numpy model of the kernel's loop against the float64 reference for every
variant, and emitted PTX that compiles for sm_90a without spills."""

import itertools
import random

import numpy as np
import pytest
from test_attention_helpers import f64, simulate_bound, workload

from factory import families
from factory.families.attention import features as F
from factory.families.attention import ir as I
from factory.families.attention import schedule as S
from factory.families.attention import tiling as T
from factory.spec import load_manifest
from factory.spec.reference import random_inputs, reference
from lab.attention.variants import VARIANTS, manifest


@pytest.mark.parametrize(
    "mask, band, elementwise",
    [
        ([], (None, None), 0),
        (["j <= i"], (None, 0), 0),
        (["j < i"], (None, -1), 0),
        (["i >= j"], (None, 0), 0),
        (["i - j < 1024"], (-1023, None), 0),
        (["j <= i", "i - j < 1024"], (-1023, 0), 0),
        (["j - i >= -5", "2 * j <= 2 * i + 6"], (-5, 3), 0),
        (["j == i"], (0, 0), 0),
        (["doc[i] == doc[j]"], (None, None), 1),
        (["j <= i", "doc[i] == doc[j]"], (None, 0), 1),
        (["j * 2 <= i"], (None, None), 1),  # not a band of j - i: masked element by element
    ],
)
def test_mask_terms_become_a_band_of_j_minus_i(mask, band, elementwise):
    text = manifest("document", False, 64, lse=False).replace(
        "mask=['doc[i] == doc[j]']", "mask=[" + ", ".join(f"'{m}'" for m in mask) + "]"
    )
    if not mask:
        text = text.replace(", mask=[]", "")
    ir = I.lower(load_manifest(text))
    assert (ir.band_lo, ir.band_hi) == band
    assert len(ir.elementwise) == elementwise


def test_kv_tile_range_and_full_tiles_match_brute_force():
    rng = random.Random(7)
    for _ in range(400):
        bm, bn = rng.choice([64, 128]), rng.choice([64, 128])
        skv = rng.randint(1, 700)
        i0 = rng.randrange(0, 800, bm)
        lo = rng.choice([None, -1023, -40, -1, 0, 5])
        hi = rng.choice([None, 0, -1, 3, 100])
        first, end = T.kv_tiles(i0, bm, skv, bn, lo, hi)
        for t in range(T.ceildiv(skv, bn)):
            j0 = t * bn
            pairs = [
                (lo is None or j >= i + lo) and (hi is None or j <= i + hi) and j < skv
                for i in range(i0, i0 + bm)
                for j in range(j0, j0 + bn)
            ]
            assert (first <= t < end) == any(pairs), (i0, bm, skv, bn, lo, hi, t)
            assert T.tile_is_full(i0, bm, j0, bn, skv, lo, hi) == all(pairs)


@pytest.mark.parametrize(
    "variant, causal, d", [(v, c, d) for v in VARIANTS for c in (False, True) for d in (64,)]
)
def test_the_kernel_model_matches_the_reference(variant, causal, d):
    # odd lengths: the last query and key tiles are partial; GQA with two query heads a kv head
    shape = {"B": 2, "H": 4, "HKV": 2, "S": 301}
    w = workload(variant, causal, d, shape)
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=11)
    if variant == "document":  # contiguous documents, as packed sequences have them
        x["doc"] = np.sort(x["doc"], axis=1).astype(np.int32)
    ref = reference(w, x, dims)
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    extra = {e.name: f64(w, x, e.name) for e in ir.extra}
    for bm, bn in ((128, 128), (64, 64)):
        out, lse, visited = simulate_bound(ir, bm, bn, q, k, v, extra)
        err = np.linalg.norm(out - ref["o"]) / np.linalg.norm(ref["o"])
        assert err < 5e-3, (bm, bn, err)
        np.testing.assert_allclose(lse, ref["lse"], atol=1e-4, rtol=1e-4)
        total = 2 * 4 * T.ceildiv(301, bm) * T.ceildiv(301, bn)
        if causal or variant in ("window", "document"):
            assert visited < total  # whole tiles skipped
        else:
            assert visited == total


@pytest.mark.parametrize(
    "mask, matches",
    [
        (["doc[i] == doc[j]"], ("doc",)),
        (["doc[j] == doc[i]", "j <= i"], ("doc",)),
        (["doc[i] != doc[j]"], ()),
        (["doc[i] <= doc[j]"], ()),
        (["doc[i] == doc[i]"], ()),
    ],
)
def test_an_id_match_term_is_recognised(mask, matches):
    text = manifest("document", False, 64, lse=False).replace(
        "mask=['doc[i] == doc[j]']", "mask=[" + ", ".join(f"'{m}'" for m in mask) + "]"
    )
    assert I.lower(load_manifest(text)).id_matches == matches


def test_id_tiles_never_drop_a_matching_key():
    rng = np.random.default_rng(3)
    narrowed = 0
    for case in range(300):
        bm, bn = int(rng.choice([64, 128])), int(rng.choice([64, 128]))
        sq = int(rng.integers(1, 600))
        skv = int(rng.integers(1, 600))
        n_ids = max(sq, skv) - int(rng.integers(0, 3))  # at times shorter: reads past it are 0
        ids = rng.integers(0, int(rng.choice([2, 5, 40])), n_ids).astype(np.float32)
        if case % 2:
            ids = np.sort(ids)  # contiguous documents
        if case % 7 == 0:
            ids[rng.integers(0, n_ids)] = np.nan  # matches nothing, not even itself
        i0 = int(rng.integers(0, T.ceildiv(sq, bm))) * bm
        n = T.ceildiv(skv, bn)
        first = int(rng.integers(0, n))
        end = int(rng.integers(first, n + 1))
        f2, e2 = T.id_tiles(first, end, i0, bm, sq, skv, bn, ids)
        padded = np.concatenate([ids, np.zeros(1200, np.float32)])
        rows = padded[i0 : min(i0 + bm, sq)]
        for t in range(first, end):
            keys = padded[t * bn : min(t * bn + bn, skv)]
            match = bool((rows[:, None] == keys[None, :]).any())
            if match:
                assert f2 <= t < e2, (case, t, first, end, f2, e2)
        if e2 > f2:
            assert first <= f2 and e2 <= end
        narrowed += (e2 - f2) < (end - first)
    assert narrowed > 50  # the narrowing does skip tiles


def test_the_model_catches_a_narrowing_that_drops_a_tile(monkeypatch):
    w = workload("document", False, 64, {"B": 1, "H": 2, "HKV": 1, "S": 300})
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=5)
    x["doc"] = np.sort(x["doc"], axis=1).astype(np.int32)
    ref = reference(w, x, dims)["o"]
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    extra = {"doc": f64(w, x, "doc")}
    _, mask_fn = T.ir_functions(ir)
    good = T.id_tiles

    def short(*a):
        f, e = good(*a)
        return f, max(f, e - 1)  # loses the last tile that holds a match

    monkeypatch.setattr(T, "id_tiles", short)
    out, _, _ = T.simulate(
        ir, 64, 64, q, k, v, extra, mask_fn=lambda i, j, h, b: mask_fn(i, j, h, b, extra)
    )
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) > 0.05


def test_the_model_catches_a_wrong_band():
    w = workload("plain", True, 64, {"B": 1, "H": 2, "HKV": 1, "S": 200})
    ir = I.lower(w)
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=1)
    ref = reference(w, x, dims)["o"]
    q, k, v = (f64(w, x, n).astype(np.float32) for n in ("q", "k", "v"))
    wrong = ir.__class__(**{**ir.__dict__, "band_hi": -64})  # skips the diagonal tiles
    score_fn, mask_fn = T.ir_functions(ir)
    out, _, _ = T.simulate(
        wrong, 64, 64, q, k, v, {}, mask_fn=lambda i, j, h, b: mask_fn(i, j, h, b, {})
    )
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) > 0.1


def test_unmasked_flops_count_half_the_square_for_causal():
    w = workload("plain", True, 128, {"B": 2, "H": 4, "HKV": 4, "S": 1024})
    fl = families.get("attention").roofline_of(w, w.shapes[0]).flops
    assert fl == 4 * 128 * 2 * 4 * (1024 * 1025 // 2)
    w2 = workload("plain", False, 128, {"B": 2, "H": 4, "HKV": 4, "S": 1024})
    assert families.get("attention").roofline_of(w2, w2.shapes[0]).flops == 4 * 128 * 8 * 1024**2


def test_the_registry_routes_attention_to_the_family():
    w = workload("softcap", True, 128)
    fam, ir = families.family_for(w)
    assert fam.name == "attention" and isinstance(ir, I.AttentionIR)
    sched = fam.default_schedule(ir, list(w.shapes))
    assert fam.label(sched.to_dict()).startswith("fa 128x128")
    assert len(fam.features(sched.to_dict(), w.shapes[0], [])) == len(F.FEATURE_NAMES)
    assert all(fam.is_valid(ir, s, w.shapes[0])[0] for s in fam.space(ir, list(w.shapes)))


def test_validity_refuses_what_does_not_fit():
    ir = I.lower(workload("plain", False, 128))
    assert "shared memory" in S.is_valid(ir, S.AttentionSchedule(block_n=128, stages=4))
    assert S.is_valid(ir, S.AttentionSchedule(block_n=96)) is not None
    bad = {"B": 1, "H": 6, "HKV": 4, "S": 10}
    assert "multiple" in S.is_valid(ir, S.AttentionSchedule(), bad)


@pytest.mark.parametrize(
    "variant, causal, d",
    [(v, c, d) for v, c, d in itertools.product(VARIANTS, (False, True), (64, 128))],
)
def test_emitted_ptx_compiles_for_sm90a_without_spills(variant, causal, d):
    from factory.compile import compile_ptx
    from factory.families.attention.wholeprog import (
        compile_whole,
        find_ptxas,
        setmaxnreg_ignored,
    )

    w = workload(variant, causal, d)
    fam, ir = families.family_for(w)
    step = 7 if (variant, causal) != ("plain", False) else 2
    for s in fam.space(ir, list(w.shapes))[::step]:
        e = fam.emit(ir, s, "sm_90")
        # nvJitLink (relocatable: setmaxnreg ignored, every thread at the entry's count) must
        # not spill where the fragments fit that count; ptxas as a whole program (setmaxnreg
        # honoured) must not spill anywhere
        compilers = [compile_ptx] if S.fits_relocatable(ir, s) else []
        if find_ptxas() is not None:
            compilers.append(compile_whole)
        for comp in compilers:
            r = comp(e.ptx, "sm_90a")
            assert r.ok, r.log[:2000]
            assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (s, comp)
            assert r.stack_bytes == 0, (s, comp)
            # a subroutine call (rcp.rn, a division) makes ptxas serialise the wgmmas (C7509)
            assert "C7509" not in r.log, [x for x in r.log.splitlines() if "C7509" in x]
            if comp is compile_whole:
                assert not setmaxnreg_ignored(r), r.log[:2000]
        assert e.launch.smem_bytes <= 227 * 1024


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_ring_protocol_with_release_one_tile_late_neither_deadlocks_nor_overwrites(stages):
    # the overlapped loop frees a K/V slot only after the next tile's S is issued (the matmul
    # ring's "release one k-block later" pattern, two consumer warpgroups reading every slot)
    from factory.families.matmul.tiling import simulate_ring

    for seed in range(20):
        reads = simulate_ring(1, 9, stages, pingpong=False, seed=seed)
        assert sorted(p for c, p in reads if c == 0) == list(range(9))


@pytest.mark.parametrize("variant", VARIANTS)
def test_tensor_maps_and_grid_fit_the_hardware_at_the_issue_shapes(variant):
    from factory.spec import eval_dim_expr
    from gpuworker import tensormap
    from lab.attention.bench import CHECK_SHAPES, TIME_SHAPES, shape_dims

    for shape in TIME_SHAPES + CHECK_SHAPES:
        d = shape[4]
        w = load_manifest(manifest(variant, True, d, shape_dims(shape)))
        fam, ir = families.family_for(w)
        dims = shape_dims(shape)
        for s in fam.space(ir, [dims])[::9]:
            e = fam.emit(ir, s, "sm_90a")
            for p in e.params:
                if p.kind == "tmap":
                    plan = tensormap.plan(
                        {"dims": list(p.dims), "box": list(p.box), "swizzle": p.swizzle},
                        dims,
                        "bf16",
                    )
                    assert plan["extents"][0] == d and plan["box"][0] == 64
            grid = [eval_dim_expr(g, dims) for g in e.launch.grid]
            # query tiles fastest (K and V shared in L2 by the CTAs running together)
            assert grid[1] == dims["H"] and grid[2] == dims["B"]
            assert grid[0] * s.block_m >= dims["S"] > (grid[0] - 1) * s.block_m
            assert max(grid[1:]) <= 65535


@pytest.mark.parametrize("variant, d", [("softcap", 128), ("document", 128), ("alibi", 64)])
def test_schedules_only_a_whole_program_compile_fits_compile_clean_with_ptxas(
    variant, d, monkeypatch
):
    # the overlapped 128x128 tiles at head dim 128 need setmaxnreg honoured: outside the space
    # the GPU worker (nvJitLink) searches, inside it once WHOLE_PROGRAM says ptxas compiles
    from factory.families.attention.wholeprog import (
        compile_whole,
        find_ptxas,
        setmaxnreg_ignored,
    )

    if find_ptxas() is None:
        pytest.skip("no CUDA toolkit ptxas here")
    w = workload(variant, True, d)
    fam, ir = families.family_for(w)
    narrow = fam.space(ir, list(w.shapes))
    monkeypatch.setattr(S, "WHOLE_PROGRAM", True)
    wide = fam.space(ir, list(w.shapes))
    only_whole = [s for s in wide if s not in narrow]
    assert all(not S.fits_relocatable(ir, s) for s in only_whole)
    if d == 128:
        assert any(s.pingpong and s.block_n == 128 for s in only_whole)
    for s in only_whole[::3]:
        r = compile_whole(fam.emit(ir, s, "sm_90a").ptx, "sm_90a")
        assert r.ok, r.log[:2000]
        assert r.spill_store_bytes == 0 and r.stack_bytes == 0, s
        assert not setmaxnreg_ignored(r) and "C7509" not in r.log


@pytest.mark.parametrize("overlap, pingpong", [(False, False), (True, False), (True, True)])
def test_the_pipeline_protocol_neither_deadlocks_nor_reads_a_wrong_or_unlanded_tile(
    overlap, pingpong
):
    # the producer's K and V loads, the consumers' waits and frees (K after S, V after P V)
    # and the ping-pong turns, under random interleavings (tiling.simulate_pipeline)
    for n, stages, seed in itertools.product((0, 1, 2, 3, 7), (2, 3, 4), range(12)):
        reads = T.simulate_pipeline(n, stages, overlap, pingpong, 2, seed)
        for c in range(2):
            for kind in "KV":
                got = sorted(t for cc, k, t in reads if (cc, k) == (c, kind))
                assert got == [(0, t) for t in range(n)]
    # persistent CTAs: several work tiles (some without keys), Q freed after each one's loop,
    # the ring and the ping-pong turns running on across them
    for work, stages, seed in itertools.product(
        ([3, 0, 5, 1], [1, 1], [0, 0], [6, 2]), (2, 3), range(8)
    ):
        reads = T.simulate_pipeline(0, stages, overlap, pingpong, 2, seed, work=work)
        want = sorted((w, t) for w, n in enumerate(work) for t in range(n))
        for c in range(2):
            for kind in "KV":
                assert sorted(t for cc, k, t in reads if (cc, k) == (c, kind)) == want


def test_the_pipeline_model_catches_a_v_slot_freed_before_its_p_v():
    import inspect

    src = inspect.getsource(T.simulate_pipeline)
    good = """                    yield from wait_group(0)
                    arrive(("emptyV", poff))
                    poff, pphase = stage, phase"""
    bad = """                    arrive(("emptyV", poff))
                    yield from wait_group(0)
                    poff, pphase = stage, phase"""
    assert good in src
    ns = {}
    exec(compile("import random\n" + src.replace(good, bad), "mutant", "exec"), ns)  # noqa: S102
    caught = 0
    for seed in range(40):
        try:
            ns["simulate_pipeline"](9, 2, True, True, 2, seed)
        except AssertionError:
            caught += 1
    assert caught > 10


def test_the_pipeline_model_catches_q_freed_early_and_a_turn_given_every_tile():
    import inspect

    src = inspect.getsource(T.simulate_pipeline)
    free_q = """            if persistent:
                arrive(("emptyQ", 0))
            qit ^= 1"""
    wait_q = """            yield from wait_bar(("fullQ", 0), qit)
"""
    loop = """        for w, n in enumerate(work):
            yield from wait_bar(("fullQ", 0), qit)"""
    assert free_q in src and wait_q in src and loop in src
    early = src.replace(free_q, "            qit ^= 1").replace(
        wait_q,
        wait_q
        + """            if persistent:
                arrive(("emptyQ", 0))
""",
    )
    every = src.replace(
        loop,
        """        for w, n in enumerate(work):
            if pingpong and c == 1 and w:
                named_arrive(1)
            yield from wait_bar(("fullQ", 0), qit)""",
    )
    for mutant in (early, every):
        ns = {}
        exec(compile("import random\n" + mutant, "mutant", "exec"), ns)  # noqa: S102
        caught = 0
        for seed in range(20):
            try:
                ns["simulate_pipeline"](0, 2, True, True, 2, seed, work=[3, 4, 2])
            except AssertionError:
                caught += 1
        assert caught > 5


@pytest.mark.parametrize("variant", ["plain", "softcap", "window", "alibi"])
def test_persistent_kernels_compile_clean_and_refuse_id_narrowing(variant):
    from factory.families.attention.emit import emit
    from factory.families.attention.wholeprog import compile_whole, find_ptxas

    ir = I.lower(workload(variant, True, 128))
    sch = S.AttentionSchedule(128, 128, 2, overlap=True, pingpong=True, persistent=True)
    assert S.is_valid(ir, sch) is None
    e = emit(ir, sch)
    assert e.launch.grid[1:] == (1, 1) and "min(" in e.launch.grid[0]
    assert "%nctaid.x" in e.ptx and "qempty" in e.ptx
    if find_ptxas() is not None:
        r = compile_whole(e.ptx, "sm_90a")
        assert r.ok and r.spill_store_bytes == 0 and r.stack_bytes == 0, r.log[:2000]
    doc = I.lower(workload("document", True, 128))
    assert "persistent" in S.is_valid(doc, sch)


def test_the_polynomial_tanh_is_fp32_accurate_inside_its_range_and_only_used_there():
    from factory.families.attention import emit as EM

    x = np.linspace(-EM.TANH_FAST_T, EM.TANH_FAST_T, 200001).astype(np.float32)
    ref = np.tanh(x.astype(np.float64))
    rel = np.abs(EM.tanh_poly(x) - ref) / np.maximum(np.abs(ref), 1e-30)
    assert rel.max() < 2e-7
    # the bound on |S| that keeps s / 30 (the soft cap's argument) inside the range
    ir = I.lower(workload("softcap", True, 128))
    k = EM._Kernel(ir, S.AttentionSchedule(128, 128, 2, poly_tanh=True))
    assert k.fast_tanh_bound() == pytest.approx(EM.TANH_FAST_T * 30 / ir.scale)
    assert EM._Kernel(ir, S.AttentionSchedule(128, 128, 2)).fast_tanh_bound() is None
    for v in ("plain", "alibi", "window"):
        kv = EM._Kernel(I.lower(workload(v, True, 128)), S.AttentionSchedule(poly_tanh=True))
        assert kv.fast_tanh_bound() is None
    from factory.spec import expr as E

    s_ = E.Input("s", (), "fp32")
    c = E.Const(4.0)
    assert EM.linear_in_s(E.Binary("mul", c, s_, ())) == 4.0
    assert EM.linear_in_s(E.Binary("div", s_, c, ())) == 0.25
    assert EM.linear_in_s(E.Binary("add", s_, c, ())) is None
    ptx = k.render().ptx
    assert ptx.count("vote.sync.all.pred") >= 1 and ptx.count("rcp.approx") >= 2
