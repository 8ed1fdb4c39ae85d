"""The matmul family: tensor-core matrix products with the epilogue fused in registers (Hopper,
sm_90a): `y = epilogue(x @ w.T)`, or two products sharing the left operand (SwiGLU).

- `ir`: GemmIR, what the emitter consumes; `lower`: a workload onto it (refuses the rest).
- `schedule`: GemmSchedule and the one validity predicate; `space`: the space, default and seeds.
- `emit`: the wgmma/TMA emitter; `tiling`: its index arithmetic in Python.
- `features`: cost-model features, the analytic estimate and the roofline.
- `baselines`: the torch-side baselines (cuBLAS through torch, torch.compile, a Triton matmul).

The emitter is imported when first used, so the record loads while it is being written.
"""

from __future__ import annotations

from factory.emit.hopper import compile_reports
from factory.families.base import Family
from factory.families.matmul import features as _features
from factory.families.matmul import lower as _lower_mod
from factory.families.matmul import space as _space
from factory.families.matmul.space import LAYOUT_FIELDS, Schedule

# No name here is a submodule's name (emit, lower, space, ...): `from factory.families.matmul
# import emit` is the emitter's module, whatever was imported first.

ARCH = "sm_90a"
ARCHS = ("sm_90", "sm_90a")


def emit_kernel(ir, schedule, arch: str = ARCH):
    """Render `ir` with `schedule` for Hopper; "sm_90" (a workload's target) means its
    architecture-specific variant sm_90a, which wgmma and setmaxnreg need."""
    from factory.emit.ptx import EmitError
    from factory.families.matmul.emit import emit as _emit

    if arch not in ARCHS:
        raise EmitError(f"no matmul emitter for {arch}; known: {', '.join(ARCHS)}")
    if isinstance(schedule, dict):
        schedule = Schedule.from_dict(schedule)
    return _emit(ir, schedule, ARCH)


# Fields that name the problem, not the layout: left out of evidence keys.
_NOT_LAYOUT = ("problem",)


def canonical(schedule: dict) -> dict:
    return {k: v for k, v in schedule.items() if k not in _NOT_LAYOUT}


def label(schedule: dict) -> str:
    return Schedule.from_dict(schedule).label()


LEGEND = (
    "wgmma 128x256x64 s4 c2 pers g8: the tensor-core kind, the CTA's output tile (rows x columns "
    "x k per stage), s = shared-memory stages in the load ring, c = consumer warpgroups, pers = "
    "persistent CTAs walking tiles in groups of g tile rows (L2 reuse); cl = cluster shape, "
    "sk = split-K, ts = epilogue staged and stored by TMA (columns), cpa = A and B loaded by "
    "cp.async chunks instead of TMA boxes"
)


def moves(schedule) -> list:
    """Steps of several fields at once: a wider or narrower tile keeps the shared-memory ring
    within its limit by trading stages; halving tile_m goes with one consumer warpgroup; the
    TMA-store epilogue goes with the cooperative persistent kernel (no ping-pong, split-K or
    cluster), so a move to any of those drops it."""
    s = schedule if isinstance(schedule, Schedule) else Schedule.from_dict(dict(schedule))
    out = []
    if s.tile_n <= 128:
        out.append(
            ({"tile_n": s.tile_n * 2, "stages": max(2, s.stages - 1)}, "wider tile, one stage less")
        )
    if s.tile_n >= 128:
        out.append(
            (
                {"tile_n": s.tile_n // 2, "stages": min(8, s.stages + 2)},
                "narrower tile, deeper ring",
            )
        )
    if s.consumers == 2:
        out.append(({"consumers": 1, "tile_m": 64}, "one consumer warpgroup, 64-row tiles"))
    else:
        out.append(({"consumers": 2, "tile_m": 128}, "two consumer warpgroups, 128-row tiles"))
    grid = {"persistent": not s.persistent}
    if s.persistent and s.tma_store and s.consumers == 2:
        grid["tma_store"] = 0  # staged with two consumers only in the grouped persistent order
    out.append((grid, "persistent CTAs" if not s.persistent else "one CTA per tile"))
    if getattr(s, "pingpong", None) is not None:
        if s.pingpong:
            out.append(({"pingpong": False}, "consumers share each tile"))
        else:
            out.append(
                (
                    {
                        "pingpong": True,
                        "consumers": 2,
                        "tile_m": 128,
                        "persistent": True,
                        "tma_store": 0,
                    },
                    "consumers take turns, one's epilogue beside the other's main loop",
                )
            )
    out.append(
        (
            {"cluster_m": 1 if s.cluster_m == 2 else 2, "tma_store": 0, "load": "tma"},
            "B multicast to a 2x1 cluster",
        )
    )
    if s.split_k == 1:
        out.append(
            (
                {
                    "split_k": 4,
                    "persistent": False,
                    "pingpong": False,
                    "cluster_m": 1,
                    "tma_store": 0,
                },
                "split K over a cluster of 4 CTAs per tile (few tiles, long K)",
            )
        )
    else:
        out.append(({"split_k": 1, "persistent": True}, "one CTA per tile's whole K"))
    if getattr(s, "load", None) is not None:
        if s.load == "cp_async":
            out.append(({"load": "tma"}, "A and B loaded by TMA boxes"))
        else:
            out.append(
                (
                    {"load": "cp_async", "cluster_m": 1},
                    "A and B loaded by the producer warpgroup's cp.async chunks",
                )
            )
    if s.tma_store:
        out.append(({"tma_store": 0}, "epilogue stored from registers"))
    else:
        out.append(
            (
                {
                    "tma_store": 128,
                    "pingpong": False,
                    "split_k": 1,
                    "cluster_m": 1,
                    "persistent": True,
                },
                "epilogue staged in shared memory and stored by TMA",
            )
        )
    return out


def roofline(workload, dims: dict):
    return _features.roofline(workload, dims)


_EXTRA = {}
if "min_warps_per_sm" in Family.__dataclass_fields__:
    # compute-bound: one CTA of 8 or 12 warps per SM is the design, not a lack of memory traffic
    _EXTRA["min_warps_per_sm"] = 4

FAMILY = Family(
    name="matmul",
    lower=_lower_mod.lower,
    space=_space.space,
    is_valid=_space.verdict,
    emit=emit_kernel,
    default_schedule=_space.default_schedule,
    seeds=_space.seeds,
    fits=_space.fits,
    space_fits=True,
    reports=compile_reports,
    recap=None,
    schedule_from_dict=Schedule.from_dict,
    canonical=canonical,
    label=label,
    legend=LEGEND,
    features=_features.features,
    feature_fields=_features.FEATURE_FIELDS,
    roofline=roofline,
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune", "triton"),
    baselines_module="factory.families.matmul.baselines",
    split_dims=lambda ir: (),
    layout_fields=LAYOUT_FIELDS,
    moves=moves,
    **_EXTRA,
)

__all__ = ["FAMILY", "Schedule", "emit_kernel"]
