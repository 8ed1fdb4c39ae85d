"""Emit, for `bench.probe_tail --sets`, the kernels a job of two row lengths (4096 and 8192, as
the catalogue's samples) can now time (CPU only). Three sets, each written at both shapes:
- `per4096`: the screened seeds at 16384x4096 (`factory.seeds`): at 8192 they take the kernel's
  long-row path (what `schedules.fits_job` now admits);
- `per8192`: the screened seeds at 16384x8192: at 4096 they leave half their chunks idle;
- `stream`: streaming layouts valid at both (all that such a job could time before).
The fastest of each set per shape, beside torch.compile, says what one kernel for both shapes
costs against a kernel per row length.

    PYTHONPATH=. python3 emit_product.py DIR
"""

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from factory.compile import compile_ptx
from factory.emit import emit
from factory.ir import lower
from factory.schedules import default_schedule, fit_tail, is_valid
from factory.seeds import candidate_schedules
from factory.spec import load_catalogue

OPS = ("rmsnorm", "layernorm", "softmax")
SHAPES = ({"M": 16384, "N": 4096}, {"M": 16384, "N": 8192})


def sets(ir):
    d4, d8 = SHAPES
    base = default_schedule(ir, d8)
    stream = [
        fit_tail(ir, replace(base, mode="stream", threads_per_row=t, chunks=c), list(SHAPES))
        for t, c in ((128, 4), (256, 2), (256, 4), (512, 2), (512, 1))
    ]
    return {
        "per4096": [fit_tail(ir, s, list(SHAPES)) for s in candidate_schedules(ir, d4)],
        "per8192": [fit_tail(ir, s, list(SHAPES)) for s in candidate_schedules(ir, d8)],
        "stream": [s for s in stream if all(is_valid(ir, s, d)[0] for d in SHAPES)],
    }


def main(out: Path):
    cat = load_catalogue()
    manifests: dict[str, list] = {}
    for op in OPS:
        ir = lower(cat[op])
        for name, scheds in sets(ir).items():
            folder = out / name
            folder.mkdir(parents=True, exist_ok=True)
            for s in dict.fromkeys(scheds):
                em = emit(ir, s)
                rep = compile_ptx(em.ptx)
                if rep.spill_store_bytes or not rep.ok:
                    continue
                for dims in SHAPES:
                    dims = {ir.row_dim: dims["N"], **{d: dims["M"] for d in ir.batch_dims}}
                    fname = f"{op}-{s.tag()}.ptx"
                    (folder / fname).write_text(em.ptx)
                    manifests.setdefault(name, []).append(
                        {
                            "op": op,
                            "dims": dims,
                            "tag": s.tag(),
                            "schedule": s.to_dict(),
                            "file": fname,
                            "entry": em.entry,
                            "params": [asdict(p) for p in em.params],
                            "launch": asdict(em.launch),
                            "registers": rep.registers,
                            "spill_store_bytes": rep.spill_store_bytes,
                        }
                    )
    for name, rows in manifests.items():
        (out / name / "manifest.json").write_text(json.dumps(rows, indent=1))
        print(name, len(rows) // 2, "kernels")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
