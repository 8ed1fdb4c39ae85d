"""The TMA-store epilogue of the wgmma GEMM emitter (schedule.tma_store): its gate (open since the
H100 run of 2026-12-07), its validity rules, the search space's staged schedules compiling without
spills, the GPU worker building the output's tensor map, emission and nvJitLink compilation
without spills, the emitted staging offsets and protocol order, and a model of the staging
protocol (tiling.simulate_tma_store) against the values it stores, including the torn reads a
wrong wait allows. No GPU needed but for the GPU check (skipped without one)."""

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
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

TS_NAMES = [sn for sn, s in schedules().items() if s.tma_store]


@pytest.fixture
def verified(monkeypatch):
    monkeypatch.setattr(sched_mod, "TMA_STORE_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "TMA_STORE_FP8_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)  # the tile_k 128 variants
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)  # the cp.async-loaded ones


def _op_for(sn: str) -> str:
    """An op whose output the staged schedule `sn` serves (w256s4t256: fp8 outputs only)."""
    return "swiglu" if sn.startswith("glu") else "rowq_fp8" if sn == "w256s4t256" else "plain"


def test_tma_store_is_open_and_its_gate_still_works(monkeypatch):
    # verified in bench/results/2026-12-07-h100-issue48 (tmastore/: 54 checks passed)
    assert sched_mod.TMA_STORE_VERIFIED
    assert TS_NAMES
    monkeypatch.setattr(sched_mod, "TMA_STORE_FP8_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)
    for sn in TS_NAMES:
        ir = epilogue_irs()[_op_for(sn)]
        assert is_valid(ir, schedules()[sn]) is None
    monkeypatch.setattr(sched_mod, "TMA_STORE_VERIFIED", False)
    for sn in TS_NAMES:
        ir = epilogue_irs()[_op_for(sn)]
        assert "not yet verified" in is_valid(ir, schedules()[sn])
    # the fp8 staging has its own gate (open since bench/results/2026-12-07-h100-matmul-2)
    monkeypatch.undo()
    assert sched_mod.TMA_STORE_FP8_VERIFIED
    monkeypatch.setattr(sched_mod, "TMA_STORE_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "TMA_STORE_FP8_VERIFIED", False)
    assert "fp8" in is_valid(epilogue_irs()["rowq_fp8"], schedules()["w256s4t256"])
    assert is_valid(epilogue_irs()["rowq_fp8"], schedules()["w256s4"]) is None


def test_tma_store_refusals(verified):
    ir = plain()
    s = GemmSchedule(stages=3, tma_store=256)
    assert is_valid(ir, s) is None
    assert "multiple of 64" in is_valid(ir, replace(s, tma_store=96))
    assert "divides tile_n" in is_valid(ir, replace(s, tile_n=192, tma_store=128))
    assert "cooperative" in is_valid(ir, replace(s, split_k=2, persistent=False))
    assert "cooperative" in is_valid(ir, replace(s, cluster_m=2))
    assert "cooperative" in is_valid(
        ir, replace(s, tile_n=128, stages=5, pingpong=True, tma_store=128)
    )
    # fp8 outputs stage boxes of 128 columns (128 bytes a row)
    assert is_valid(epilogue_irs()["rowq_fp8"], s) is None
    assert is_valid(epilogue_irs()["groupq_fp8"], replace(s, stages=4)) is None
    assert "multiple of 128" in is_valid(epilogue_irs()["rowq_fp8"], replace(s, tma_store=64))
    # 128 accumulator registers staged outside the grouped persistent order: spills (residual)
    assert "group_m > 1" in is_valid(ir, replace(s, persistent=False))
    assert "group_m > 1" in is_valid(ir, replace(s, group_m=1))
    assert is_valid(ir, replace(s, tile_m=64, consumers=1, group_m=1)) is None
    # the staging buffer counts against shared memory: 4 stages of 48 KB leave no 64 KB
    assert "shared memory" in is_valid(ir, replace(s, stages=4))
    assert is_valid(ir, replace(s, stages=4, tma_store=128)) is None
    # the output's tensor map needs 16-byte rows: N a multiple of 8 (16-bit) or 16 (fp8)
    assert "16 bytes" in is_valid(ir, s, {"M": 100, "N": 250, "K": 64})
    assert is_valid(ir, s, {"M": 100, "N": 248, "K": 64}) is None
    fp8 = epilogue_irs()["rowq_fp8"]
    assert "16 bytes" in is_valid(fp8, s, {"M": 100, "N": 248, "K": 64})
    assert is_valid(fp8, s, {"M": 100, "N": 240, "K": 64}) is None
    assert s.label().endswith("ts256")


def test_output_tensor_map_param(verified):
    e = gemm_emit.emit(plain(), schedules()["w256s3t256"])
    maps = [p for p in e.params if p.kind == "tmap"]
    assert [m.name for m in maps] == ["a", "b", "c"]
    assert maps[2].box == (64, 64) and maps[2].dims == ("N", "M") and maps[2].swizzle == 128
    assert ".param .align 64 .b8 c_map[128]" in e.ptx
    assert e.launch.smem_bytes == 3 * 48 * 1024 + 64 * 1024 + 16 * 3 + 1024
    # stores go through the staging buffer only: no global store left in the kernel
    assert "st.global" not in e.ptx


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize(
    "op", ["plain", "bias_gelu", "bias_silu", "residual", "relu2", "swiglu", "batched_row"]
)
@pytest.mark.parametrize("sn", TS_NAMES)
def test_tma_store_schedules_emit_and_compile_without_spills(op, sn, verified):
    from factory.compile import compile_ptx

    ir, s = epilogue_irs()[op], schedules()[sn]
    why = is_valid(ir, s)
    if why is not None:
        # the only refusals among these: a second weight with a 256-wide tile, a deep ring or
        # a staging buffer sized for an fp8 output
        assert (ir.b2 is not None and "256" in why) or "shared memory" in why, why
        return
    e = gemm_emit.emit(ir, s)
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok, r.log[-2000:]
    assert r.spill_store_bytes == 0, r.spill_store_bytes
    assert r.registers <= 255


@pytest.mark.parametrize("sn", TS_NAMES)
def test_emitted_protocol_order_and_offsets(sn, verified):
    ir = epilogue_irs()["swiglu" if sn.startswith("glu") else "plain"]
    s = schedules()[sn]
    if is_valid(ir, s) is not None:
        return  # a 16-bit output's staging does not fit (w256s4t256 is for fp8 outputs)
    e = gemm_emit.emit(ir, s)
    slots, boxes = s.tma_store // 64, s.tile_n // 64
    # the epilogue is emitted twice (whole tiles, tail tiles); each walks the tile's boxes
    steps = re.findall(
        r"(cp\.async\.bulk\.wait_group\.read \d+|fence\.proxy\.async\.shared::cta|"
        r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group|cp\.async\.bulk\.commit_group"
        r"|st\.shared\.b32|cp\.async\.bulk\.wait_group 0)",
        e.ptx,
    )
    one_box = (
        [f"cp.async.bulk.wait_group.read {slots - 1}"]
        + ["st.shared.b32"] * 16
        + [
            "fence.proxy.async.shared::cta",
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
            "cp.async.bulk.commit_group",
        ]
    )
    # the first fence is the barrier initialisation's (with cp.async loads, the main loop's
    # fence after each full-barrier wait follows); the last wait before the kernel ends
    head = 2 if s.load == "cp_async" else 1
    assert steps[:head] == ["fence.proxy.async.shared::cta"] * head
    assert steps[head:] == one_box * boxes * 2 + ["cp.async.bulk.wait_group 0"]
    # the stores' offsets: per column block j the XOR constant (j % 8) * 16, then rows h = 0, 1
    # at slot (j // 8) % slots x 8 KB + h x 1 KB (tiling.staged_offset)
    pairs = re.findall(
        r"xor\.b32 %r\d+, %r\d+, (\d+);\n(?:.*\n){1,}?\s*st\.shared\.b32 \[%r\d+\+(\d+)\]", e.ptx
    )
    offs = [int(x) for x in re.findall(r"st\.shared\.b32 \[%r\d+\+(\d+)\]", e.ptx)]
    want = [((j // 8) % slots) * 8192 + h * 1024 for j in range(s.tile_n // 8) for h in (0, 1)]
    assert offs == want * 2
    xors = [int(x) for x, _ in pairs]
    assert xors == [(j % 8) * 16 for j in range(s.tile_n // 8)] * 2


def test_staged_offsets_are_the_tma_layout():
    """Every register's staging offset is where the TMA store (128-byte swizzle) reads the
    element the register holds, and no two registers share a byte."""
    for slots in (1, 2, 4):
        seen = set()
        for w in range(4):
            for lane in range(32):
                for j in range(8 * slots):
                    for h in (0, 1):
                        for e in (0, 1):
                            off = tiling.staged_offset(w, lane, j, h, e, slots)
                            row, col = tiling.fragment(w, lane, 4 * j + 2 * h + e)
                            box = col // 64
                            want = (
                                (box % slots) * 8192
                                + tiling.swizzle128(row, (col % 64) // 8)
                                + (col % 8) * 2
                            )
                            assert off == want
                            seen.add(off)
        assert len(seen) == slots * 4096  # every 16-bit element of the buffer once


@pytest.mark.parametrize(
    ("m", "n", "tile_n", "slots"),
    [(130, 300, 256, 4), (64, 256, 256, 2), (200, 130, 128, 2), (1, 70, 256, 1)],
)
def test_staging_model_stores_every_element_once(m, n, tile_n, slots):
    c = np.random.default_rng(m * n).standard_normal((m, n))
    for seed in range(3):
        out, most = tiling.simulate_tma_store(c, tile_n, slots, seed=seed)
        np.testing.assert_array_equal(out, c)
        assert most <= slots


@pytest.mark.parametrize("slots", [1, 2])
def test_staging_model_catches_a_wait_that_allows_one_more(slots):
    c = np.random.default_rng(1).standard_normal((256, 512))
    with pytest.raises(AssertionError, match="overwritten"):
        for seed in range(5):
            tiling.simulate_tma_store(c, 256, slots, seed=seed, pending_allowed=slots)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "sn"),
    [
        ("plain", "w256s4t128"),
        ("plain", "w256s3t256"),
        ("bias_gelu", "w256s4t128"),
        ("residual", "w256s3t256"),
        ("swiglu", "glu128s4t128"),
        ("bias_gelu", "w128s4c1t128"),
    ],
)
def test_tma_store_kernels_correct_on_gpu(op, sn, verified):
    """The GPU check of the staged epilogue (what issue48_run.sh's preflight runs): tails in M,
    N (a multiple of 8) and K, one row, and many tiles per CTA (slots reused across tiles)."""
    torch = pytest.importorskip("torch")
    from lab.matmul import gemm_bench

    kern = gemm_bench.Kernel(epilogue_irs()[op], schedules()[sn])
    for i, (m, n, k) in enumerate(
        [(333, 248, 72), (1, 520, 4096), (4095, 4104, 1000), (130, 304, 8)]
    ):
        assert gemm_bench.check(torch, kern, op, m, n, k, seed=i), (op, sn, m, n, k)


def _space_classes(op: str) -> dict:
    """One staged schedule of the search space per (tile, consumers, staging, grid order, fast
    math) at a 4096^3 shape, the deepest ring of each: what the agents can propose for `op`.
    The grid order is grouped-persistent or not (group_m 1 or a grid of one tile a CTA): a
    residual epilogue of the 128x256 tile spilled 24 bytes in the latter, now refused."""
    from factory.families.matmul import space

    out: dict = {}
    for s in space.space(epilogue_irs()[op], [{"M": 4096, "N": 4096, "K": 4096, "Bt": 3}]):
        if s.tma_store:
            grouped = s.persistent and s.group_m > 1
            key = (s.tile_m, s.tile_n, s.consumers, s.tma_store, grouped, s.fast_math)
            if key not in out or s.stages > out[key].stages:
                out[key] = s
    return out


def test_space_holds_staged_schedules_where_the_output_allows():
    from factory.families.matmul import space

    assert 128 in space.OPTIONS["tma_store"] and 256 in space.OPTIONS["tma_store"]
    for op in ("plain", "bias_gelu", "residual", "swiglu", "rowq_fp8", "groupq_fp8"):
        assert _space_classes(op), op
    # fp8 outputs stage boxes of 128 columns (verified in 2026-12-07-h100-matmul-2); N = 4097
    # has no 16-byte output rows
    assert all(k[3] % 128 == 0 for k in _space_classes("rowq_fp8"))
    odd = space.space(epilogue_irs()["plain"], [{"M": 4095, "N": 4097, "K": 4000}])
    assert odd and not any(s.tma_store for s in odd)


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize(
    "op",
    [
        "plain",
        "bias_gelu",
        "bias_silu",
        "residual",
        "relu2",
        "swiglu",
        "batched_row",
        "rowq_fp8",
        "groupq_fp8",
    ],
)
def test_space_staged_schedules_compile_without_spills(op):
    """Every staged (tile, consumers, staging, persistent) class the search can propose, at its
    deepest ring: ptxas keeps 168 registers a thread (setmaxnreg is ignored under nvJitLink),
    and none of them may spill."""
    from factory.compile import compile_ptx

    classes = _space_classes(op)
    assert classes
    for key, s in classes.items():
        r = compile_ptx(gemm_emit.emit(epilogue_irs()[op], s).ptx, "sm_90a", cache=False)
        assert r.ok, (key, r.log[-2000:])
        assert r.spill_store_bytes == 0, (key, r.spill_store_bytes)


def test_worker_builds_the_output_tensor_map_over_the_run_buffer(monkeypatch):
    """gpuworker/child.py: a "tmap" parameter naming an output is encoded over the buffer the
    run writes (the staged one when the run has one, else the guarded output), with the output's
    dtype; an input's over its slot; an unknown name is the entrant's error."""
    from types import SimpleNamespace

    from gpuworker import child, tensormap
    from gpuworker.batch import params_to_json

    seen = []
    monkeypatch.setattr(
        tensormap, "encode_param", lambda p, ptr, dims, dtype: seen.append((ptr, dtype)) or ptr
    )
    sh = SimpleNamespace(
        dims={"M": 100, "N": 248, "K": 64},
        inputs={
            "a": {"slots": [SimpleNamespace(ptr=1000), SimpleNamespace(ptr=2000)], "dtype": "bf16"}
        },
        outputs={"c": {"out": SimpleNamespace(ptr=5000), "dtype": "fp16"}},
    )
    e = gemm_emit.emit(plain(), schedules()["w256s4t128"])
    params = {p["name"]: p for p in params_to_json(e.params) if p["kind"] == "tmap"}
    assert set(params) == {"a", "b", "c"}
    tm = child.PtxEntrant._tensor_map
    assert tm(None, params["a"], sh, 1) == 2000
    assert tm(None, params["c"], sh, 0) == 5000
    assert tm(None, params["c"], sh, 1, {"c": 7000}) == 7000
    assert seen == [(2000, "bf16"), (5000, "fp16"), (7000, "fp16")]
    with pytest.raises(child.EntrantError, match="unknown tensor"):
        tm(None, dict(params["c"], name="d"), sh, 0)


def test_fp8_staged_offsets_are_the_tma_layout():
    """An fp8 output: boxes of 128 columns (128 bytes a row); every register's byte is where
    the TMA store reads the element it holds, no two registers share a byte."""
    for slots in (1, 2):
        seen = set()
        for w in range(4):
            for lane in range(32):
                for j in range(16 * slots):
                    for h in (0, 1):
                        for e in (0, 1):
                            off = tiling.staged_offset(w, lane, j, h, e, slots, elem=1)
                            row, col = tiling.fragment(w, lane, 4 * j + 2 * h + e)
                            box = col // 128
                            want = (
                                (box % slots) * 8192
                                + tiling.swizzle128(row, (col % 128) // 16)
                                + col % 16
                            )
                            assert off == want
                            seen.add(off)
        assert len(seen) == slots * 8192  # every byte of the buffer once


@pytest.mark.parametrize("sn", ["w256s4t256", "w256s4t128", "w128s5t128"])
@pytest.mark.parametrize("op", ["rowq_fp8", "groupq_fp8"])
def test_fp8_emitted_offsets_and_map(op, sn, verified):
    """The fp8 staging as emitted: the output mapped as 16-bit pairs (N / 2 a row), per column
    block j the XOR constant ((j % 16) / 2) x 16 and the offset slot x 8 KB + h x 1 KB + 8 (j % 2)
    (tiling.staged_offset with elem=1), one box store per 128 columns, no global store of the
    values (a group-scaled output still stores its scales)."""
    ir, s = epilogue_irs()[op], schedules()[sn]
    e = gemm_emit.emit(ir, s)
    cmap = [p for p in e.params if p.kind == "tmap"][2]
    assert cmap.dims == ("ceildiv(N, 2)", "M") and cmap.box == (64, 64)
    assert e.launch.smem_bytes == s.smem_bytes(ir)
    assert s.epi_bytes(ir) == s.tile_m * s.tma_store
    slots = s.tma_store // 128
    offs = [int(x) for x in re.findall(r"st\.shared\.b16 \[%r\d+\+(\d+)\]", e.ptx)]
    want = [
        ((j // 16) % slots) * 8192 + h * 1024 + 8 * (j % 2)
        for j in range(s.tile_n // 8)
        for h in (0, 1)
    ]
    assert offs == want * 2  # whole tiles, tail tiles
    xors = [
        int(x)
        for x in re.findall(
            r"xor\.b32 %r\d+, %r\d+, (\d+);\n(?:.*\n){1,}?\s*st\.shared\.b16", e.ptx
        )
    ]
    assert xors == [((j % 16) // 2) * 16 for j in range(s.tile_n // 8)] * 2
    stores = e.ptx.count("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group")
    assert stores == 2 * s.tile_n // 128
    assert ("st.global.f32" in e.ptx) == (op == "groupq_fp8")
    assert "st.global.b" not in e.ptx
