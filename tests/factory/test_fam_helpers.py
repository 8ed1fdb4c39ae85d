"""Shared by the issue-50 family tests: run a family's kernel in factory.ptxsim on the CPU and
compare with the float64 reference under the workload's tolerance (exactly for index outputs)."""

from __future__ import annotations

import numpy as np

from factory.ptxsim import run_kernel
from factory.spec import random_inputs, reference, to_float64

_FILL = {"fp32": (np.float32, np.nan), "bf16": (np.uint16, 0xFFFF), "fp16": (np.uint16, 0xFFFF),
         "int32": (np.int32, -7), "int64": (np.int64, -7)}  # fmt: skip
_VIEW = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16, "int32": np.int32,
         "int64": np.int64}  # fmt: skip


def run_and_check(family, w, schedule, dims, seed=0, inputs=None):
    """Small shapes take layouts too wide for them (to reach clusters and thread rows), so
    the schedule is checked well formed (dims=None), not fitted to the shape."""
    ir = family.lower(w)
    ok, why = family.is_valid(ir, schedule, None)
    assert ok, why
    em = family.emit(ir, schedule)
    ins = random_inputs(w, dims, seed) | (inputs or {})
    arrays = dict(ins)
    for o in w.outputs:
        shape = tuple(int(dims[d]) if isinstance(d, str) else d for d in o.shape)
        dt, fill = _FILL[o.dtype]
        arrays[o.name] = np.full(shape, fill, dtype=dt).view(_VIEW[o.dtype])
    used = {p.name for p in em.params if p.kind == "tensor"}
    out = run_kernel(em, dims, {k: v for k, v in arrays.items() if k in used})
    ref = reference(w, ins, dims)
    for o in w.outputs:
        shape = arrays[o.name].shape
        got = np.frombuffer(out[o.name], dtype=arrays[o.name].dtype).reshape(shape)
        got = to_float64(got, o.dtype)
        want = np.asarray(ref[o.name], dtype=np.float64).reshape(shape)
        if o.dtype in ("int32", "int64"):
            assert (got == want).all(), f"{o.name}: {int((got != want).sum())} indices differ"
            continue
        tol = w.tolerance[o.dtype]
        assert np.isfinite(got).all(), f"{o.name}: unwritten or non-finite elements"
        rel = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
        assert rel <= tol.rel_norm, f"{o.name}: relative error {rel:.2e}"
        bad = ~(np.abs(got - want) <= tol.atol + tol.rtol * np.abs(want))
        assert not bad.any(), f"{o.name}: {int(bad.sum())} elements out of tolerance"
    return em
