"""LayerNorm and RMSNorm at short rows, where torch.compile keeps 3-7% (H100): the default and
its register caps, each with one field changed that shortens the reduction's chain or frees
registers: one-pass moments (w), no kept intermediates (k), early per-column loads (e), split
accumulators (a2), late stores (d), and the 16-thread layout.

    PYTHONPATH=. python3 emit_lnfields.py OUT
"""

import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_set

CASES = [
    ("layernorm", 131072, 160),
    ("layernorm", 131072, 200),
    ("layernorm", 131072, 256),
    ("layernorm", 65536, 512),
    ("rmsnorm", 131072, 200),
    ("rmsnorm", 65536, 512),
]
FIELDS = [
    {},
    {"moments": True},
    {"keep_intermediates": False},
    {"early_cols": True},
    {"acc_split": 2},
    {"late_stores": True},
    {"moments": True, "keep_intermediates": False},
]


def variants(ir, base, dims):
    bases = [base]
    if base.threads_per_row < 32:
        bases.append(
            replace(base, threads_per_row=16, chunks=-(-dims[ir.row_dim] // 128), rows_per_block=8)
        )
    out = []
    for b0 in bases:
        for f in FIELDS:
            for cap in (0, 1024, 1280):
                out.append(replace(b0, min_threads_per_sm=cap, **f))
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, variants, valid_only=True)
