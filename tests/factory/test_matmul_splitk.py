"""Split-K in the wgmma GEMM emitter: the validity rules, emission and nvJitLink compilation of
each split-K schedule, the emitted partial-tile offsets against tiling's layout, and a numpy
model of the split-K tile loop (k ranges, partial stores, the rank-ordered sum of each CTA's
share of columns, guarded stores) against a direct product. No GPU needed."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import importlib  # noqa: E402

gemm_emit = importlib.import_module("factory.families.matmul.emit")
from test_matmul_helpers import nvjitlink_available  # noqa: E402

from factory.families.matmul import schedule as sched_mod  # noqa: E402
from factory.families.matmul import tiling  # noqa: E402
from factory.families.matmul.ir import plain  # noqa: E402
from factory.families.matmul.schedule import GemmSchedule, is_valid  # noqa: E402
from factory.spec import eval_dim_expr  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

SK = GemmSchedule(tile_n=256, stages=4, split_k=2, persistent=False)
SK_NAMES = [sn for sn, s in schedules().items() if s.split_k > 1]


@pytest.fixture
def verified(monkeypatch):
    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)  # the tile_k 128 variants
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)  # the cp.async-loaded ones


def test_split_k_is_open_and_its_flag_still_gates_it(monkeypatch):
    # verified on an H100 (bench/results/2026-12-07-h100-matmul-splitk)
    assert is_valid(plain(), SK) is None
    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", False)
    assert "not yet verified" in is_valid(plain(), SK)


def test_split_k_refusals(verified):
    ir = plain()
    assert is_valid(ir, SK) is None
    assert "persistent" in is_valid(ir, replace(SK, persistent=True))
    assert "split_k must be" in is_valid(ir, replace(SK, split_k=3))
    assert "pingpong" in is_valid(ir, replace(SK, tile_n=128, stages=6, pingpong=True))
    assert "2x1" in is_valid(ir, replace(SK, cluster_m=2))
    # 128 x 256 fp32 = 128 KiB does not fit a ring of 2 x 48 KiB
    assert "partial" in is_valid(ir, replace(SK, stages=2))
    assert is_valid(ir, replace(SK, stages=3)) is None
    # SwiGLU's two partials: 2 x 128 x 128 x 4 = 128 KiB, ring 4 x 48 KiB
    assert is_valid(epilogue_irs()["swiglu"], replace(SK, tile_n=128)) is None
    # split 4 of 128 accumulator registers a thread: no spill since the reduction no longer
    # loops back to the main loop (test_split_k_schedules_emit_and_compile)
    assert is_valid(ir, replace(SK, split_k=4)) is None
    assert is_valid(epilogue_irs()["swiglu"], replace(SK, tile_n=128, split_k=4)) is None
    assert is_valid(ir, replace(SK, split_k=4, tile_n=128)) is None


def test_split_k_launch_is_one_cluster_per_tile(verified):
    for sn in SK_NAMES:
        s = schedules()[sn]
        e = gemm_emit.emit(plain(), s)
        assert e.launch.cluster == (s.split_k, 1, 1)
        assert f".reqnctapercluster {s.split_k}, 1, 1" in e.ptx
        for m, n in [(128, 8192), (512, 4096), (1, 1), (4095, 4097)]:
            tiles = tiling.ceildiv(m, s.tile_m) * tiling.ceildiv(n, s.tile_n)
            got = eval_dim_expr(e.launch.grid[0], {"M": m, "N": n, "K": 8192})
            assert got == tiles * s.split_k


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize("op", ["plain", "bias_gelu", "residual", "relu2", "swiglu"])
@pytest.mark.parametrize("sn", SK_NAMES)
def test_split_k_schedules_emit_and_compile(op, sn, verified):
    from factory.compile import compile_ptx

    ir, s = epilogue_irs()[op], schedules()[sn]
    why = is_valid(ir, s)
    if why is not None:
        # the only refusals among these: a second weight with a 256-wide tile or a deep ring
        assert ir.b2 is not None and ("256" in why or "shared memory" in why), why
        return
    e = gemm_emit.emit(ir, s)
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok, r.log[-2000:]
    # nvJitLink keeps every warp at 168 registers (setmaxnreg ignored); what is_valid lets
    # through does not spill, and ptxas does not serialise its wgmmas (C7515: accumulators
    # written by the reduction on a path back into the main loop)
    assert r.spill_store_bytes == 0, r.spill_store_bytes
    assert "C7515" not in r.log and "C7509" not in r.log, r.log[-2000:]
    assert r.registers <= 255


def test_emitted_partial_offsets_follow_the_model(verified):
    for sn in SK_NAMES:
        for op in ("plain", "swiglu"):
            ir, s = epilogue_irs()[op], schedules()[sn]
            if is_valid(ir, s) is not None:
                continue
            e = gemm_emit.emit(ir, s)
            accs = 2 if ir.b2 else 1
            blocks, threads = s.tile_n // 8, 128 * s.consumers
            stores = [int(x) for x in re.findall(r"st\.shared\.v4\.f32 \[%r\d+\+(\d+)\]", e.ptx)]
            want = [
                tiling.splitk_partial_offset(a, g, 0, blocks, threads)
                for a in range(accs)
                for g in range(blocks)
            ]
            assert stores == want
            assert max(want) + threads * 16 == s.partial_bytes(ir) <= s.ring_bytes(ir)
            # every CTA reads each group of its share from every CTA of the cluster: in all,
            # each group once from each rank
            loads = [
                int(x)
                for x in re.findall(
                    r"ld\.shared::cluster\.v4\.f32 \{[^}]*\}, \[%r\d+\+(\d+)\]", e.ptx
                )
            ]
            assert sorted(loads) == sorted(want * s.split_k)
            # the k range of each rank, as splitk_range writes it
            assert "div.u32 %kb0, %kb0, " + str(s.split_k) in e.ptx


@pytest.mark.parametrize(("nk", "split_k"), [(128, 4), (3, 4), (1, 2), (7, 2), (64, 4)])
def test_split_ranges_cover_k_once(nk, split_k):
    covered = [kb for r in range(split_k) for kb in range(*tiling.splitk_range(r, nk, split_k))]
    assert covered == list(range(nk))


@pytest.mark.parametrize(("blocks", "split_k"), [(32, 4), (16, 4), (8, 2), (8, 4)])
def test_shares_cover_the_tile_once(blocks, split_k):
    got = [g for r in range(split_k) for g in tiling.splitk_share(r, blocks, split_k)]
    assert got == list(range(blocks))


@pytest.mark.parametrize(
    ("m", "n", "k", "tile_m", "tile_n", "consumers", "split_k", "two"),
    [
        (130, 300, 200, 128, 256, 2, 4, False),  # tails in M, N and K; 4 k-blocks over 4 CTAs
        (70, 90, 64, 64, 64, 1, 2, True),  # one k-block: CTA 0 sums nothing (a zero partial)
        (1, 17, 8, 64, 128, 1, 4, False),  # one row, K below one k-block
        (64, 128, 520, 128, 128, 2, 4, True),  # 9 k-blocks split 2, 2, 2, 3
    ],
)
def test_split_k_model_matches_direct_product(m, n, k, tile_m, tile_n, consumers, split_k, two):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((n, k))
    b2 = rng.standard_normal((n, k)) if two else None
    outs = tiling.simulate_splitk(a, b, tile_m, tile_n, consumers, split_k, b2)
    np.testing.assert_allclose(outs[0], a @ b.T, rtol=1e-12, atol=1e-9)
    if two:
        np.testing.assert_allclose(outs[1], a @ b2.T, rtol=1e-12, atol=1e-9)


def test_split_k_model_catches_a_wrong_share():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((64, 128)), rng.standard_normal((64, 128))
    orig = tiling.splitk_share
    try:
        # a share that drops the last block of each rank leaves columns unwritten
        tiling.splitk_share = lambda r, blocks, sk: range(
            r * blocks // sk, (r + 1) * blocks // sk - 1
        )
        with pytest.raises(AssertionError):
            tiling.simulate_splitk(a, b, 64, 64, 1, 2)
    finally:
        tiling.splitk_share = orig


def test_space_holds_split_k_once_verified(verified):
    from factory.families.matmul import space

    space._SPACES.clear()
    pool = space.space(plain(), [{"M": 128, "N": 8192, "K": 8192}])
    assert {s.split_k for s in pool} == {1, 2, 4}
    assert all(not s.persistent for s in pool if s.split_k > 1)
    space._SPACES.clear()
