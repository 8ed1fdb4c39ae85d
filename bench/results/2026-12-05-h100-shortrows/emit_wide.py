"""One-off: a wider slice of the layouts for rows under a warp than the starting layouts of
run1, emitted into DIR (a probe_tail --sets folder), with the layout a job took there before
a330e1e (a warp per row, four rows a block, its only candidate) as the control.

    python3 bench/results/2026-12-05-h100-shortrows/emit_wide.py DIR

Per case: every layout of the space that differs from the default only in threads per row,
rows per block, chunks, tail and a register cap of 0 or 2048 threads, that compiles without
spills; plus a warp per row at 4 and 8 rows a block (outside the space: it fills under half).
"""

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.probe_tail import write_kernel  # noqa: E402
from factory.compile import compile_ptx  # noqa: E402
from factory.emit import emit  # noqa: E402
from factory.ir import lower  # noqa: E402
from factory.schedules import default_schedule, space  # noqa: E402
from factory.spec import load_catalogue  # noqa: E402

CASES = [
    ("rmsnorm", 262144, 128),
    ("add_rmsnorm", 262144, 128),
    ("layernorm", 65536, 100),
    ("layernorm", 65536, 128),
    ("softmax", 262144, 64),
]
FREE = ("threads_per_row", "rows_per_block", "chunks", "tail", "min_threads_per_sm")


def main(out: Path) -> None:
    cat = load_catalogue()
    out.mkdir(parents=True, exist_ok=True)
    manifest, cases = [], []
    for op, m, n in CASES:
        ir = lower(cat[op])
        dims = {ir.row_dim: n, **{d: m for d in ir.batch_dims}}
        base = default_schedule(ir, dims)
        fixed = {k: v for k, v in asdict(base).items() if k not in FREE}
        picks = [
            s
            for s in space(ir, [dims])
            if all(getattr(s, k) == v for k, v in fixed.items())
            and s.min_threads_per_sm in (0, 2048)
            and not s.split_paths
        ]
        warp = replace(base, threads_per_row=32, chunks=1)
        picks += [replace(warp, rows_per_block=r) for r in (4, 8)]
        for s in dict.fromkeys(picks):
            em = emit(ir, s)
            rep = compile_ptx(em.ptx)
            if rep.ok and not rep.spill_store_bytes:
                manifest.append(write_kernel(out, op, m, n, dims, s, em, rep))
        cases.append(f"{op}:{m}x{n}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "cases").write_text(",".join(cases))
    print(f"{len(manifest)} kernels written to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
