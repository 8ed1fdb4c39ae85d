"""Persistent grids that fill the SM for short rows: k blocks an SM up to 16 (the space stops
at k*threads <= 2048 with k in 2..8), registers capped so that the k blocks stay resident,
with and without the next row's prefetch and the columns held across rows (early_cols; held
in registers only under a warp a row). Beside the default and its 1536-thread cap.

    PYTHONPATH=. python3 emit_persist.py OUT
"""

import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_set

CASES = [
    ("layernorm", 1048576, 100),
    ("rmsnorm", 1048576, 100),
    ("softmax", 1048576, 100),
    ("layernorm", 65536, 512),
    ("layernorm", 65536, 1000),
]


def variants(base):
    out = [base, replace(base, min_threads_per_sm=1536)]
    if base.split_paths:  # (a prefetched row needs the joined kernel)
        return out + [x for x in variants(replace(base, split_paths=False)) if x != base]
    tb = base.threads_per_row * base.rows_per_block
    for k in (4, 8, 12, 16):
        if k * tb > 2048:
            continue
        for prefetch in (False, True):
            for early in (False, True):
                for cap in {0, k * tb} if k * tb >= 768 else {0}:
                    out.append(
                        replace(
                            base,
                            persistent_blocks_per_sm=k,
                            prefetch_rows=prefetch,
                            early_cols=early,
                            min_threads_per_sm=cap,
                        )
                    )
    return list(dict.fromkeys(out))


def layouts(ir, base, dims):
    cols = any(t.role == "col" for t in ir.inputs)
    return [s for s in variants(base) if cols or not s.early_cols]


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, layouts)
