"""One-off: rows of odd widths held in registers (LayerNorm, RMSNorm, add+RMSNorm at 5000
and 4999 columns), the register-held layouts of the schedule space at 128-512 threads a row
that waste the fewest places (the fewest chunks that hold the row), one or two rows a block,
16-byte vectors, plain stores, no prefetch, no persistent grid, one block a cluster, every
occupancy cap but 2048 threads an SM, each family's variants (one-pass mean and variance,
weight loaded early); with a third argument, only the layouts of those tails (tag letters: y
shifted, z strided, u vectors).

    python3 bench/results/2026-12-04-h200-odd/emit_odd.py DIR layernorm:16384x5000,... [y]
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su
from factory.schedules import default_schedule, space


def cands(ir, dims):
    fm = default_schedule(ir, dims).fast_math
    out = [default_schedule(ir, dims)]
    for s in space(ir, [dims]):
        if (
            s.mode != "cached"
            or not 128 <= s.threads_per_row <= 512
            or s.chunks != math.ceil(math.ceil(dims[ir.row_dim] / 8) / s.threads_per_row)
            or s.vec_elems != 8
            or s.rows_per_block > 2
            or s.min_threads_per_sm == 2048
            or s.col_groups != 1
            or s.col_hint != "nc"
            or s.fast_math != fm
            or s.load_hint != "nc"
            or s.store_hint != "none"
            or s.prefetch_rows
            or s.persistent_blocks_per_sm
            or s.cluster_blocks != 1
            or s.acc_split != 1
            or s in out
        ):
            continue
        out.append(s)
    return out


def tails(ir, dims):
    return [s for s in cands(ir, dims) if s.tag().split("_")[0][-1] in sys.argv[3]]


su.candidate_schedules = tails if len(sys.argv) > 3 else cands
import bench.probe_tail as pt  # noqa: E402

pt.CASES[:] = [
    (c.split(":")[0], *map(int, c.split(":")[1].split("x"))) for c in sys.argv[2].split(",")
]
pt.emit_to(Path(sys.argv[1]))
