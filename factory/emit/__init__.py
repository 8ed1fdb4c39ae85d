"""PTX emitters: render a `KernelIR` with a `Schedule` into PTX text plus its binding.

`emit(ir, schedule)` returns an `Emitted` (ptx, entry, params as KernelParam list, launch as
shape arithmetic over the dims) or raises `EmitError` saying what cannot be rendered. Families:
"row" (factory.emit.rowkernel) covers elementwise, row reductions, multi-stage norms, online
softmax/logsumexp and per-row gathers.
"""

from __future__ import annotations

from factory.emit.ptx import EmitError
from factory.emit.rowkernel import Emitted, RowKernel
from factory.ir import KernelIR
from factory.schedules import Schedule

ARCHS = ("sm_90", "sm_100")

__all__ = ["ARCHS", "EmitError", "Emitted", "emit"]


def emit(ir: KernelIR, schedule: Schedule, arch: str = "sm_90") -> Emitted:
    """Render `ir` with `schedule` for `arch` ("sm_90" or "sm_100")."""
    if arch not in ARCHS:
        raise EmitError(f"no emitter for {arch}; known: {', '.join(ARCHS)}")
    if schedule.family == "row":
        return RowKernel(ir, schedule, arch).render()
    raise EmitError(f"no emitter for schedule family {schedule.family!r}")
