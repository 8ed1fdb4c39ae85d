"""Several rows a thread (rows_per_thread) at short rows, beside the default: what inductor
runs at 131072x200 bf16 is one warp a block holding four rows, a lane one 16-byte chunk of each
(XBLOCK 4), and at 65536x512 two rows (XBLOCK 2). Each case: the default, its register cap, a
warp a row with 2 or 4 rows a thread at 1, 2 and 4 row groups a block, and 16 threads a row
with 2 rows a thread. Spilling kernels are left out; every kernel is verified before timing.

    PYTHONPATH=. python3 emit_rows_per_thread.py OUT
"""

import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_set
from factory.schedules import fewest_chunks, fit_tail

CASES = [
    (op, m, n)
    for (m, n) in ((131072, 160), (131072, 200), (131072, 256), (65536, 512))
    for op in ("layernorm", "rmsnorm", "softmax", "add_rmsnorm")
]


def variants(ir, base, dims):
    n = dims[ir.row_dim]
    v = base.vec_elems
    out = [base, replace(base, min_threads_per_sm=1024)]
    warp = replace(base, threads_per_row=32, chunks=fewest_chunks(n, 32, v), split_paths=False)
    for k in (2, 4):
        for r in (1, 2, 4):
            out.append(fit_tail(ir, replace(warp, rows_per_block=r, rows_per_thread=k), [dims]))
    if n <= 256:
        half = replace(base, threads_per_row=16, chunks=fewest_chunks(n, 16, v), rows_per_block=8)
        out.append(fit_tail(ir, replace(half, rows_per_thread=2), [dims]))
        out.append(fit_tail(ir, replace(half, rows_per_thread=2, rows_per_block=2), [dims]))
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, variants, valid_only=True)
