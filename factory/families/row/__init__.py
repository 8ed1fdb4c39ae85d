"""The row family: elementwise operators and reductions along the last axis, one row per group
of threads (a warp, several warps, or a few lanes for short rows).

- `ir`: lowering a workload onto rows (`lower`, `KernelIR`); refuses anything else.
- `schedules`: the layout (`Schedule`), its space and its one validity predicate (`is_valid`).
- `seeds`: the screened starting layouts per shape.
- `kernel`: the emitter (`RowKernel`).
- `costmodel`: features of a layout at a shape; `baselines`: the torch-side baselines.
"""

from __future__ import annotations

from factory.emit.ptx import EmitError
from factory.families.base import Family, Roofline, io_bytes
from factory.families.row import costmodel as _costmodel
from factory.families.row import moves as _moves
from factory.families.row.ir import lower
from factory.families.row.schedules import (
    LATE_DEFAULTS,
    TAG_LEGEND,
    Schedule,
    default_schedule,
    fits_job,
    is_valid,
    space,
)
from factory.families.row.seeds import candidate_schedules, compile_reports, recapped

ARCHS = ("sm_90", "sm_100")


def emit(ir, schedule: Schedule, arch: str = "sm_90"):
    """Render `ir` with `schedule` for `arch` ("sm_90" or "sm_100")."""
    from factory.families.row.kernel import RowKernel

    if arch not in ARCHS:
        raise EmitError(f"no row emitter for {arch}; known: {', '.join(ARCHS)}")
    return RowKernel(ir, schedule, arch).render()


# Schedule fields that follow from the rest of the layout and the job's shapes (fit_tail), so not
# part of which layout a record names. One value is a choice, not a fit: a row held in registers
# walked "shifted" (shifted_twin) is the twin of the same layout fitted "strided", and either
# can be the faster, so the two name different layouts.
_FITTED = ("tail", "flat")
_ABSENT = object()


def canonical(schedule: dict) -> dict:
    """`schedule` without fields at their late-added defaults (LATE_DEFAULTS) or fitted to the
    job's shapes, but for a register-held row's chosen "shifted" tail."""
    chosen = schedule.get("tail") == "shifted" and schedule.get("mode") == "cached"
    return {
        k: v
        for k, v in schedule.items()
        if LATE_DEFAULTS.get(k, _ABSENT) != v and (k not in _FITTED or (chosen and k == "tail"))
    }


def scalar_access_note(schedule: dict) -> str | None:
    # Shifted rows put a per-column vector (a norm's weight) at the row's alignment, which
    # changes from row to row: its elements move one by one by design.
    if schedule.get("tail") == "shifted":
        return "shifted tail: per-column elements by design"
    return None


def label(schedule: dict) -> str:
    """The layout's tag; a model's edit of that layout's kernel adds its digest."""
    edit = schedule.get("model_edit")
    base = Schedule.from_dict({k: v for k, v in schedule.items() if k != "model_edit"}).tag()
    return f"{base} + model edit {edit}" if edit else base


def roofline(workload, dims: dict) -> Roofline:
    return Roofline(bytes=io_bytes(workload, dims))


FAMILY = Family(
    name="row",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=default_schedule,
    seeds=candidate_schedules,
    fits=fits_job,
    space_fits=True,
    reports=compile_reports,
    recap=recapped,
    schedule_from_dict=Schedule.from_dict,
    canonical=canonical,
    label=label,
    legend=TAG_LEGEND,
    features=_costmodel.features,
    feature_fields=_costmodel.LAYOUT_FIELDS,
    roofline=roofline,
    baselines=(
        "torch_eager",
        "torch_compile",
        "torch_compile_max_autotune",
        "triton",
        "liger",
    ),
    baselines_module="factory.families.row.baselines",
    split_dims=lambda ir: (ir.row_dim,),
    min_warps_per_sm=12,
    scalar_access_note=scalar_access_note,
    layout_fields=_moves.LAYOUT_FIELDS,
    moves=_moves.reshapes,
)

__all__ = ["FAMILY", "Schedule", "lower"]
