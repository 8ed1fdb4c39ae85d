"""The cp.async load path of the wgmma GEMM (schedule load = "cp_async", for K % 64 != 0): a numpy
model of the producer warpgroup's 16-byte chunks writes the same swizzled tile as the TMA, tails
included; the emitted PTX issues those chunks (offsets, predicates, barrier counts, the proxy
fence); a tile loop over the chunk model equals a direct product; the validity gate, the space,
the default and the seeds; the lab benches can name the schedules (nvJitLink compiles of every
cp.async variant are in test_matmul_emit.test_every_schedule_emits_and_compiles)."""

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
from factory.families.matmul import schedule as sched_mod  # noqa: E402
from factory.families.matmul import space, tiling  # noqa: E402
from factory.families.matmul.ir import plain  # noqa: E402
from factory.families.matmul.schedule import GemmSchedule, is_valid  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

CPA = GemmSchedule(tile_n=256, stages=4, tma_store=128, load="cp_async")


@pytest.fixture
def verified(monkeypatch):
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)
    space._SPACES.clear()
    yield
    space._SPACES.clear()


def test_each_thread_owns_distinct_chunks_of_one_row_group():
    seen = set()
    for t in range(tiling.PRODUCER_THREADS):
        r0, c, dst = tiling.cp_async_thread(t)
        assert dst == tiling.swizzle128(r0, c)
        for i in range(16):  # up to 256 rows
            # row r0 + 16 i lands where the TMA puts its chunk c
            assert dst + 2048 * i == tiling.swizzle128(r0 + 16 * i, c)
            seen.add((r0 + 16 * i, c))
    assert seen == {(r, c) for r in range(256) for c in range(8)}


@pytest.mark.parametrize(
    ("n_rows", "k", "row0", "k0", "rows"),
    [
        (333, 72, 256, 64, 128),  # M tail (77 rows) and K tail (8 of 64 k)
        (333, 72, 0, 0, 128),
        (248, 72, 0, 64, 256),  # N tail of a 256-row B tile
        (4104, 1032, 4096, 1024, 256),  # 8 rows, 8 k: the last tile's last k-block
        (3000, 2056, 2944, 2048, 128),  # K = 2056: 2 K % 128 != 0
        (1, 8, 0, 0, 64),  # one row, one chunk
        (130, 136, 128, 128, 16),  # a 16-row operand (tile_n 16)
        (100, 64, 128, 0, 64),  # a tile wholly past the rows: zeros
        (777, 1032, 768, 960, 64),
    ],
)
def test_chunks_write_the_tma_layout_with_zero_fill(n_rows, k, row0, k0, rows):
    rng = np.random.default_rng(n_rows + k)
    src = rng.standard_normal((n_rows, k))
    got = tiling.cp_async_tile(src, row0, k0, rows)
    want = tiling.tma_tile(src, row0, k0, rows)
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


def _model_gemm_cp_async(a, b, tile_m: int, tile_n: int, consumers: int):
    """The kernel's tile loop with each k-block's A and B tiles written by the chunk model and
    read through wgmma's 128-byte swizzle descriptors (tiling.wgmma_k_major_offset)."""
    m, k = a.shape
    n = b.shape[0]
    out = np.full((m, n), np.nan)
    ks = np.arange(64)

    def read_idx(rows, base_row):
        return (
            np.array(
                [
                    [
                        tiling.wgmma_k_major_offset(32 * (kk // 16), base_row + r, (2 * kk) % 32)
                        for kk in ks
                    ]
                    for r in rows
                ]
            )
            // 2
        )

    ra = [read_idx(np.arange(64), 64 * c) for c in range(consumers)]
    rb = read_idx(np.arange(tile_n), 0)
    for tm in range(tiling.ceildiv(m, tile_m)):
        for tn in range(tiling.ceildiv(n, tile_n)):
            accs = [np.zeros((64, tile_n)) for _ in range(consumers)]
            for kb in range(tiling.ceildiv(k, 64)):
                sm_a = tiling.cp_async_tile(a, tm * tile_m, 64 * kb, tile_m)
                sm_b = tiling.cp_async_tile(b, tn * tile_n, 64 * kb, tile_n)
                for c in range(consumers):
                    accs[c] += sm_a[ra[c]] @ sm_b[rb].T
            for c in range(consumers):
                r0, c0 = tm * tile_m + 64 * c, tn * tile_n
                blk = out[r0 : r0 + 64, c0 : c0 + tile_n]
                blk[...] = accs[c][: blk.shape[0], : blk.shape[1]]
    return out


@pytest.mark.parametrize(
    ("m", "n", "k", "tile_m", "tile_n", "consumers"),
    [(130, 300, 72, 128, 256, 2), (77, 40, 136, 64, 16, 1), (200, 130, 200, 128, 128, 2)],
)
def test_tile_loop_over_chunks_matches_direct_product(m, n, k, tile_m, tile_n, consumers):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((n, k))
    got = _model_gemm_cp_async(a, b, tile_m, tile_n, consumers)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, a @ b.T, rtol=1e-12, atol=1e-9)


def _producer_lines(ptx: str) -> list[str]:
    body = ptx.split("128 threads issue cp.async chunks", 1)[1]
    return body.split("consumer warpgroups", 1)[0].splitlines()


@pytest.mark.parametrize("sn", ["w256s4t128ca", "glu128s4t128ca", "w128s4c1k128ca", "pp128s6ca"])
def test_emitted_producer_issues_the_modelled_chunks(sn, verified):
    op = "swiglu" if sn.startswith("glu") else "plain"
    ir, s = epilogue_irs()[op], schedules()[sn]
    e = gemm_emit.emit(ir, s)
    lines = _producer_lines(e.ptx)
    cps = [x for x in lines if "cp.async.cg.shared.global" in x]
    b_rows = s.b_rows(ir)
    subs = s.tile_k // 64
    # one chunk per 16 rows of A and of B (B2), per 64-k sub-block, each with an ignore-src
    # predicate
    assert len(cps) == subs * (s.tile_m + b_rows) // 16
    assert all(re.search(r"\], 16, %p\d+;$", x.strip()) for x in cps)
    offs = sorted(int(re.search(r"\[%r\d+\+(\d+)\]", x)[1]) for x in cps)
    a_sub, b_sub = s.tile_m * 128, b_rows * 128
    want = sorted(
        [sub * a_sub + 2048 * i for sub in range(subs) for i in range(s.tile_m // 16)]
        + [sub * b_sub + 2048 * i for sub in range(subs) for i in range(b_rows // 16)]
    )
    assert offs == want
    # the row predicate against 16 i, or'ed with the chunk's past-K predicate
    assert sum("setp.le.or.s32" in x for x in lines) == len(cps)
    assert sum("cp.async.mbarrier.arrive.noinc.shared::cta.b64" in x for x in lines) == 1
    assert "cp.async.wait_all" in e.ptx
    assert "cp.async.bulk.tensor.2d.shared" not in e.ptx  # no TMA loads (a TMA store may stay)
    # every producer thread arrives on each full barrier: initialised to 128
    assert (
        re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%full\+\d+\], (\d+)", e.ptx)
        == ["128"] * s.stages
    )
    # consumers fence the generic-proxy writes before wgmma reads them
    cons = e.ptx.split("consumer warpgroups", 1)[1]
    wait_at = cons.index("mbarrier.try_wait.parity")
    assert cons.index("fence.proxy.async.shared::cta", wait_at) < cons.index("wgmma.fence")
    kinds = [p.kind for p in e.params]
    n_src = 3 if ir.b2 is not None else 2
    assert kinds[:n_src] == ["tensor"] * n_src and e.entry.endswith("_cpa")
    assert [p.name for p in e.params[:n_src]] == [
        ir.a.name,
        ir.b.name,
        *([ir.b2.name] if ir.b2 is not None else []),
    ]


def test_gate_and_refusals(monkeypatch):
    assert "not yet verified" in is_valid(plain(), CPA)
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)
    assert is_valid(plain(), CPA) is None
    assert is_valid(plain(), CPA, {"M": 3000, "N": 5000, "K": 2056}) is None
    assert "multiple of 8" in is_valid(plain(), CPA, {"M": 3000, "N": 5000, "K": 2052})
    assert "cluster" in is_valid(plain(), replace(CPA, tma_store=0, cluster_m=2))
    assert "load must be" in is_valid(plain(), replace(CPA, load="ldg"))
    assert CPA.label() == "wgmma 128x256x64 s4 c2 pers g8 ts128 cpa"
    assert GemmSchedule.from_dict(CPA.to_dict()) == CPA


def test_space_holds_both_loads(verified):
    assert space.OPTIONS["load"] == ("tma", "cp_async")
    assert "load" in space.LAYOUT_FIELDS
    pool = space.space(plain(), [{"M": 3000, "N": 5000, "K": 2056}])
    assert {s.load for s in pool} == {"tma", "cp_async"}


@pytest.mark.parametrize(
    ("dims", "load"),
    [
        ({"M": 3072, "N": 5120, "K": 2048}, "tma"),
        ({"M": 3072, "N": 5120, "K": 2056}, "cp_async"),
        ({"M": 3000, "N": 5000, "K": 2056}, "cp_async"),
        ({"M": 4096, "N": 4096, "K": 4104}, "cp_async"),
        ({"M": 512, "N": 4096, "K": 4104}, "cp_async"),  # skinny
        ({"M": 4095, "N": 4097, "K": 4000}, "cp_async"),  # 2 K % 128 = 64
        ({"M": 4096, "N": 4096, "K": 4096}, "tma"),
    ],
)
def test_default_and_seeds_take_cp_async_only_for_unaligned_k(dims, load, verified):
    for ir in (plain(), epilogue_irs()["swiglu"]):
        d = space.default_schedule(ir, dims)
        assert d.load == load, (ir.name, dims, d.label())
        seeds = space.seeds(ir, dims)
        assert seeds and {s.load for s in seeds} == {load}, [s.label() for s in seeds]


def test_default_keeps_tma_until_verified():
    space._SPACES.clear()
    d = space.default_schedule(plain(), {"M": 3000, "N": 5000, "K": 2056})
    assert d.load == "tma" and d.tma_store == 128
    assert all(s.load == "tma" for s in space.seeds(plain(), {"M": 3000, "N": 5000, "K": 2056}))


def test_a_job_with_one_unaligned_shape_takes_cp_async(verified):
    dl = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 4096, "N": 4096, "K": 4104}]
    assert space.default_schedule(plain(), dl).load == "cp_async"
    assert space.default_schedule(plain(), dl[:1]).load == "tma"


def test_estimate_charges_tma_for_unaligned_rows():
    from factory.families.matmul.features import estimate

    s = CPA.to_dict()
    t_cpa = estimate(s, 3072, 5120, 2056)["us"]
    t_tma = estimate({**s, "load": "tma"}, 3072, 5120, 2056)["us"]
    assert t_tma > 1.3 * t_cpa
    aligned = estimate({**s, "load": "tma"}, 3072, 5120, 2048)["us"]
    assert aligned == pytest.approx(estimate(s, 3072, 5120, 2048)["us"])


def test_moves_toggle_the_load():
    from factory.families.matmul import moves

    steps = [d for d, _ in moves(CPA.to_dict())]
    assert {"load": "tma"} in steps
    steps = [d for d, _ in moves({**CPA.to_dict(), "load": "tma"})]
    assert {"load": "cp_async", "cluster_m": 1} in steps


def test_benches_name_the_cp_async_schedules():
    from lab.matmul import gemm_bench, issue48_bench

    names = [n for n, s in schedules().items() if s.load == "cp_async"]
    assert "w256s4t128ca" in names and "glu128s4t128ca" in names
    for n in names:
        assert schedules()[n] == replace(schedules()[n], load="cp_async")
    assert hasattr(gemm_bench, "dry_run")
    got = issue48_bench.candidates("plain", 3000, 5000, 2056, False, [], True, True)
    assert "w256s4t128ca" in got and "w256s4t128" in got
    got = issue48_bench.candidates("plain", 3072, 5120, 2048, False, [], True, True)
    assert not any(schedules()[x].load == "cp_async" for x in got)
    assert not sched_mod.CP_ASYNC_VERIFIED  # candidates restores the gate
