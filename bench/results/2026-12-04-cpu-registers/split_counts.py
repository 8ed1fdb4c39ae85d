"""One-off, CPU only: registers, spill bytes and SASS instructions (the whole kernel, every
path as written) of layouts with and without `split_paths` (one copy of the row's code per
path). Needs nvdisasm (NVDISASM=path).

    NVDISASM=.../nvdisasm python3 split_counts.py OUT.json op:MxN:tag ...
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_counts as sc  # noqa: E402

from factory.compile import compile_ptx  # noqa: E402
from factory.emit import emit  # noqa: E402
from factory.ir import lower  # noqa: E402
from factory.schedules import is_valid, space  # noqa: E402
from factory.spec import load_catalogue  # noqa: E402


def main(out, items):
    cat = load_catalogue()
    rows = []
    for item in items:
        op, shape, tag = item.split(":")
        m, n = map(int, shape.split("x"))
        ir = lower(cat[op])
        dims = {ir.row_dim: n, **{d: m for d in ir.batch_dims}}
        s = next(s for s in space(ir, [dims]) if s.tag() == tag)
        row = {"op": op, "shape": shape, "tag": tag}
        for name, sch in (("joined", s), ("split", replace(s, split_paths=True))):
            assert is_valid(ir, sch, dims)[0]
            em = emit(ir, sch)
            r = compile_ptx(em.ptx)
            row[name] = {
                "registers": r.registers,
                "spill_store_bytes": r.spill_store_bytes,
                "sass_whole_kernel": len(sc.sass_of(r.cubin, em.entry)),
            }
        rows.append(row)
        print(row, flush=True)
    Path(out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
