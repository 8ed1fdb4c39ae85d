"""Rows shorter than a warp's reach held by half a warp (or a quarter): at 512 columns
torch.compile runs one warp a block over two rows at once, each lane four 16-byte loads of x
in flight, and leads our one-warp rows by 2-3% on the H100. The validity predicate kept such
rows on a whole warp ("fills a warp's 16-byte chunks past half"); this emits the sub-warp
layouts past it, at several rows a block and register caps, beside the default and its
neighbours in threads per row (no spills; every kernel is verified before timing).

    PYTHONPATH=. python3 bench/results/2026-12-06-h200-subwarp/emit_subwarp.py OUT
"""

import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_set

CASES = [
    ("rmsnorm", 65536, 512),
    ("layernorm", 65536, 512),
    ("softmax", 65536, 512),
    ("add_rmsnorm", 65536, 512),
    ("rmsnorm", 65536, 768),
    ("layernorm", 65536, 768),
    ("rmsnorm", 32768, 1024),
    ("layernorm", 32768, 1024),
    ("rmsnorm", 131072, 256),
    ("layernorm", 131072, 256),
]


def variants(ir, base, dims):
    n = dims[ir.row_dim]
    out = [base, replace(base, min_threads_per_sm=1280)]
    v = base.vec_elems
    for t in (8, 16, 32):
        c = -(-n // (t * v))
        if c > 8:
            continue
        for r in (1, 2, 4, 8, 16):
            if t * r < 32 or t * r > 256:
                continue
            for cap in (0, 1024, 1280):
                out.append(
                    replace(
                        base, threads_per_row=t, chunks=c, rows_per_block=r, min_threads_per_sm=cap
                    )
                )
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, variants, valid_only=False)
