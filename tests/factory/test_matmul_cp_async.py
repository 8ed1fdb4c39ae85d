"""The cp.async load path of the wgmma GEMM (schedule load = "cp_async"): a numpy model of the
producer warpgroup's 16-byte chunks writes the same swizzled tile as the TMA, tails included; the
emitted PTX issues those chunks (offsets, predicates, barrier counts, the proxy fence); the
emitted producer itself, run for all 128 threads by a small integer interpreter of its PTX (tile
walk, split-K ranks, ring wrap), fills each stage exactly as the TMA would, tails included; a
tile loop over the chunk model equals a direct product; the validity gate (verified on an H100,
bench/results/2026-12-07-h100-matmul-3), the space, the default and the seeds (TMA first: the
cp.async kernels ran slower at every K timed) and the estimate's charges; the lab benches can
name the schedules (nvJitLink compiles of every cp.async variant are in
test_matmul_emit.test_every_schedule_emits_and_compiles)."""

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
from test_matmul_helpers import wgmma_read_idx  # noqa: E402

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
    ra = [wgmma_read_idx(np.arange(64), 64 * c) for c in range(consumers)]
    rb = wgmma_read_idx(np.arange(tile_n), 0)
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
    assert sched_mod.CP_ASYNC_VERIFIED  # 46 checks on an H100 (2026-12-07-h100-matmul-3)
    assert is_valid(plain(), CPA) is None
    assert is_valid(plain(), CPA, {"M": 3000, "N": 5000, "K": 2056}) is None
    assert is_valid(plain(), CPA, {"M": 3072, "N": 5120, "K": 2048}) is None
    assert "multiple of 8" in is_valid(plain(), CPA, {"M": 3000, "N": 5000, "K": 2052})
    assert "cluster" in is_valid(plain(), replace(CPA, tma_store=0, cluster_m=2))
    assert "load must be" in is_valid(plain(), replace(CPA, load="ldg"))
    assert CPA.label() == "wgmma 128x256x64 s4 c2 pers g8 ts128 cpa"
    assert GemmSchedule.from_dict(CPA.to_dict()) == CPA
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", False)
    assert "not yet verified" in is_valid(plain(), CPA)


@pytest.mark.parametrize("k", [2048, 2056, 4104])
def test_space_holds_both_loads(k):
    space._SPACES.clear()
    assert space.OPTIONS["load"] == ("tma", "cp_async")
    assert "load" in space.LAYOUT_FIELDS
    pool = space.space(plain(), [{"M": 3000, "N": 5000, "K": k}])
    assert {s.load for s in pool} == {"tma", "cp_async"}
    cpa = [s for s in pool if s.load == "cp_async"]
    assert all(is_valid(plain(), s, {"M": 3000, "N": 5000, "K": k}) is None for s in cpa)
    # every TMA layout the cp.async path can take has its twin in the space
    assert {replace(s, load="tma") for s in cpa} <= set(pool)


SHAPES = [
    {"M": 3072, "N": 5120, "K": 2048},
    {"M": 3072, "N": 5120, "K": 2056},  # K % 16 = 8: every load path ~0.6x cuBLAS
    {"M": 3000, "N": 5000, "K": 2056},
    {"M": 4096, "N": 4096, "K": 4104},
    {"M": 512, "N": 4096, "K": 4104},  # skinny
    {"M": 4095, "N": 4097, "K": 4000},  # 2 K % 128 = 64, K % 16 = 0
    {"M": 3072, "N": 5120, "K": 2080},  # 2 K % 128 = 64: as fast as K = 2048
    {"M": 4096, "N": 4096, "K": 4096},
]


@pytest.mark.parametrize("dims", SHAPES)
def test_default_and_first_seed_take_tma_at_every_k(dims):
    space._SPACES.clear()
    for ir in (plain(), epilogue_irs()["swiglu"]):
        d = space.default_schedule(ir, dims)
        assert d.load == "tma", (ir.name, dims, d.label())
        seeds = space.seeds(ir, dims)
        assert seeds and seeds[0].load == "tma", [s.label() for s in seeds]
        # each seed is its tile shape's best estimate: TMA wherever the twin exists
        assert all(s.load == "tma" for s in seeds), [s.label() for s in seeds]


def test_the_default_at_unaligned_k_is_the_staged_tma_kernel():
    space._SPACES.clear()
    d = space.default_schedule(plain(), {"M": 3000, "N": 5000, "K": 2056})
    assert (d.load, d.tile_n, d.tma_store) == ("tma", 256, 128)
    dl = [{"M": 4096, "N": 4096, "K": 4096}, {"M": 4096, "N": 4096, "K": 4104}]
    assert space.default_schedule(plain(), dl).load == "tma"


def test_ranking_puts_each_cp_async_schedule_behind_its_tma_twin():
    dims = {"M": 3000, "N": 5000, "K": 2056}
    space._SPACES.clear()
    ranked = space._ranked(plain(), space.space(plain(), [dims]), dims)
    where = {s: i for i, s in enumerate(ranked)}
    assert ranked[0].load == "tma"
    for s, i in where.items():
        if s.load == "cp_async":
            assert where[replace(s, load="tma")] < i, s.label()


def test_estimate_charges_the_32_byte_pitch_to_every_load_path():
    from factory.families.matmul.features import (
        CP_ASYNC_SLOWDOWN,
        CP_ASYNC_SLOWDOWN_PITCH32,
        PITCH32_SLOWDOWN,
        estimate,
    )

    s = CPA.to_dict()
    tma = {**s, "load": "tma"}

    def us(d, k):
        return estimate(d, 3072, 5120, k)["us"]

    # K % 16 != 0 (a pitch of 2 K bytes not a multiple of 32): both paths charged ~1.6x
    assert us(tma, 2056) > 1.4 * us(tma, 2048)
    assert us(s, 2056) > 1.4 * us(s, 2048)
    # a pitch a multiple of 32 but not of 128 is not charged (K = 2080, 2096 ran as fast as 2048)
    for k in (2080, 2096, 2112):
        assert us(tma, k) < 1.05 * us(tma, 2048) * k / 2048
    # cp.async behind TMA everywhere: ~15% at aligned K, ~7% at K % 16 != 0 (measured)
    for k in (2048, 2080, 2056):
        assert us(s, k) > us(tma, k)
    r_aligned = us(s, 2048) / us(tma, 2048)
    r_odd = us(s, 2056) / us(tma, 2056)
    assert 1.1 < r_aligned <= CP_ASYNC_SLOWDOWN + 1e-9
    assert 1.03 < r_odd <= CP_ASYNC_SLOWDOWN_PITCH32 + 1e-9
    assert PITCH32_SLOWDOWN == pytest.approx(1.6)
    # the measured order at 3072x5120x2056 (unaligned/unaligned_time): TMA staged 0.604x,
    # cp.async staged 0.561x, cp.async unstaged 0.484x cuBLAS
    assert us(tma, 2056) < us(s, 2056) < us({**s, "tma_store": 0}, 2056)


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
    assert sched_mod.CP_ASYNC_VERIFIED  # candidates restores the gate (verified: left on)


# ---- the emitted producer, run: a small interpreter of its integer PTX ----------------------


class _Producer:
    """Runs one thread of an emitted cp.async kernel from its entry up to `ret`, as a producer
    thread (tid < 128): integer arithmetic, predicates and branches exactly; every mbarrier wait
    succeeds at once; barriers, fences and setmaxnreg do nothing. Records each cp.async chunk
    (shared address, global address, ignore-src) and each noinc arrive (its barrier address)."""

    MASK = {"8": 0xFF, "16": 0xFFFF, "32": 0xFFFFFFFF, "64": 0xFFFFFFFFFFFFFFFF}

    def __init__(self, ptx: str):
        body = ptx.split("{", 1)[1].rsplit("}", 1)[0]
        self.stmts: list[str] = []
        self.labels: dict[str, int] = {}
        for raw in body.splitlines():
            line = raw.split("//", 1)[0].strip()
            if not line or line.startswith(".reg"):
                continue
            if line.endswith(":"):
                self.labels[line[:-1]] = len(self.stmts)
            else:
                self.stmts.append(line.rstrip(";"))

    def run(self, tid: int, ctaid: int, nctaid: int, params: dict) -> tuple[list, list]:
        regs: dict[str, int] = {"%tid.x": tid, "%ctaid.x": ctaid, "%nctaid.x": nctaid}
        chunks, arrives = [], []
        pc, steps = 0, 0

        def val(tok: str) -> int:
            tok = tok.strip()
            if tok == "dsmem":
                return 0
            if tok.startswith("%"):
                return regs[tok]
            return int(tok, 0)

        def addr(tok: str) -> int:
            inner = tok.strip()[1:-1]
            if inner in params:
                return params[inner]
            base, _, off = inner.partition("+")
            return val(base) + (int(off) if off else 0)

        while True:
            steps += 1
            assert steps < 2_000_000, "runaway producer"
            st = self.stmts[pc]
            pc += 1
            if st.startswith("@"):
                guard, st = st.split(None, 1)
                neg = guard.startswith("@!")
                if bool(regs[guard[2:] if neg else guard[1:]]) == neg:
                    continue
            op, _, rest = st.partition(" ")
            a = [x.strip() for x in rest.split(",")] if rest else []
            parts = op.split(".")
            name = parts[0]
            if name == "ret":
                return chunks, arrives
            if name == "bra":
                pc = self.labels[a[0]]
                continue
            if op.startswith("cp.async.cg.shared.global"):
                assert a[2] == "16", st  # 16-byte chunks
                chunks.append((addr(a[0]), addr(a[1]), bool(regs[a[3]])))
                continue
            if op.startswith("cp.async.mbarrier.arrive.noinc"):
                arrives.append(addr(a[0]))
                continue
            if op.startswith("mbarrier.try_wait"):
                regs[a[0]] = 1
                continue
            if name in ("mbarrier", "fence", "bar", "barrier", "setmaxnreg", "prefetch"):
                continue
            if op.startswith("cp.async.wait_all"):
                continue
            width = next((p[1:] for p in reversed(parts) if p[1:] in self.MASK), "32")
            mask = self.MASK[width]
            signed = parts[-1].startswith("s")

            def sv(x: int, w: int = int(width)) -> int:
                x &= (1 << w) - 1
                return x - (1 << w) if signed and x >> (w - 1) else x

            if name == "ld" and parts[1] == "param":
                regs[a[0]] = addr(a[1])
            elif name in ("mov", "cvt", "cvta"):
                regs[a[0]] = val(a[1])
            elif name == "setp":
                cmp, x, y = parts[1], sv(val(a[1])), sv(val(a[2]))
                r = {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y,
                     "ge": x >= y}[cmp]  # fmt: skip
                if len(parts) == 4:  # setp.cmp.bool.type d, a, b, c
                    c = a[3]
                    cv = not regs[c[1:]] if c.startswith("!") else bool(regs[c])
                    r = (r and cv) if parts[2] == "and" else (r or cv)
                regs[a[0]] = int(r)
            else:
                x = [val(t) for t in a[1:]]
                if name == "mul" and parts[1] == "wide":
                    regs[a[0]] = x[0] * x[1]
                    continue
                f = {
                    "add": lambda: x[0] + x[1],
                    "sub": lambda: x[0] - x[1],
                    "mul": lambda: x[0] * x[1],
                    "mad": lambda: x[0] * x[1] + x[2],
                    "div": lambda: x[0] // x[1],
                    "rem": lambda: x[0] % x[1],
                    "min": lambda: min(x[0], x[1]),
                    "shl": lambda: x[0] << x[1],
                    "shr": lambda: x[0] >> x[1],
                    "and": lambda: x[0] & x[1],
                    "or": lambda: x[0] | x[1],
                    "xor": lambda: x[0] ^ x[1],
                }[name]
                regs[a[0]] = f() & mask


@pytest.mark.parametrize(
    ("op", "sn", "m", "n", "k", "nctaid"),
    [
        ("plain", "w256s4ca", 158, 300, 72, 4),  # M, N, K tails, one tile a CTA
        ("plain", "w256s4ca", 300, 260, 200, 2),  # several tiles a CTA: the ring wraps
        ("plain", "w128s4c1k128ca", 70, 140, 200, 3),  # tile_k 128: two sub-blocks a stage
        ("swiglu", "glu128s4t128ca", 129, 130, 136, 2),  # B and B2 rows in each stage
        ("plain", "sk2w256s4ca", 130, 260, 520, 8),  # split-K: each rank its k-blocks
    ],
)
def test_emitted_producer_fills_the_stages_the_tma_would(op, sn, m, n, k, nctaid, verified):
    ir, s = epilogue_irs()[op], schedules()[sn]
    e = gemm_emit.emit(ir, s)
    run = _Producer(e.ptx)
    rng = np.random.default_rng(m * n + k)
    mats = {"a": rng.standard_normal((m, k))}
    mats["b"] = rng.standard_normal((n, k))
    if ir.b2 is not None:
        mats["b2"] = rng.standard_normal((n, k))
    base = {name: (i + 1) << 32 for i, name in enumerate(mats)}
    params = {f"src_{name}": base[name] for name in mats}
    params.update({"dim_m": m, "dim_n": n, "dim_k": k})
    subs, a_sub, b_sub = s.tile_k // 64, s.tile_m * 128, s.b_rows(ir) * 128
    a_bytes, b_bytes = a_sub * subs, b_sub * subs
    sb = s.stages * a_bytes
    tiles_m, tiles_n = tiling.ceildiv(m, s.tile_m), tiling.ceildiv(n, s.tile_n)
    nk = tiling.ceildiv(k, s.tile_k)
    sk = s.split_k
    for cta in range(nctaid):
        # the ring positions this CTA's producer fills, in order: (tile row, tile col, k-block)
        if sk > 1:
            tile, rank = divmod(cta, sk)  # clusters of sk CTAs, rank r the r-th part of K
            if tile >= tiles_m * tiles_n:
                continue
            tm, tn = tiling.tile_coords(tile, tiles_m, tiles_n, s.group_m)
            kb0, kb1 = tiling.splitk_range(rank, nk, sk)
            order = [(tm, tn, kb) for kb in range(kb0, kb1)]
        else:
            order = [
                (*tiling.tile_coords(t, tiles_m, tiles_n, s.group_m), kb)
                for t in tiling.cta_tiles(cta, nctaid, tiles_m * tiles_n)
                for kb in range(nk)
            ]
        images = [
            {"a": np.full(a_bytes // 2, np.nan), "b": np.full(b_bytes // 2, np.nan)} for _ in order
        ]
        for tid in range(tiling.PRODUCER_THREADS):
            if sk > 1:
                # the kernel reads its rank and cluster from special registers: run it as one
                regs_cta = {"%clusterid.x": cta // sk, "%cluster_ctarank": cta % sk}
                regs_cta["%nclusterid.x"] = nctaid // sk
                run_chunks, arrives = _run_with(run, tid, regs_cta, params)
            else:
                run_chunks, arrives = run.run(tid, cta, nctaid, params)
            per = len(run_chunks) // max(1, len(order))
            assert len(arrives) == len(order) and len(run_chunks) == per * len(order)
            for pos in range(len(order)):
                stage = pos % s.stages
                full = sb + s.stages * b_bytes + 8 * stage  # %full: after both rings (no staging)
                if s.tma_store:
                    full += s.epi_bytes(ir)
                assert arrives[pos] == full
                for dst, src, ignore in run_chunks[pos * per : (pos + 1) * per]:
                    part = "a" if dst < sb else "b"
                    off = dst - (stage * a_bytes if part == "a" else sb + stage * b_bytes)
                    assert 0 <= off and off % 16 == 0
                    img = images[pos][part]
                    assert np.isnan(img[off // 2 : off // 2 + 8]).all(), "a chunk written twice"
                    if ignore:
                        img[off // 2 : off // 2 + 8] = 0.0
                        continue
                    names = ["a"] if part == "a" else [x for x in ("b", "b2") if x in mats]
                    name = max((x for x in names if base[x] <= src), key=lambda x: base[x])
                    row, byte = divmod(src - base[name], 2 * k)
                    assert byte % 16 == 0
                    img[off // 2 : off // 2 + 8] = mats[name][row, byte // 2 : byte // 2 + 8]
        for pos, (tm, tn, kb) in enumerate(order):
            want_a = np.concatenate(
                [tiling.tma_tile(mats["a"], tm * s.tile_m, kb * s.tile_k + 64 * u, s.tile_m)
                 for u in range(subs)]
            )  # fmt: skip
            b_tiles = []
            for u in range(subs):
                for name in [x for x in ("b", "b2") if x in mats]:
                    b_tiles.append(
                        tiling.tma_tile(mats[name], tn * s.tile_n, kb * s.tile_k + 64 * u, s.tile_n)
                    )
            np.testing.assert_array_equal(images[pos]["a"], want_a)
            np.testing.assert_array_equal(images[pos]["b"], np.concatenate(b_tiles))


def _run_with(run: _Producer, tid: int, special: dict, params: dict):
    """_Producer.run with extra special registers (a split-K cluster's rank and count)."""
    stmts = run.stmts
    saved = list(stmts)
    try:
        run.stmts = [
            st.replace(", %clusterid.x", f", {special['%clusterid.x']}")
            .replace(", %cluster_ctarank", f", {special['%cluster_ctarank']}")
            .replace(", %nclusterid.x", f", {special['%nclusterid.x']}")
            for st in stmts
        ]
        return run.run(tid, 0, 1, params)
    finally:
        run.stmts = saved
