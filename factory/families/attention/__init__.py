"""The attention family: a FlashAttention-style forward on Hopper (sm_90a) for
`attention(q, k, v, score=..., mask=...)` (factory.spec.attention), with the customer's score
expression applied before the online softmax and the mask's band turned into skipped KV tiles.

- `ir`: AttentionIR, the lowering and the mask's band analysis.
- `schedule`: AttentionSchedule, the one validity predicate, space, default and seeds.
- `emit`: the TMA + mbarrier + wgmma emitter; `tiling`: its tile arithmetic and a numpy model.
- `features`: the unmasked work, the analytic estimate, cost-model features, the roofline.
- `baselines`: SDPA back ends, materialised attention, flex_attention (torch-side).

The emitter is imported when first used.
"""

from __future__ import annotations

from factory.families.attention import baselines as _baselines
from factory.families.attention import features as _features
from factory.families.attention import ir as _ir
from factory.families.attention import schedule as _schedule
from factory.families.attention.schedule import LAYOUT_FIELDS, AttentionSchedule
from factory.families.attention.wholeprog import compile_reports
from factory.families.base import Family

ARCH = "sm_90a"


def emit_kernel(ir, schedule, arch: str = ARCH):
    """Render `ir` with `schedule` (a dataclass or its dict) for Hopper."""
    from factory.emit.ptx import EmitError
    from factory.families.attention.emit import emit as _emit

    if arch not in ("sm_90", "sm_90a"):
        raise EmitError(f"no attention emitter for {arch}")
    if isinstance(schedule, dict):
        schedule = AttentionSchedule.from_dict(schedule)
    return _emit(ir, schedule, ARCH)


def canonical(schedule: dict) -> dict:
    return {k: v for k, v in schedule.items() if k != "problem"}


def label(schedule: dict) -> str:
    return AttentionSchedule.from_dict(schedule).label()


def moves(schedule) -> list:
    s = (
        schedule
        if isinstance(schedule, AttentionSchedule)
        else AttentionSchedule.from_dict(dict(schedule))
    )
    out = []
    if s.block_n == 128:
        out.append(({"block_n": 64, "stages": min(4, s.stages + 1)}, "narrower KV tile, deeper"))
    else:
        out.append(({"block_n": 128, "stages": max(2, s.stages - 1)}, "wider KV tile"))
    out.append(({"block_m": 192 - s.block_m}, "one or two consumer warpgroups"))
    return out


LEGEND = (
    "fa 128x128 s2 c2: a FlashAttention-style forward, query rows x keys per tile, s = K/V "
    "stages in the ring, c = consumer warpgroups of 64 query rows; pv64: P V as n64 wgmmas"
)

FAMILY = Family(
    name="attention",
    lower=_ir.lower,
    space=_schedule.space,
    is_valid=_schedule.verdict,
    emit=emit_kernel,
    default_schedule=_schedule.default_schedule,
    seeds=_schedule.seeds,
    fits=_schedule.fits,
    space_fits=True,
    reports=compile_reports,
    schedule_from_dict=AttentionSchedule.from_dict,
    canonical=canonical,
    label=label,
    legend=LEGEND,
    features=_features.features,
    feature_fields=_features.FEATURE_FIELDS,
    roofline=_features.roofline,
    baselines=_baselines.WORKER_BASELINES,
    baselines_module="factory.families.attention.baselines",
    min_warps_per_sm=4,
    layout_fields=LAYOUT_FIELDS,
    moves=moves,
)

__all__ = ["FAMILY", "AttentionSchedule", "emit_kernel"]
