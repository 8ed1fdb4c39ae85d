"""The row family's cost-model features: what the GPU sees of a row layout at a shape.

Quantities the hardware sees, derived from the layout and the shape: threads per block, resident
blocks per SM, waves of blocks over the GPU and the tail of the last wave, loop iterations per
row, elements in flight per SM, rows in flight per SM, whether a register-held row fits, idle
lanes in the last step, elements per thread, the row count and length (as log2 where they
scale), and the same again for the register-held ("cached") mode. Dims: the last dim (in
`dim_order`, else in the dict's order) is the row length, the product of the others the row
count.
"""

from __future__ import annotations

import math

from factory.costmodel import _is_number
from factory.device import DEFAULT as DEVICE

NUM_SMS = DEVICE.sms
MAX_THREADS_PER_SM = DEVICE.max_threads_per_sm
MAX_BLOCKS_PER_SM = DEVICE.max_blocks_per_sm


def _num(s: dict, key: str, default: float) -> float:
    v = s.get(key)
    return float(v) if _is_number(v) and v else default


# The schedule fields `features` reads (the cost model computes them once per their values).
LAYOUT_FIELDS = (
    "threads_per_row",
    "cluster_blocks",
    "rows_per_block",
    "vec_elems",
    "chunks",
    "persistent_blocks_per_sm",
    "min_threads_per_sm",
    "mode",
    "rows_per_thread",
)


def layout_features(s: dict, rows: float, row_len: float) -> list[float]:
    """What the GPU sees of a row layout at a shape (see the module docstring); a schedule
    without the row fields gets the generator's defaults. Reads LAYOUT_FIELDS only."""
    tpr = _num(s, "threads_per_row", 256.0)
    cluster = _num(s, "cluster_blocks", 1.0)
    rpb = _num(s, "rows_per_block", 1.0)
    tpb = tpr * rpb / cluster
    k = _num(s, "rows_per_thread", 1.0)  # rows each row group holds at once
    vec = _num(s, "vec_elems", 8.0)
    chunks = _num(s, "chunks", 1.0)
    persistent = _num(s, "persistent_blocks_per_sm", 0.0)
    resident = min(_num(s, "min_threads_per_sm", MAX_THREADS_PER_SM), MAX_THREADS_PER_SM)
    per_sm = max(1.0, min(float(MAX_BLOCKS_PER_SM), math.floor(resident / tpb)))
    if persistent:
        per_sm = min(per_sm, persistent)
    blocks = NUM_SMS * persistent if persistent else math.ceil(rows / (rpb * k)) * cluster
    waves = blocks / (NUM_SMS * per_sm)
    span = tpr * vec  # elements one step of the row's threads covers
    cached = s.get("mode") == "cached"
    fits = 1.0 if not cached or row_len <= span * chunks else 0.0
    idle = (math.ceil(row_len / span) * span - row_len) / row_len
    iterations = row_len / (span if cached else span * chunks)
    return [
        math.log2(tpb),
        math.log2(max(waves, 1e-3)),
        waves / math.ceil(waves),
        math.log2(max(iterations, 1e-3)),
        math.log2(per_sm * tpb * vec * chunks * k),
        math.log2(per_sm * rpb * k / cluster),
        fits,
        idle,
        math.log2(row_len / tpr),
        math.log2(rows),
        math.log2(row_len),
    ]


def rows_and_length(dims: dict, dim_order: list[str]) -> tuple[float, float]:
    names = [d for d in dim_order if d in dims] + [d for d in dims if d not in dim_order]
    sizes = [max(float(dims[d]), 1.0) for d in names] or [1.0]
    return float(math.prod(sizes[:-1])) if len(sizes) > 1 else 1.0, sizes[-1]


def features(schedule: dict, dims: dict, dim_order: list[str]) -> list[float]:
    """The layout's features at a shape, then the same again counted only for the cached mode."""
    lay = layout_features(schedule, *rows_and_length(dims, dim_order))
    cached = 1.0 if schedule.get("mode") == "cached" else 0.0
    return lay + [x * cached for x in lay]
