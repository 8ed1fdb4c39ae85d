"""One-off: short rows (LayerNorm 16384x768, softmax 16384x1000), the register-held layouts of
the schedule space at up to 128 threads a row, with and without an occupancy cap, each family's
own variants (LayerNorm: one-pass mean and variance, weight loaded early; softmax: online).

    python3 bench/results/2026-12-04-h200-small/emit_sweep.py DIR layernorm:16384x768,...
"""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su
from factory.schedules import default_schedule, space


def cands(ir, dims, limit=999):
    fm = default_schedule(ir, dims).fast_math
    out = []
    for s in space(ir, [dims]):
        if (
            s.mode != "cached"
            or s.threads_per_row > 128
            or s.fast_math != fm
            or s.col_groups != 1
            or s.load_hint != "nc"
            or s.store_hint != "none"
            or s.prefetch_rows
            or s.min_threads_per_sm not in (0, 2048)
            or not s.keep_intermediates
        ):
            continue
        if s.early_cols and (s.moments or s.min_threads_per_sm):
            continue
        out.append(s)
    return [default_schedule(ir, dims)] + out


su.candidate_schedules = cands
import bench.probe_tail as pt  # noqa: E402

pt.CASES[:] = [(c.split(":")[0], *map(int, c.split(":")[1].split("x"))) for c in sys.argv[2].split(",")]
pt.emit_to(Path(sys.argv[1]))
