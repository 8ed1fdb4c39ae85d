"""Emit the kernels for the next H200 run of this folder's questions (CPU only): at the odd
widths and two suite shapes, the register-held layouts of 128 and 256 threads a row with the
fewest chunks, one row a block, uncapped or capped for 768 / 1024 threads an SM, with and
without the weight loaded early and (LayerNorm) one-pass moments, each with the row's tail as
`fit_tail` and `shifted_twin` give it (at suite shapes also the last suite plan's layouts, as
bench.probe_tail adds them). `split`: each with split_paths. Kernels that
spill are left out (the screen would reject them). Writes DIR/manifest.json for
`bench.probe_tail --sets` (PYTHONPATH picks the emitter: a checkout with moments.patch applied,
and its one-line variant, give the moments sets: one-pass layouts only, joined or split).

    python3 emit_next.py DIR joined|split|moments|moments_split
"""
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import bench.probe_tail as pt
import bench.suite as su
from factory.schedules import default_schedule, fit_tail, is_valid, shifted_twin, space

CASES = [
    ("layernorm", 16384, 5000),
    ("layernorm", 16384, 4999),
    ("layernorm", 16384, 4096),
    ("layernorm", 16384, 8192),
    ("rmsnorm", 16384, 5000),
    ("rmsnorm", 16384, 4999),
    ("add_rmsnorm", 16384, 5000),
    ("add_rmsnorm", 16384, 4999),
]


def layouts(ir, dims, variant):
    n = dims[ir.row_dim]
    fm = default_schedule(ir, dims).fast_math
    out = []
    for s in space(ir, [dims]):
        if (
            s.mode != "cached"
            or s.threads_per_row not in (128, 256)
            or s.chunks != math.ceil(n / (8 * s.threads_per_row))
            or s.vec_elems != 8
            or s.rows_per_block != 1
            or s.min_threads_per_sm not in (0, 768, 1024)
            or s.col_groups != 1
            or s.col_hint != "nc"
            or s.fast_math != fm
            or s.load_hint != "nc"
            or s.store_hint != "none"
            or s.prefetch_rows
            or s.persistent_blocks_per_sm
            or s.cluster_blocks != 1
            or s.acc_split != 1
            or (variant.startswith("moments") and not s.moments)
        ):
            continue
        s = fit_tail(ir, s, [dims])
        for t in [s, shifted_twin(ir, s, [dims])]:
            if t is None:
                continue
            if variant in ("split", "moments_split"):
                t = replace(t, split_paths=True)
            if is_valid(ir, t, dims)[0] and t not in out:
                out.append(t)
    return out


def main(out: Path, variant: str) -> None:
    pt.CASES[:] = CASES
    su.candidate_schedules = lambda ir, dims: layouts(ir, dims, variant)
    pt.emit_to(out)
    book = json.loads((out / "manifest.json").read_text())
    kept = [r for r in book if r["spill_store_bytes"] == 0]
    for r in book:
        if r not in kept:
            (out / r["file"]).unlink()
    (out / "manifest.json").write_text(json.dumps(kept, indent=1))
    print(f"{len(kept)} of {len(book)} kept (no spills)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
