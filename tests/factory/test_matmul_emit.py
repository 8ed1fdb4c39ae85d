"""The wgmma GEMM emitter: every schedule emits and compiles (nvJitLink, no GPU needed), the
validity predicate refuses what cannot fit, a numpy model of the kernel's tile loop (grouped tile
order, TMA boxes with zero fill, 128-byte swizzle, wgmma descriptor reads, accumulator fragment,
guarded stores) equals a direct product, and (marked gpu) the kernels are right on a GPU."""

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
from test_matmul_helpers import nvjitlink_available, wgmma_read_idx  # noqa: E402

from factory.families.matmul import tiling  # noqa: E402
from factory.families.matmul.ir import plain  # noqa: E402
from factory.families.matmul.schedule import GemmSchedule, is_valid  # noqa: E402
from factory.spec import eval_dim_expr  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402


def _valid_unbatched(ir, s):
    """Valid with the batch axes dropped and the fp8 output's staging, tile_k 128 and the
    cp.async loads let through (emitted, compiled here; their gates wait for a GPU run)."""
    from dataclasses import replace as _r

    from factory.families.matmul import schedule as sched_mod

    flags = ("TMA_STORE_FP8_VERIFIED", "WIDE_K_VERIFIED", "CP_ASYNC_VERIFIED")
    was = [getattr(sched_mod, f) for f in flags]
    for f in flags:
        setattr(sched_mod, f, True)
    try:
        return is_valid(_r(ir, batch=()) if ir.batch else ir, s) is None
    finally:
        for f, v in zip(flags, was, strict=True):
            setattr(sched_mod, f, v)


# batched IRs render like their flattened form: every IR is compiled (test_batch_axes... checks
# the batched parameters)
CASES = [
    (op, sn)
    for sn in schedules()
    for op in epilogue_irs()
    if _valid_unbatched(epilogue_irs()[op], schedules()[sn])
]


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize(("op", "sn"), CASES)
def test_every_schedule_emits_and_compiles(op, sn, monkeypatch):
    from factory.compile import compile_ptx
    from factory.families.matmul import schedule as sched_mod

    monkeypatch.setattr(sched_mod, "TMA_STORE_FP8_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)

    ir, s = epilogue_irs()[op], schedules()[sn]
    e = gemm_emit.emit(ir, s)
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok, r.log[-2000:]
    # nvJitLink ignores setmaxnreg (C7504), so every warp has 168 registers: a ping-pong consumer
    # keeps its second 64-row accumulator live through the first block's epilogue, and an
    # epilogue with transcendentals or extra inputs then spills a little. Every other schedule
    # is_valid lets through must not spill (it refuses split 4 of 128 accumulator registers and
    # group-scaled fp8 at 128 accumulators in a cluster, which do)
    assert r.spill_store_bytes <= (256 if s.pingpong else 0)
    assert r.registers <= 255
    # ptxas serialises every wgmma of a kernel with a call in it (C7509: div.rn.f32 was one), with
    # too few registers for the wgmma pipeline (C7511) or with accumulators written by other
    # instructions while wgmmas may be in flight (C7515: split-K's reduction once was)
    assert not re.search(r"\(C75(09|11|15)\)", r.log), r.log[-2000:]


def test_cases_cover_every_epilogue():
    assert {op for op, _ in CASES} == set(epilogue_irs())
    # every schedule: the 2x1 clusters, split-K and the TMA-store epilogue included (verified on
    # an H100, 2026-12-07), so every one of them is held to no spills
    assert {sn for _, sn in CASES} == set(schedules())
    assert any(s.cluster_m == 2 for _, sn in CASES for s in [schedules()[sn]])
    assert any(s.split_k > 1 for _, sn in CASES for s in [schedules()[sn]])
    assert any(s.tma_store for _, sn in CASES for s in [schedules()[sn]])
    # the cp.async loads (tests/factory/test_matmul_cp_async.py), with every epilogue
    assert {op for op, sn in CASES if schedules()[sn].load == "cp_async"} == set(epilogue_irs())


def test_ptx_uses_the_hopper_path():
    ir, s = epilogue_irs()["bias_gelu"], GemmSchedule()
    e = gemm_emit.emit(ir, s)
    assert ".target sm_90a" in e.ptx
    ver = re.search(r"\.version (\d+)\.(\d+)", e.ptx)
    assert (int(ver[1]), int(ver[2])) <= (9, 0)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in e.ptx
    assert "cp.async.bulk.tensor.2d" in e.ptx and "mbarrier.try_wait.parity" in e.ptx
    assert "setmaxnreg.inc" in e.ptx and "setmaxnreg.dec" in e.ptx
    assert e.ptx.count(".param .align 64 .b8") == 2
    kinds = [p.kind for p in e.params]
    assert kinds == ["tmap", "tmap", "tensor", "tensor", "dim", "dim", "dim"]
    a_map, b_map = e.params[:2]
    assert a_map.name == "a" and a_map.box == (64, 128) and a_map.dims == ("K", "M")
    assert b_map.name == "b" and b_map.box == (64, 256) and b_map.dims == ("K", "N")
    assert a_map.swizzle == 128


def test_pingpong_orders_the_main_loops():
    s = schedules()["pp128s6"]
    assert s.label() == "wgmma 128x128x64 s6 c2 pp pers g8"
    e = gemm_emit.emit(plain(), s)
    assert "bar.sync" in e.ptx and "bar.arrive" in e.ptx
    # each consumer runs both 64-row halves of its tile: two wgmmas per k16 step
    assert e.ptx.count("wgmma.mma_async.sync.aligned.m64n128k16") == 8
    assert "pingpong" in is_valid(plain(), replace(s, persistent=False))
    assert "pingpong" in is_valid(epilogue_irs()["swiglu"], s)
    assert "accumulator" in is_valid(plain(), replace(s, tile_n=256, stages=4))
    # both 64-row accumulators a consumer: wider than 128 spills under nvJitLink (168 registers)
    assert "tile_n <= 128" in is_valid(plain(), replace(s, tile_n=160))
    assert "tile_n <= 128" in is_valid(plain(), replace(s, tile_n=192, stages=5))


def test_batch_axes_flatten_into_rows(monkeypatch):
    from factory.families.matmul import schedule as sched_mod

    monkeypatch.setattr(sched_mod, "BATCH_VERIFIED", True)
    ir = epilogue_irs()["batched_row"]
    e = gemm_emit.emit(ir, GemmSchedule())
    dims = [p.name for p in e.params if p.kind == "dim"]
    assert dims == ["Bt", "M", "N", "K"]
    assert e.params[0].dims == ("K", "Bt * M")
    assert eval_dim_expr(e.launch.grid[0], {"Bt": 3, "M": 100, "N": 256, "K": 64}) == 3
    assert "rem.u32" in e.ptx and "%Mb" in e.ptx  # the per-row scale is read at row % M
    assert is_valid(ir, GemmSchedule(), {"Bt": 3, "M": 100, "N": 256, "K": 64}) is None


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize(
    ("op", "sn"), [("plain", "cl2w256s4"), ("bias_gelu", "cl2w256s4"), ("swiglu", "cl2glu128s4")]
)
def test_cluster_multicasts_half_of_b(op, sn, monkeypatch):
    from factory.compile import compile_ptx
    from factory.families.matmul import schedule as sched_mod

    ir, s = epilogue_irs()[op], schedules()[sn]
    monkeypatch.setattr(sched_mod, "CLUSTER_VERIFIED", False)  # the gate still works
    assert "not yet verified" in is_valid(ir, s)
    monkeypatch.setattr(sched_mod, "CLUSTER_VERIFIED", True)
    e = gemm_emit.emit(ir, s)
    assert ".reqnctapercluster 2, 1, 1" in e.ptx and e.launch.cluster == (2, 1, 1)
    assert e.ptx.count(".multicast::cluster") == (2 if ir.b2 else 1)
    assert "mapa.shared::cluster" in e.ptx and "barrier.cluster.wait" in e.ptx
    assert [p.box for p in e.params if p.kind == "tmap"][1] == (64, s.tile_n // 2)
    for m, n in [(4096, 4096), (100, 300), (129, 256), (1, 1)]:
        got = eval_dim_expr(e.launch.grid[0], {"M": m, "N": n, "K": 64})
        pairs = tiling.ceildiv(tiling.ceildiv(m, 128), 2) * tiling.ceildiv(n, s.tile_n)
        assert got == 2 * min(pairs, 66)
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok and r.spill_store_bytes == 0, r.log[-2000:]


def test_cluster_refusals():
    ir = plain()
    assert "2x1" in is_valid(ir, GemmSchedule(cluster_m=4))
    assert "2x1" in is_valid(ir, GemmSchedule(cluster_n=2))
    assert "ping-pong" in is_valid(
        ir, GemmSchedule(tile_n=128, stages=6, pingpong=True, cluster_m=2)
    )


def test_cluster_ring_protocol():
    for seed in range(12):
        for units, nk, stages in [(3, 5, 3), (2, 1, 4), (4, 7, 5)]:
            reads = tiling.simulate_cluster_ring(units, nk, stages, seed)
            for c in (0, 1):
                for w in (0, 1):
                    assert [p for cc, ww, p in reads if (cc, ww) == (c, w)] == list(
                        range(units * nk)
                    )
    # releasing only the local slot lets the peer's multicast overwrite a slot still read
    with pytest.raises(AssertionError):
        for seed in range(20):
            tiling.simulate_cluster_ring(3, 5, 3, seed, remote_release=False)


def test_swiglu_loads_two_weights():
    e = gemm_emit.emit(epilogue_irs()["swiglu"], schedules()["glu128s4"])
    assert [p.name for p in e.params if p.kind == "tmap"] == ["a", "b", "b2"]
    assert e.ptx.count("wgmma.mma_async.sync.aligned.m64n128k16") == 8


@pytest.mark.parametrize(
    ("m", "n", "pers", "grid"),
    [(4096, 4096, True, 132), (4096, 4096, False, 512), (100, 300, True, 2), (1, 1, True, 1)],
)
def test_launch_geometry(m, n, pers, grid):
    s = GemmSchedule(persistent=pers)
    launch = gemm_emit.launch_for(plain(), s)
    assert eval_dim_expr(launch.grid[0], {"M": m, "N": n, "K": 64}) == grid
    assert launch.block == (384, 1, 1)
    assert launch.smem_bytes == s.smem_bytes(plain()) <= 227 * 1024


def test_validity_refuses_what_does_not_fit(monkeypatch):
    from factory.families.matmul import schedule as sched_mod

    ir = plain()
    assert is_valid(ir, GemmSchedule()) is None
    assert "shared memory" in is_valid(ir, GemmSchedule(stages=5))
    assert "tile_m" in is_valid(ir, GemmSchedule(tile_m=256))
    assert "tile_n" in is_valid(ir, GemmSchedule(tile_n=200))
    assert "tile_k" in is_valid(ir, GemmSchedule(tile_k=32))
    assert "not emitted" in is_valid(ir, GemmSchedule(kind="mma_sync"))
    assert is_valid(ir, GemmSchedule(cluster_m=2)) is None  # verified 2026-12-07
    assert "split-K" in is_valid(ir, GemmSchedule(split_k=2))  # persistent
    glu = epilogue_irs()["swiglu"]
    assert "256" in is_valid(glu, GemmSchedule(tile_n=256))
    assert is_valid(glu, GemmSchedule(tile_n=128)) is None
    assert "multiple of 8" in is_valid(ir, GemmSchedule(), {"M": 64, "N": 64, "K": 4001})
    assert is_valid(ir, GemmSchedule(), {"M": 1, "N": 3, "K": 8}) is None
    assert "layout" in is_valid(replace(ir, b=replace(ir.b, layout="row")), GemmSchedule())
    assert is_valid(replace(ir, batch=("B",)), GemmSchedule()) is None  # verified 2026-12-07
    # a flag set False refuses its kind again, naming it
    monkeypatch.setattr(sched_mod, "BATCH_VERIFIED", False)
    assert "batched" in is_valid(replace(ir, batch=("B",)), GemmSchedule())
    monkeypatch.setattr(sched_mod, "CLUSTER_VERIFIED", False)
    assert "cluster" in is_valid(ir, GemmSchedule(cluster_m=2))
    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", False)
    sk2 = GemmSchedule(split_k=2, persistent=False)
    assert "not yet verified" in is_valid(ir, sk2)
    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "CLUSTER_VERIFIED", True)
    assert is_valid(ir, sk2) is None
    # split 4 of the 128 x 256 tile does not spill (the reduction has no way back into the
    # main loop); what spills is refused with the reason (ptxas at 168 registers a thread)
    assert is_valid(ir, replace(sk2, split_k=4)) is None
    grp = epilogue_irs()["groupq_fp8"]
    assert is_valid(grp, GemmSchedule()) is None
    assert "spills" in is_valid(grp, GemmSchedule(cluster_m=2))
    assert is_valid(grp, sk2) is None
    assert is_valid(replace(ir, a=replace(ir.a, dtype="fp32")), GemmSchedule())
    # the accumulators of a 64 x 256 tile per consumer need most of the register file
    assert is_valid(ir, GemmSchedule(tile_m=64, consumers=1)) is None


def test_schedule_round_trip_and_label():
    s = GemmSchedule(stages=3, group_m=16)
    assert GemmSchedule.from_dict(s.to_dict()) == s
    assert s.label() == "wgmma 128x256x64 s3 c2 pers g16"


@pytest.mark.parametrize(
    ("tiles_m", "tiles_n", "group"), [(7, 5, 3), (32, 32, 8), (1, 9, 8), (9, 1, 4)]
)
def test_grouped_order_visits_every_tile_once(tiles_m, tiles_n, group):
    seen = [tiling.tile_coords(t, tiles_m, tiles_n, group) for t in range(tiles_m * tiles_n)]
    assert sorted(seen) == [(i, j) for i in range(tiles_m) for j in range(tiles_n)]
    # within a group, consecutive tiles walk the rows of the group first
    if tiles_m >= group:
        assert [tm for tm, _ in seen[:group]] == list(range(group))


def test_swizzle_write_matches_wgmma_read():
    for r in range(256):
        for k in range(64):
            chunk, byte = divmod(2 * k, 16)
            kk, kbyte = divmod(2 * k, 32)
            assert (
                tiling.wgmma_k_major_offset(32 * kk, r, kbyte) == tiling.swizzle128(r, chunk) + byte
            )


def test_fragment_covers_the_accumulator_once():
    n = 256
    cells = {
        tiling.fragment(w, ln, reg) for w in range(4) for ln in range(32) for reg in range(n // 2)
    }
    assert cells == {(r, c) for r in range(64) for c in range(n)}


def _model_gemm(a, b, s: GemmSchedule, ctas: int):
    """The kernel's tile loop in numpy, through tiling's index functions."""
    m, k = a.shape
    n = b.shape[0]
    tiles_m, tiles_n = tiling.ceildiv(m, s.tile_m), tiling.ceildiv(n, s.tile_n)
    nk = tiling.ceildiv(k, 64)
    out = np.full((m, n), np.nan)
    # byte offsets of element (row, k) in a swizzled tile, as the TMA writes it and wgmma reads
    rows_a, rows_b = np.arange(s.tile_m), np.arange(s.tile_n)
    ks = np.arange(64)

    def write_idx(rows):
        return (
            np.array(
                [[tiling.swizzle128(r, (2 * kk) // 16) + (2 * kk) % 16 for kk in ks] for r in rows]
            )
            // 2
        )

    wa, wb = write_idx(rows_a), write_idx(rows_b)
    ra = [wgmma_read_idx(np.arange(64), 64 * c) for c in range(s.consumers)]
    rb = wgmma_read_idx(rows_b, 0)
    for cta in range(ctas):
        for t in tiling.cta_tiles(cta, ctas, tiles_m * tiles_n):
            tm, tn = tiling.tile_coords(t, tiles_m, tiles_n, s.group_m)
            accs = [np.zeros((64, s.tile_n)) for _ in range(s.consumers)]
            for kb in range(nk):
                # TMA boxes: out-of-bounds elements are zero
                box_a = np.zeros((s.tile_m, 64))
                blk = a[tm * s.tile_m : (tm + 1) * s.tile_m, kb * 64 : (kb + 1) * 64]
                box_a[: blk.shape[0], : blk.shape[1]] = blk
                box_b = np.zeros((s.tile_n, 64))
                blk = b[tn * s.tile_n : (tn + 1) * s.tile_n, kb * 64 : (kb + 1) * 64]
                box_b[: blk.shape[0], : blk.shape[1]] = blk
                sm_a = np.full(s.tile_m * 64, np.nan)
                sm_a[wa] = box_a
                sm_b = np.full(s.tile_n * 64, np.nan)
                sm_b[wb] = box_b
                for c in range(s.consumers):
                    accs[c] += sm_a[ra[c]] @ sm_b[rb].T
            for c in range(s.consumers):
                for w in range(4):
                    for ln in range(32):
                        for reg in range(s.tile_n // 2):
                            fr, fc = tiling.fragment(w, ln, reg)
                            row = tm * s.tile_m + 64 * c + fr
                            col = tn * s.tile_n + fc
                            if row < m and col < n:
                                out[row, col] = accs[c][fr, fc]
    return out


@pytest.mark.parametrize(
    ("m", "n", "k", "s", "ctas"),
    [
        (130, 300, 72, GemmSchedule(group_m=2), 3),
        (64, 256, 128, GemmSchedule(tile_m=64, consumers=1, group_m=1), 1),
        (1, 17, 8, GemmSchedule(tile_n=128), 2),
        (200, 130, 136, GemmSchedule(tile_n=64, group_m=3), 5),
    ],
)
def test_tile_loop_model_matches_direct_product(m, n, k, s, ctas):
    rng = np.random.default_rng(m * 1000 + n + k)
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((n, k))
    got = _model_gemm(a, b, s, ctas)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, a @ b.T, rtol=1e-12, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "op",
    [
        "plain",
        "bias_gelu",
        "residual",
        "swiglu",
        "plain_pp",
        "batched_row",
        "plain_cl",
        "swiglu_cl",
        "rowq_fp8",
        "groupq_fp8",
        "plain_sk",
        "plain_sk4",
        "swiglu_sk",
    ],
)
def test_gemm_kernels_correct_on_gpu(op):
    torch = pytest.importorskip("torch")
    from lab.matmul import gemm_bench

    sched = {
        "swiglu": "glu128s4",
        "plain_pp": "pp128s6",
        "plain_cl": "cl2w256s4",
        "swiglu_cl": "cl2glu128s4",
        "plain_sk": "sk2w256s4",
        "plain_sk4": "sk4c1w128s4",
        "swiglu_sk": "sk2glu128s4",
    }.get(op, "w256s4")
    op = op.split("_pp")[0].split("_cl")[0].split("_sk")[0]
    ir = epilogue_irs()[op]
    s = schedules()[sched]
    kern = gemm_bench.Kernel(ir, s)
    for i, (m, n, k) in enumerate(
        [(333, 250, 72), (1, 520, 4096), (1000, 1030, 1000), (512, 512, 512)]
    ):
        assert gemm_bench.check(torch, kern, op, m, n, k, seed=i), (op, m, n, k)


def test_tensor_map_params_travel_to_the_worker():
    from gpuworker.batch import params_to_json, parse_params

    e = gemm_emit.emit(plain(), GemmSchedule())
    js = params_to_json(e.params)
    assert js[0] == {
        "kind": "tmap",
        "ptx_type": "b8x128",
        "name": "a",
        "value": 0.0,
        "box": [64, 128],
        "dims": ["K", "M"],
        "swizzle": 128,
    }
    errors: list = []
    assert parse_params(js, "params", errors) == e.params and not errors
    bad = [dict(js[0], box=[64, 512])]
    assert parse_params(bad, "params", errors) == () and errors[0][0] == "params[0].box"


def test_tensor_map_plan():
    from gpuworker import tensormap

    p = {"box": [64, 128], "dims": ["K", "M"], "swizzle": 128}
    got = tensormap.plan(p, {"K": 4000, "M": 4095}, "bf16")
    assert got["extents"] == [4000, 4095] and got["strides"] == [8000]
    with pytest.raises(tensormap.TensorMapError, match="16 bytes"):
        tensormap.plan(p, {"K": 4001, "M": 8}, "bf16")  # a row stride of 8002 bytes
    with pytest.raises(tensormap.TensorMapError, match="swizzle"):
        tensormap.plan(dict(p, box=[128, 8]), {"K": 4096, "M": 8}, "bf16")  # 256 B > 128 B
    arg = tensormap.as_arg(bytes(range(128)))
    import ctypes

    assert ctypes.addressof(arg) % 64 == 0 and bytes(arg) == bytes(range(128))


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize(("tiles", "nk", "stages"), [(5, 7, 3), (4, 1, 6), (3, 64, 4), (7, 5, 5)])
def test_ring_protocol_reads_every_position_once_in_order(pingpong, tiles, nk, stages):
    for seed in range(8):
        reads = tiling.simulate_ring(tiles, nk, stages, pingpong, seed)
        for c in range(2):
            got = [p for cc, p in reads if cc == c]
            want = [
                i * nk + kb for i in range(tiles) if not pingpong or i % 2 == c for kb in range(nk)
            ]
            assert got == want


def test_ring_protocol_model_catches_unordered_pingpong():
    # without the named-barrier turn-taking, consumer 1 waits on a slot a whole ring pass ahead
    # and a parity wait lets it through on the wrong fill
    with pytest.raises(AssertionError):
        for seed in range(20):
            tiling.simulate_ring(5, 7, 3, True, seed, ordered=False)


def test_fp8_output_stores_e4m3_pairs_and_single_bytes():
    e = gemm_emit.emit(epilogue_irs()["rowq_fp8"], GemmSchedule())
    # whole tiles: one e4m3x2 per column pair, column col+1 (the first source) in the high byte
    assert re.search(r"cvt\.rn\.satfinite\.e4m3x2\.f32 %\w+, %\w+, %\w+", e.ptx)
    assert "st.global.b16" in e.ptx
    # tails: one byte per element under its predicate
    assert re.search(r"@%p\d+ st\.global\.b8", e.ptx)
    assert [p.name for p in e.params if p.kind == "tensor"] == ["c", "rs"]


def test_fp8_outputs_from_a_manifest_wait_for_the_worker():
    from factory.families.base import Unsupported
    from factory.families.matmul.lower import lower
    from factory.spec import load_manifest

    text = """name = "q"
[inputs.x]
shape = ["M", "K"]
dtype = "bf16"
[inputs.w]
shape = ["N", "K"]
dtype = "bf16"
[inputs.s]
shape = ["M", 1]
dtype = "fp32"
[outputs.y]
expr = "(x @ w.T) * s"
dtype = "fp8e4m3"
[[shapes]]
M = 256
N = 256
K = 256
"""
    with pytest.raises(Unsupported, match="GPU worker"):
        lower(load_manifest(text))


def test_group_scaled_fp8_reduces_each_group_over_the_quad():
    ir = epilogue_irs()["groupq_fp8"]
    e = gemm_emit.emit(ir, GemmSchedule())
    assert [p.name for p in e.params if p.kind == "tensor"] == ["c", "cs"]
    # per 128-column group and row of a thread: two butterfly steps over the quad's lanes, in
    # both the whole-tile and the tail version of the epilogue (256 columns: 2 groups x 2 rows)
    assert e.ptx.count("shfl.sync.bfly.b32") == 2 * 2 * 2 * 2
    assert e.ptx.count("st.global.f32") == 2 * 2 * 2  # one scale per group and row
    assert "group" in is_valid(ir, GemmSchedule(tile_n=192, stages=4))
    bad = replace(ir, outputs=(replace(ir.outputs[0], dtype="bf16"),))
    assert "fp8e4m3" in " ".join(bad.problems())


@pytest.mark.parametrize("tile_n", [128, 256])
def test_scale_group_index_is_the_columns_group(tile_n):
    for tile_col in range(3):
        for lane in range(32):
            for reg in range(tile_n // 2):
                _, c = tiling.fragment(0, lane, reg)
                col = tile_col * tile_n + c
                assert tiling.scale_group(tile_col, tile_n, lane, reg // 4) == col // 128


def test_wide_k_stages_two_sub_blocks(monkeypatch):
    """tile_k 128: each stage holds two 64-k sub-blocks (one TMA box each of A and B, 256 bytes
    of every row a stage), eight k16 steps a stage, the k coordinate kb * 128, and the second
    sub-block's descriptors one sub-block further; gated by WIDE_K_VERIFIED."""
    from factory.compile import compile_ptx
    from factory.families.matmul import schedule as sched_mod

    s = schedules()["w128s4c1k128"]
    assert sched_mod.WIDE_K_VERIFIED  # verified in bench/results/2026-12-07-h100-matmul-2
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", False)  # the gate still works
    assert "not yet verified" in is_valid(plain(), s)
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)
    assert is_valid(plain(), s) is None
    assert "cluster" in is_valid(plain(), replace(s, tile_m=128, consumers=2, cluster_m=2))
    e = gemm_emit.emit(plain(), s)
    assert e.ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global") == 4  # A, B x 2
    assert e.ptx.count("wgmma.mma_async") == 8
    assert "shl.b32 %r" in e.ptx and re.search(r"shl\.b32 %r\d+, %kb, 7;", e.ptx)
    assert re.search(r"shr\.u32 %nk, %nk, 7;", e.ptx)
    a_sub, b_sub = 64 * 128 // 16, 128 * 128 // 16
    steps = [int(x) for x in re.findall(r"add\.u64 %rd\d+, %rd\d+, (\d+);\n\s+add\.u64", e.ptx)]
    assert steps == [0, 2, 4, 6, a_sub, a_sub + 2, a_sub + 4, a_sub + 6]
    pair = r"add\.u64 %rd\d+, %rd\d+, \d+;\n\s+add\.u64 %rd\d+, %rd\d+, (\d+);"
    b_steps = re.findall(pair, e.ptx)
    assert [int(x) for x in b_steps] == [0, 2, 4, 6, b_sub, b_sub + 2, b_sub + 4, b_sub + 6]
    # the ring: 4 stages of (64 + 128) rows x 256 bytes
    assert e.launch.smem_bytes == 4 * 192 * 256 + 16 * 4 + 1024
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok and r.spill_store_bytes == 0, r.log[-2000:]
