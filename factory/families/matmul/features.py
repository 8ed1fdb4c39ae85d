"""What the hardware sees of a matmul schedule at a shape: cost-model features, an analytic time
estimate that ranks seeds, and the roofline of a workload.

The schedule dict names the problem's dims in its `problem` field ("M,N,K", "M,N,K,2" with two
right operands, "B*M,N,K" with a batch axis B), written by the space from the IR, so features
need nothing but the dict and the shape.
"""

from __future__ import annotations

import math

from factory.device import device_for
from factory.families.base import Roofline, io_bytes, log2
from factory.spec import expr as E

DEVICE = device_for("sm_90a")
SMS = DEVICE.sms
PEAK_FLOPS_PER_US = DEVICE.peak_bf16_flops_per_us
HBM_BYTES_PER_US = DEVICE.copy_bytes_per_us
L2_BYTES_PER_US = 16e6  # L2 to SMs, all SMs together
TMA_LATENCY_US = 1.0  # a k-block's load from issue to its mbarrier completing
# The estimate's constants are set so that it reproduces the emitter's measured times (H200,
# bench/results/2026-12-07-h200-matmul-emitter: 128x256 and 128x128 tiles at 4096^3 and 8192^3
# within 5%): the card holds about 79% of its peak clock under dense bf16 GEMM, and the epilogue
# stores a tile from the accumulator fragment at about 8 KB per microsecond per SM while the
# tensor cores wait (it is not overlapped with the next tile's main loop).
SUSTAINED_CLOCK = 0.79
EPILOGUE_BYTES_PER_US_PER_SM = 8000.0
# split-K: a CTA stores its fp32 partial tile to shared memory and reads its share of the
# others' over distributed shared memory; bytes per microsecond per SM, a guess (not measured).
DSMEM_BYTES_PER_US_PER_SM = 50000.0
# Rows of A and B whose pitch (2 K bytes) is not a multiple of 32 (K % 16 != 0): every load
# path slows down. The 128x256 staged kernel (H100, bench/results/2026-12-07-h100-matmul-3,
# kprobe/) ran 3072x5120xK at 0.942-0.961x cuBLAS for K = 2048, 2080, 2096, 2112, 2176 (pitches
# 0, 64, 96, 0 and 0 mod 128) and 0.618x at K = 2056: a k-block takes about 1.6x as long; the
# cp.async kernels lost as much (unaligned/). A pitch that is a multiple of 32 but not of 128
# costs nothing measurable.
PITCH32_SLOWDOWN = 1.6
# cp.async loads (schedule load "cp_async") against TMA, same tile, same call (unaligned/): the
# 128x256 staged kernel 125.6 against 109.5 us at 3072x5120x2048 (1.15x), 1.05-1.09x at the three
# shapes with K % 16 != 0 (on top of PITCH32_SLOWDOWN); unstaged cp.async 0.716x cuBLAS against
# the staged TMA's 0.961x.
CP_ASYNC_SLOWDOWN = 1.15
CP_ASYNC_SLOWDOWN_PITCH32 = 1.07
SMEM_PER_SM = DEVICE.smem_per_sm_bytes
REGS_PER_SM = DEVICE.registers_per_sm

# The schedule fields `features` reads (the cost model caches a layout's share per their values).
FEATURE_FIELDS = (
    "kind",
    "tile_m",
    "tile_n",
    "tile_k",
    "stages",
    "consumers",
    "cluster_m",
    "cluster_n",
    "group_m",
    "persistent",
    "split_k",
    "pingpong",
    "tma_store",
    "load",
    "problem",
)

FEATURE_NAMES = (
    "log2_tiles",
    "log2_waves",
    "last_wave_fill",
    "log2_k_iters",
    "smem_fraction",
    "acc_register_fraction",
    "log2_bytes_per_tile",
    "log2_flops_per_tile",
    "log2_intensity_vs_ridge",
    "stages",
    "consumers",
    "persistent",
    "log2_group_m",
    "log2_tiles_per_cta",
    "wgmma_n_efficiency",
    "log2_estimate_vs_roofline",
    "pingpong",
    "cluster_m",
)


def problem_text(ir) -> str:
    """The `problem` field of a schedule for `ir`."""
    rows = "*".join((*ir.batch, ir.m))
    return f"{rows},{ir.n},{ir.k}" + (",2" if ir.b2 is not None else "")


def gemm_dims(
    schedule: dict, dims: dict, dim_order: list | None = None
) -> tuple[int, int, int, int]:
    """(rows, N, K, right operands) of the problem a schedule dict describes at `dims` (rows
    folds the batch axes into M). Without a `problem` field: dims named M, N, K, else the job's
    first three dims in the order x [M, K], w [N, K] declares them."""
    text = schedule.get("problem") or ""
    parts = text.split(",") if text else []
    try:
        if len(parts) >= 3:
            rows = math.prod(int(dims[d]) for d in parts[0].split("*"))
            nb = 2 if len(parts) > 3 and parts[3] == "2" else 1
            return rows, int(dims[parts[1]]), int(dims[parts[2]]), nb
    except KeyError:
        pass
    if {"M", "N", "K"} <= set(dims):
        return int(dims["M"]), int(dims["N"]), int(dims["K"]), 1
    order = [d for d in (dim_order or list(dims)) if d in dims] or list(dims)
    if not order:  # a record without a shape: a neutral problem
        return 1, 1, 1, 1
    order = (order + order[-1:] * 3)[:3]
    return int(dims[order[0]]), int(dims[order[2]]), int(dims[order[1]]), 1


def _ceil(a: int, b: int) -> int:
    return -(-int(a) // max(1, int(b)))


def _wgmma_efficiency(tile_n: int, consumers: int) -> float:
    """Share of the tensor cores' peak one k-block reaches: a wide wgmma N amortises its issue,
    and two consumer warpgroups overlap each other's waits."""
    return (tile_n / (tile_n + 16.0)) * (1.0 if consumers >= 2 else 0.85)


def estimate(schedule: dict, rows: int, n: int, k: int, nb: int = 1, out_bytes: int = 2) -> dict:
    """An analytic model of one call: tile counts, waves, per-k-block times and the total
    (microseconds). Used to rank seeds and as a feature; the fitted cost model corrects it."""
    tm = int(schedule.get("tile_m", 128))
    tn = int(schedule.get("tile_n", 256))
    tk = int(schedule.get("tile_k", 64)) or 64
    stages = max(2, int(schedule.get("stages", 4)))
    consumers = int(schedule.get("consumers", 2))
    persistent = bool(schedule.get("persistent", True))
    group_m = max(1, int(schedule.get("group_m", 8)))
    split_k = max(1, int(schedule.get("split_k", 1)))
    pingpong = bool(schedule.get("pingpong", False))
    cluster_m = max(1, int(schedule.get("cluster_m", 1)))
    tiles_m, tiles_n = _ceil(rows, tm), _ceil(n, tn)
    tiles = tiles_m * tiles_n * split_k
    waves = _ceil(tiles, SMS)
    k_iters = _ceil(_ceil(k, tk), split_k)
    eff = _wgmma_efficiency(tn, consumers)
    t_mma = 2.0 * tm * tn * nb * tk / (PEAK_FLOPS_PER_US * SUSTAINED_CLOCK / SMS * eff)
    # a 2x1 cluster multicasts B: each CTA fetches half of its B tile from L2
    kb_bytes = (tm + tn * nb / cluster_m) * tk * 2
    t_load = kb_bytes / (L2_BYTES_PER_US / SMS)
    t_kb = max(t_mma, t_load, TMA_LATENCY_US / (stages - 1))
    odd_pitch = (2 * k) % 32 != 0
    if odd_pitch:
        t_kb *= PITCH32_SLOWDOWN
    if schedule.get("load", "tma") == "cp_async":
        t_kb *= CP_ASYNC_SLOWDOWN_PITCH32 if odd_pitch else CP_ASYNC_SLOWDOWN
    epi = tm * tn * out_bytes / EPILOGUE_BYTES_PER_US_PER_SM
    if pingpong:  # one consumer's epilogue runs beside the other's main loop
        epi *= 0.2
    elif int(schedule.get("tma_store", 0) or 0):
        # staged in shared memory and stored by TMA while the next tile's loads run: the H100
        # run of 2026-12-07 measured 23 of the 128x256 tile's ~33 us of epilogue at 4096^3 gone
        epi *= 0.3
    fill = TMA_LATENCY_US
    if persistent:  # the producer starts the next tile's loads while the consumers store
        fill *= 0.3
    per_tile = k_iters * t_kb + fill + epi
    if split_k > 1:
        # the partial out to shared memory, then (split_k - 1) / split_k of a tile read remotely;
        # the epilogue shared among the cluster's CTAs
        part = tm * tn * 4 * nb
        per_tile += part * (1 + (split_k - 1) / split_k) / DSMEM_BYTES_PER_US_PER_SM
        per_tile -= epi * (split_k - 1) / split_k
    compute_us = waves * per_tile
    # DRAM: a wave of SMS tiles in grouped order covers group_m tile rows by SMS / group_m tile
    # columns; each A and B panel of the wave is read from DRAM once.
    g = min(group_m, tiles_m)
    cols = min(tiles_n, max(1, SMS // g))
    per_wave = (g * tm + cols * tn * nb / cluster_m) * k * 2
    dram_us = min(waves, _ceil(tiles, g * cols)) * per_wave / HBM_BYTES_PER_US
    dram_us += rows * n * out_bytes / HBM_BYTES_PER_US
    total = DEVICE.launch_floor_us + max(compute_us, dram_us)
    last = tiles - (waves - 1) * SMS
    return {
        "tiles": tiles,
        "waves": waves,
        "last_wave_fill": last / SMS if tiles >= SMS else tiles / SMS,
        "k_iters": k_iters,
        "t_mma": t_mma,
        "t_load": t_load,
        "per_tile": per_tile,
        "us": total,
        "efficiency": eff,
        "ctas": min(tiles, SMS) if persistent else tiles,
    }


def smem_bytes(schedule: dict, nb: int) -> int:
    tm, tn = int(schedule.get("tile_m", 128)), int(schedule.get("tile_n", 256))
    stages = int(schedule.get("stages", 4))
    staging = tm * int(schedule.get("tma_store", 0) or 0) * 2  # the TMA-store epilogue's buffers
    return (
        stages * (tm + tn * nb) * int(schedule.get("tile_k", 64)) * 2 + staging + 16 * stages + 1024
    )


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    """Cost-model features of a matmul schedule at `dims` (see FEATURE_NAMES), log2 scaled
    where they span orders of magnitude."""
    rows, n, k, nb = gemm_dims(schedule, dims, dim_order)
    est = estimate(schedule, rows, n, k, nb)
    tm, tn = int(schedule.get("tile_m", 128)), int(schedule.get("tile_n", 256))
    consumers = int(schedule.get("consumers", 2))
    tile_bytes = (tm + tn * nb) * k * 2 + tm * tn * 2
    tile_flops = 2.0 * tm * tn * nb * k
    ridge = PEAK_FLOPS_PER_US / HBM_BYTES_PER_US
    acc = tm // max(1, consumers) * tn * nb // 128
    left = REGS_PER_SM // 128 - 40
    creg = min(240, (left // max(1, consumers)) // 8 * 8)
    flops = 2.0 * rows * n * k * nb
    io = (rows * k + n * k * nb + rows * n) * 2
    roof = DEVICE.launch_floor_us + max(flops / PEAK_FLOPS_PER_US, io / HBM_BYTES_PER_US)
    return [
        log2(est["tiles"]),
        log2(est["tiles"] / SMS),
        est["last_wave_fill"],
        log2(est["k_iters"]),
        smem_bytes(schedule, nb) / SMEM_PER_SM,
        (acc + 40) / max(1, creg),
        log2(tile_bytes),
        log2(tile_flops),
        log2(tile_flops / tile_bytes / ridge),
        float(schedule.get("stages", 4)),
        float(consumers),
        1.0 if schedule.get("persistent", True) else 0.0,
        log2(int(schedule.get("group_m", 8))),
        log2(est["tiles"] / max(1, est["ctas"])),
        est["efficiency"],
        log2(est["us"] / roof),
        1.0 if schedule.get("pingpong", False) else 0.0,
        float(schedule.get("cluster_m", 1)),
    ]


def roofline(workload, dims: dict) -> Roofline:
    """Bytes: every input read once, every output written once. FLOPs: 2 M N K per matrix
    product (batch axes multiply), whatever the epilogue adds left out."""
    flops = 0.0
    seen: set = set()
    for o in workload.outputs:
        for node in E.walk(o.expr):
            if isinstance(node, E.MatMul) and node not in seen:
                seen.add(node)
                size = 1
                for d in (*node.shape, node.a.shape[-1]):
                    size *= int(dims[d]) if isinstance(d, str) else int(d)
                flops += 2.0 * size
    return Roofline(bytes=io_bytes(workload, dims), flops=flops)
