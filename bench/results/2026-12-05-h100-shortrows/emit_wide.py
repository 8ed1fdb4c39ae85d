"""One-off: a wider slice of the layouts for rows under a warp than the starting layouts of
run1, emitted into DIR (a probe_tail --sets folder), with the layout a job took there before
a330e1e (a warp per row, four rows a block, its only candidate) as the control.

    python3 bench/results/2026-12-05-h100-shortrows/emit_wide.py DIR

Per case: every layout of the space that differs from the default only in threads per row,
rows per block, chunks, tail and a register cap of 0 or 2048 threads, that compiles without
spills; plus a warp per row at 4 and 8 rows a block (outside the space: it fills under half).
Now a call of bench.emit_slice (which run2 predates: the same selection). The default at
LayerNorm 65536x100 has changed since (8-byte chunks, 2026-12-05-h100-narrow), so that case
now emits another slice.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.emit_slice import main, parse_cases  # noqa: E402

CASES = (
    "rmsnorm:262144x128,add_rmsnorm:262144x128,layernorm:65536x100,layernorm:65536x128,"
    "softmax:262144x64"
)

if __name__ == "__main__":
    main(Path(sys.argv[1]), parse_cases(CASES), caps=(0, 2048), warp_rows=(4, 8))
