"""What the hardware sees of an attention schedule at a shape: the unmasked work, an analytic
time estimate that ranks seeds, cost-model features, and the roofline.

FLOPs count the unmasked work only: 4 * D per (query, key) pair the mask's band keeps (two
products, a multiply-add each), summed over batch and query heads. An elementwise mask (a
document mask) depends on the data, so the count is the band's: an upper bound there.
"""

from __future__ import annotations

import math

import numpy as np

from factory.device import device_for
from factory.families.base import Roofline, io_bytes, log2

DEVICE = device_for("sm_90a")
SMS = DEVICE.sms
PEAK_FLOPS_PER_US = DEVICE.peak_bf16_flops_per_us
HBM_BYTES_PER_US = DEVICE.copy_bytes_per_us
# The share of the tensor cores' peak the main loop holds: softmax between the two products
# is not overlapped in the first emitter (a guess until GPU runs fit it).
MAIN_LOOP_EFFICIENCY = 0.45

FEATURE_FIELDS = ("block_m", "block_n", "stages", "pv_split", "problem")
FEATURE_NAMES = (
    "log2_ctas",
    "log2_waves",
    "band_fraction",
    "log2_kv_tiles_per_cta",
    "smem_fraction",
    "block_m",
    "block_n",
    "stages",
    "log2_estimate_us",
)


def parse_problem(schedule: dict, dims: dict) -> dict:
    """The problem a schedule dict names, at `dims`: b, hq, hkv, s, skv, d, lo, hi."""
    text = schedule.get("problem") or ""
    head, _, band = text.partition("|")
    parts = head.split(",") if head else []
    names = ("b", "hq", "hkv", "s", "skv", "d")
    out: dict = {}
    for name, p in zip(names, parts, strict=False):
        out[name] = int(p) if p.isdigit() else int(dims.get(p, 1))
    for name in names:
        out.setdefault(name, 128 if name == "d" else 1)
    lo, _, hi = band.partition(":")
    out["lo"] = None if lo in ("", "None") else int(lo)
    out["hi"] = None if hi in ("", "None") else int(hi)
    return out


def kept_pairs(s: int, skv: int, lo: int | None, hi: int | None) -> float:
    """(query, key) pairs the band keeps over one head: keys max(0, i + lo) ..
    min(skv - 1, i + hi) of each query i."""
    i = np.arange(s, dtype=np.int64)
    first = np.zeros(s, np.int64) if lo is None else np.maximum(0, i + lo)
    last = np.full(s, skv - 1, np.int64) if hi is None else np.minimum(skv - 1, i + hi)
    return float(np.maximum(0, last - first + 1).sum())


def flops(p: dict) -> float:
    return 4.0 * p["d"] * p["b"] * p["hq"] * kept_pairs(p["s"], p["skv"], p["lo"], p["hi"])


def estimate_us(schedule: dict, dims: dict) -> float:
    """An analytic time of one call (microseconds): the visited tiles' products at the main
    loop's share of the peak, spread over the CTAs in waves, plus the launch floor."""
    p = parse_problem(schedule, dims)
    bm, bn = int(schedule.get("block_m", 128)), int(schedule.get("block_n", 128))
    ctas = math.ceil(p["s"] / bm) * p["hq"] * p["b"]
    frac = kept_pairs(p["s"], p["skv"], p["lo"], p["hi"]) / max(1.0, p["s"] * p["skv"])
    tiles_per_cta = max(1.0, frac * math.ceil(p["skv"] / bn))
    per_tile = 4.0 * bm * bn * p["d"] / (PEAK_FLOPS_PER_US / SMS * MAIN_LOOP_EFFICIENCY)
    if bm == 64:
        per_tile *= 1.3  # one consumer warpgroup: its softmax stalls the tensor cores
    waves = math.ceil(ctas / SMS)
    return DEVICE.launch_floor_us + waves * tiles_per_cta * per_tile


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    p = parse_problem(schedule, dims)
    bm, bn = int(schedule.get("block_m", 128)), int(schedule.get("block_n", 128))
    stages = int(schedule.get("stages", 2))
    ctas = math.ceil(p["s"] / bm) * p["hq"] * p["b"]
    frac = kept_pairs(p["s"], p["skv"], p["lo"], p["hi"]) / max(1.0, p["s"] * p["skv"])
    smem = 1024 + bm * p["d"] * 2 + stages * 2 * bn * p["d"] * 2
    return [
        log2(ctas),
        log2(ctas / SMS),
        frac,
        log2(max(1.0, frac * math.ceil(p["skv"] / bn))),
        smem / DEVICE.smem_per_sm_bytes,
        float(bm),
        float(bn),
        float(stages),
        log2(estimate_us(schedule, dims)),
    ]


def roofline(workload, dims: dict) -> Roofline:
    """Bytes: every input read once, every output written once. FLOPs: the unmasked work."""
    from factory.families.attention.ir import lower
    from factory.families.attention.schedule import problem_text

    ir = lower(workload)
    p = parse_problem({"problem": problem_text(ir)}, dims)
    return Roofline(bytes=io_bytes(workload, dims), flops=flops(p))
