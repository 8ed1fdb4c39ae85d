"""Before the GPU: the memory-bound batches' kernels, exactly as exported, run in the CPU PTX
interpreter (factory.ptxsim) at small odd shapes and are compared with the float64 reference.

    .venv/bin/python -m lab.gpujobs.sim_check [--var var/gpujobs] [--only cumsum,bias_grad]

Each candidate of the batch is re-emitted by its family from the schedule the portal stored
for it; the re-emission must be the batch's PTX byte for byte (so what ran here is what the
GPU host gets), then it runs with NaN-poisoned outputs and is judged by the workload's own
tolerances (relative error norm, elementwise atol + rtol, every element finite). The tensor-
core families (matmul, attention) use wgmma and TMA, which the interpreter does not run.
Prints one line per kernel and shape; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lab.gpujobs.make_jobs import DEFAULT_VAR, ROOT, setup_django

BATCHES = ROOT / "lab" / "gpujobs" / "batches"
SHAPES = {
    "cumsum": [{"M": 3, "N": 1027}, {"M": 1, "N": 33}],
    "bias_grad": [{"M": 37, "N": 131}, {"M": 1, "N": 9}],
}
_FILL = {"fp32": (np.float32, np.nan), "bf16": (np.uint16, 0xFFFF), "fp16": (np.uint16, 0xFFFF)}


def check(key: str) -> list[str]:
    from factory import families
    from factory.ptxsim import run_kernel
    from factory.spec import load_manifest, random_inputs, reference, to_float64
    from portal.models import Candidate

    batch = json.loads((BATCHES / f"{key}.json").read_text())
    w = load_manifest(batch["manifest"])
    fam, ir = families.family_for(w)
    failures = []
    for c in batch["candidates"]:
        schedule = Candidate.objects.get(code=c["id"]).schedule
        em = fam.emit(ir, schedule)
        if em.ptx != c["ptx"]:
            failures.append(f"{key} {c['id'][:8]}: re-emitted PTX differs from the batch's")
            print(failures[-1], flush=True)
            continue
        for dims in SHAPES[key]:
            ins = random_inputs(w, dims, 11)
            arrays = dict(ins)
            for o in w.outputs:
                shape = tuple(int(dims[d]) if isinstance(d, str) else d for d in o.shape)
                dt, fill = _FILL[o.dtype]
                arrays[o.name] = np.full(shape, fill, dtype=dt)
            used = {p.name for p in em.params if p.kind == "tensor"}
            out = run_kernel(em, dims, {k: v for k, v in arrays.items() if k in used})
            want = reference(w, ins, dims)
            for o in w.outputs:
                shape = arrays[o.name].shape
                got = np.frombuffer(out[o.name], dtype=arrays[o.name].dtype).reshape(shape)
                got = to_float64(got, o.dtype)
                ref = np.asarray(want[o.name], dtype=np.float64).reshape(shape)
                tol = w.tolerance[o.dtype]
                rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
                finite = bool(np.isfinite(got).all())
                outside = int((~(np.abs(got - ref) <= tol.atol + tol.rtol * np.abs(ref))).sum())
                ok = finite and rel <= tol.rel_norm and outside == 0
                line = (
                    f"{key} {c['id'][:8]} {c['entry']} at {dims}: {o.name} rel. err {rel:.2e} "
                    f"(tolerance {tol.rel_norm:g}), {outside} elements outside atol+rtol, "
                    f"{'all finite' if finite else 'NOT all finite'} -> {'ok' if ok else 'FAIL'}"
                )
                print(line, flush=True)
                if not ok:
                    failures.append(line)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--var", default=str(DEFAULT_VAR))
    ap.add_argument("--only", default=",".join(SHAPES))
    args = ap.parse_args(argv)
    setup_django(Path(args.var))
    failures = []
    for key in args.only.split(","):
        failures += check(key)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
