"""Persistent grids that fill the SM for short rows: k blocks an SM up to 16 (the space stops
at k*threads <= 2048 with k in 2..8), registers capped so that the k blocks stay resident,
with and without the next row's prefetch and the columns held across rows (early_cols; held
in registers only under a warp a row). Beside the default and its 1536-thread cap.

    PYTHONPATH=. python3 emit_persist.py OUT
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

from bench.probe_tail import write_kernel
from factory.compile import compile_ptx
from factory.emit import emit
from factory.ir import lower
from factory.schedules import default_schedule, is_valid
from factory.spec import load_catalogue

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


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    cat = load_catalogue()
    manifest, cases, why = [], [], {}
    for op, m, n in CASES:
        ir = lower(cat[op])
        dims = {ir.row_dim: n, **{d: m for d in ir.batch_dims}}
        base = default_schedule(ir, dims)
        for s in variants(base):
            if s.early_cols and not any(t.role == "col" for t in ir.inputs):
                continue
            ok, reason = is_valid(ir, s, dims)
            if not ok:
                why[f"{op} {s.tag()}"] = reason
                continue
            em = emit(ir, s)
            rep = compile_ptx(em.ptx)
            if rep.ok and not rep.spill_store_bytes:
                manifest.append(write_kernel(out, op, m, n, dims, s, em, rep))
            else:
                why[f"{op} {s.tag()}"] = f"spills {rep.spill_store_bytes}" if rep.ok else "fails"
        cases.append(f"{op}:{m}x{n}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "cases").write_text(",".join(cases))
    print(f"{len(manifest)} kernels written to {out}")
    for k, v in why.items():
        print("  not emitted:", k, "-", v)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
