"""The GEMM variants the bench runs: epilogue IRs and schedules, shared by the bench and tests."""

from __future__ import annotations

import math

from factory.families.matmul.ir import (
    EpiInput,
    EpiOutput,
    GemmIR,
    Operand,
    acc,
    acc2,
    plain,
)
from factory.families.matmul.schedule import GemmSchedule
from factory.spec import expr as E

S = ("M", "N")


def _b(op, a, b):
    return E.Binary(op, a, b, S)


def _c(v):
    return E.Const(float(v))


def _gelu_tanh(x):
    inner = _b(
        "mul",
        _c(math.sqrt(2 / math.pi)),
        _b("add", x, _b("mul", _c(0.044715), _b("pow", x, _c(3)))),
    )
    return _b("mul", _b("mul", _c(0.5), x), _b("add", _c(1), E.Unary("tanh", inner, S)))


def _silu(x):
    return _b("mul", x, E.Unary("sigmoid", x, S))


def _ir(name, expr, inputs=(), b2=False, batch=()):
    return GemmIR(
        name,
        "M",
        "N",
        "K",
        tuple(batch),
        Operand("a", "bf16", "row"),
        Operand("b", "bf16", "col"),
        Operand("b2", "bf16", "col") if b2 else None,
        tuple(inputs),
        (EpiOutput("c", "bf16", expr),),
    )


def epilogue_irs() -> dict[str, GemmIR]:
    bias = E.Input("bias", ("N",), "fp32")
    res = E.Input("res", S, "fp32")
    x = _b("add", acc(), bias)
    return {
        "plain": plain(),
        "bias_gelu": _ir("bias_gelu", _gelu_tanh(x), [EpiInput("bias", "bf16", "col")]),
        "bias_silu": _ir("bias_silu", _silu(x), [EpiInput("bias", "bf16", "col")]),
        "residual": _ir("residual", _b("add", acc(), res), [EpiInput("res", "bf16", "full")]),
        "relu2": _ir("relu2", _b("pow", _b("max", acc(), _c(0)), _c(2))),
        "swiglu": _ir("swiglu", _b("mul", _silu(acc()), acc2()), b2=True),
        # a per-row fp8 quantised output: each row times its scale (rs = 1 / row scale, as a
        # delayed-scaling recipe keeps it), stored as e4m3 (nearest even, saturating at 448)
        "rowq_fp8": GemmIR(
            "rowq_fp8",
            "M",
            "N",
            "K",
            (),
            Operand("a", "bf16", "row"),
            Operand("b", "bf16", "col"),
            None,
            (EpiInput("rs", "fp32", "row"),),
            (EpiOutput("c", "fp8e4m3", _b("mul", acc(), E.Input("rs", ("M", 1), "fp32"))),),
        ),
        # fp8 e4m3 with a scale per row and 128-column group (amax / 448), computed in the
        # epilogue: y ~ c * cs (ir.EpiOutput.group_scale says why not one scale per whole row)
        "groupq_fp8": GemmIR(
            "groupq_fp8",
            "M",
            "N",
            "K",
            (),
            Operand("a", "bf16", "row"),
            Operand("b", "bf16", "col"),
            None,
            (),
            (EpiOutput("c", "fp8e4m3", acc(), group_scale="cs"),),
        ),
        # a batch axis Bt (3 in the bench) over A and the output, a per-row scale shared by the
        # batch: rows flatten to Bt * M, the scale is read at row % M
        "batched_row": _ir(
            "batched_row",
            _b("mul", acc(), E.Input("rs", ("M", 1), "fp32")),
            [EpiInput("rs", "bf16", "row")],
            batch=("Bt",),
        ),
    }


def schedules() -> dict[str, GemmSchedule]:
    return {
        "w256s4": GemmSchedule(tile_n=256, stages=4),
        "w256s3": GemmSchedule(tile_n=256, stages=3),
        "w256s4g16": GemmSchedule(tile_n=256, stages=4, group_m=16),
        "w256s4np": GemmSchedule(tile_n=256, stages=4, persistent=False),
        "w128s5": GemmSchedule(tile_n=128, stages=5),
        "w128s4c1": GemmSchedule(tile_m=64, tile_n=128, consumers=1, stages=4),
        "w256s4c1": GemmSchedule(tile_m=64, tile_n=256, consumers=1, stages=4),
        "glu128s4": GemmSchedule(tile_n=128, stages=4),
        "pp128s6": GemmSchedule(tile_n=128, stages=6, pingpong=True),
        "pp128s5": GemmSchedule(tile_n=128, stages=5, pingpong=True),
        "w128s6": GemmSchedule(tile_n=128, stages=6),
        "cl2w256s4": GemmSchedule(tile_n=256, stages=4, cluster_m=2),
        "cl2glu128s4": GemmSchedule(tile_n=128, stages=4, cluster_m=2),
        # split-K (clusters of 2 or 4 CTAs per tile, one tile each) for few tiles over a long K
        "sk2w256s4": GemmSchedule(tile_n=256, stages=4, split_k=2, persistent=False),
        "sk4w128s4": GemmSchedule(tile_n=128, stages=4, split_k=4, persistent=False),
        "sk4c1w128s4": GemmSchedule(
            tile_m=64, tile_n=128, consumers=1, stages=4, split_k=4, persistent=False
        ),
        "sk2glu128s4": GemmSchedule(tile_n=128, stages=4, split_k=2, persistent=False),
        # the epilogue staged in shared memory and stored by TMA (schedule.TMA_STORE_VERIFIED):
        # 128 x 256 at 3 stages with a whole-tile staging buffer (64 KB), at 4 stages with half
        # of it (two 64-column slots a consumer, reused along the tile), SwiGLU's 128 x 128 whole
        "w256s3t256": GemmSchedule(tile_n=256, stages=3, tma_store=256),
        "w256s4t128": GemmSchedule(tile_n=256, stages=4, tma_store=128),
        "glu128s4t128": GemmSchedule(tile_n=128, stages=4, tma_store=128),
        # the 64-row tile (one consumer warpgroup) staged: in the search space since the H100
        # run of 2026-12-07, not itself run on a GPU yet (tests/factory/test_matmul_tma_store.py)
        "w128s4c1t128": GemmSchedule(tile_m=64, tile_n=128, consumers=1, stages=4, tma_store=128),
        # skinny shapes (few output tiles): 128 x 128 staged (128 tiles at 512 x 4096), the
        # 64-row tile 256 wide (128 tiles there, the wide tile's wgmma with one consumer), the
        # 64-row tile 128 wide with a deep ring (M = 128: memory bound on B), and split-K of
        # 128 x 128 (2: 128 CTAs at 128 x 8192) and 128 x 256 (4: 128 CTAs there)
        "w128s5t128": GemmSchedule(tile_n=128, stages=5, tma_store=128),
        "w128s6t128": GemmSchedule(tile_n=128, stages=6, tma_store=128),
        "w256s5c1": GemmSchedule(tile_m=64, tile_n=256, consumers=1, stages=5),
        "w256s5c1t128": GemmSchedule(tile_m=64, tile_n=256, consumers=1, stages=5, tma_store=128),
        "w128s8c1": GemmSchedule(tile_m=64, tile_n=128, consumers=1, stages=8),
        "w128s7c1t128": GemmSchedule(tile_m=64, tile_n=128, consumers=1, stages=7, tma_store=128),
        "sk2w128s4": GemmSchedule(tile_n=128, stages=4, split_k=2, persistent=False),
        "sk2w128s6": GemmSchedule(tile_n=128, stages=6, split_k=2, persistent=False),
        "sk2c1w256s4": GemmSchedule(
            tile_m=64, tile_n=256, consumers=1, stages=4, split_k=2, persistent=False
        ),
        "sk4w256s4": GemmSchedule(tile_n=256, stages=4, split_k=4, persistent=False),
        # an fp8 output staged in two 128-column boxes a consumer (16 KB; a 16-bit output's
        # 256 columns at 4 stages do not fit)
        "w256s4t256": GemmSchedule(tile_n=256, stages=4, tma_store=256),
        # tile_k 128 (schedule.WIDE_K_VERIFIED): each stage reads 256 contiguous bytes of every
        # row of A and B, for the memory-bound M = 128 (B read once from DRAM)
        "w128s4c1k128": GemmSchedule(tile_m=64, tile_n=128, consumers=1, stages=4, tile_k=128),
        "sk2w128s3k128": GemmSchedule(
            tile_n=128, stages=3, split_k=2, persistent=False, tile_k=128
        ),
        "sk4w256s2k128": GemmSchedule(
            tile_n=256, stages=2, split_k=4, persistent=False, tile_k=128
        ),
        "w256s2k128t128": GemmSchedule(tile_n=256, stages=2, tile_k=128, tma_store=128),
        # cp.async loads (schedule.CP_ASYNC_VERIFIED; gemm_bench --allow-cp-async): the producer
        # warpgroup copies 16-byte chunks into the swizzled ring, for K % 64 != 0 where every
        # TMA box row spans two 128-byte lines; "ca" names the same schedule loaded that way
        "w256s4ca": GemmSchedule(tile_n=256, stages=4, load="cp_async"),
        "w256s4t128ca": GemmSchedule(tile_n=256, stages=4, tma_store=128, load="cp_async"),
        "w128s6t128ca": GemmSchedule(tile_n=128, stages=6, tma_store=128, load="cp_async"),
        "glu128s4t128ca": GemmSchedule(tile_n=128, stages=4, tma_store=128, load="cp_async"),
        "w128s7c1t128ca": GemmSchedule(
            tile_m=64, tile_n=128, consumers=1, stages=7, tma_store=128, load="cp_async"
        ),
        "pp128s6ca": GemmSchedule(tile_n=128, stages=6, pingpong=True, load="cp_async"),
        "sk2w256s4ca": GemmSchedule(
            tile_n=256, stages=4, split_k=2, persistent=False, load="cp_async"
        ),
        "w128s4c1k128ca": GemmSchedule(
            tile_m=64, tile_n=128, consumers=1, stages=4, tile_k=128, load="cp_async"
        ),
    }
