"""Why a warp a row of one chunk a lane (inductor's layout at 200 columns) is slow in ours at
rows it does not fill: the same layout at 256 (whole), 248 and 200 (every lane of the warp takes
the tail path), under each tail, joined or split per path, one, two and four rows a thread;
150 kernels, written on the CPU, then `OUT=DIR bash bench/gpu_pending.sh tailwarp`:

    PYTHONPATH=. python3 bench/results/2026-12-06-cpu-tailwarp/emit_tailwarp.py .tailptx/tw
"""

import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_set

CASES = [(op, 131072, n) for n in (256, 248, 200) for op in ("layernorm", "rmsnorm")]


def variants(ir, base, dims):
    w = replace(
        base,
        threads_per_row=32,
        chunks=1,
        rows_per_block=1,
        split_paths=False,
        min_threads_per_sm=0,
    )
    out = [base]
    for k, r in ((1, 4), (4, 1), (2, 2)):
        for tail in ("vectors", "stream", "elements", "strided"):
            for split in (False, True):
                out.append(
                    replace(w, rows_per_thread=k, rows_per_block=r, tail=tail, split_paths=split)
                )
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, variants, valid_only=False)
