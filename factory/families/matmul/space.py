"""The matmul family's schedule space: the product of each GemmSchedule field's options, filtered
by the emitter's one validity predicate (`schedule.is_valid`), the default schedule, the seeds a
job starts from and whether a schedule serves every shape of a job.

Seeds come from the shape: its arithmetic intensity and how its tiles fill the 132 SMs (a skinny
M = 128 job wants narrow tiles so that more than a quarter of the SMs have work; a 8192^3 job
wants the widest tile the registers hold), ranked by the analytic estimate of `features`.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, replace

from factory.families.matmul import schedule as _sched
from factory.families.matmul.features import estimate, gemm_dims, problem_text
from factory.families.matmul.ir import GemmIR
from factory.spec import expr as E


@dataclass(frozen=True)
class Schedule(_sched.GemmSchedule):
    """A GemmSchedule that names its family and its problem's dims (for evidence, the cost model
    and the registry); the emitter reads only the GemmSchedule fields."""

    problem: str = ""  # "M,N,K" (",2" with two right operands): see features.problem_text
    family: str = "matmul"

    def tag(self) -> str:
        return self.label()


# Each field's options; the space is their product filtered by is_valid, which keeps what the
# emitter renders and a GPU run has verified (each gated kind has a *_VERIFIED flag in schedule.py:
# 2x1 clusters, split-K with 2 and 4 CTAs a tile, batches and the TMA-store epilogue are verified
# and open). tma_store needs an output tensor map: the GPU worker builds it over the output buffer
# of each run (gpuworker/child.py, PtxEntrant._tensor_map).
# The emitter does not render the mma.sync kind yet: add its option here when it does.
OPTIONS: dict[str, tuple] = {
    "kind": ("wgmma",),
    "consumers": (1, 2),
    "tile_m": (64, 128),
    "tile_n": (64, 96, 128, 160, 192, 208, 224, 256),
    "tile_k": (64,),
    "stages": (2, 3, 4, 5, 6, 7, 8),
    "cluster_m": (1, 2),
    "cluster_n": (1,),
    "group_m": (1, 4, 8, 16),
    "persistent": (True, False),
    "split_k": (1, 2, 4),
    "fast_math": (True, False),
    "pingpong": (False, True),
    "tma_store": (0, 128, 256),
    # cp.async chunks instead of TMA boxes (verified; slower than TMA wherever it was timed, so
    # never the default and ranked by the estimate's charge, features.CP_ASYNC_SLOWDOWN)
    "load": ("tma", "cp_async"),
}

LAYOUT_FIELDS = (
    "tile_m",
    "tile_n",
    "consumers",
    "persistent",
    "pingpong",
    "cluster_m",
    "split_k",
    "tma_store",
    "load",
)
SEEDS_PER_SHAPE = 6


def is_valid(ir: GemmIR, s, dims: dict | None = None) -> str | None:
    """The emitter's predicate: None when `ir` renders with `s` (at `dims`), else the reason."""
    return _sched.is_valid(ir, s, dims)


def verdict(ir: GemmIR, s, dims: dict | None = None) -> tuple[bool, str]:
    """is_valid as the registry's (ok, reason)."""
    why = is_valid(ir, s, dims)
    return why is None, why or ""


def _has_transcendentals(ir: GemmIR) -> bool:
    return any(
        isinstance(n, E.Unary) and n.op not in ("neg", "abs")
        for o in ir.outputs
        for n in E.walk(o.expr)
    )


_CANDIDATES: dict = {}
_LOCK = threading.Lock()  # the caches are shared by the agents' threads


def candidates(ir: GemmIR) -> tuple[Schedule, ...]:
    """Every point of the product of OPTIONS for `ir`, valid or not (fast_math only varies where
    the epilogue has an exp, tanh, ... to approximate)."""
    key = (problem_text(ir), _has_transcendentals(ir))
    hit = _CANDIDATES.get(key)
    if hit is not None:
        return hit
    opts = dict(OPTIONS)
    if not key[1]:
        opts["fast_math"] = (True,)
    known = _sched.GemmSchedule.__dataclass_fields__
    opts = {k: v for k, v in opts.items() if k in known}  # a field the emitter has not (yet)
    names = list(opts)
    out = tuple(
        Schedule(problem=key[0], **dict(zip(names, values, strict=True)))
        for values in itertools.product(*(opts[n] for n in names))
    )
    with _LOCK:
        if len(_CANDIDATES) > 64:
            _CANDIDATES.clear()
        return _CANDIDATES.setdefault(key, out)


_SPACES: dict = {}


def space(ir: GemmIR, dims_list: list[dict]) -> list[Schedule]:
    """Every valid schedule at every shape of `dims_list` (the same objects for the same IR and
    shapes, so the agents describe them once)."""
    key = (ir, tuple(tuple(sorted(d.items())) for d in dims_list))
    hit = _SPACES.get(key)
    if hit is None:
        hit = tuple(
            s
            for s in candidates(ir)
            if is_valid(ir, s) is None and all(is_valid(ir, s, d) is None for d in dims_list)
        )
        with _LOCK:
            if len(_SPACES) > 8:
                _SPACES.pop(next(iter(_SPACES)))
            hit = _SPACES.setdefault(key, hit)
    return list(hit)


def fits(ir: GemmIR, s, dims_list: list[dict]) -> bool:
    """Whether one kernel of `s` serves every shape of the job."""
    return is_valid(ir, s) is None and all(is_valid(ir, s, d) is None for d in dims_list)


def _dims_list(dims) -> list[dict]:
    if dims is None:
        return []
    return [dims] if isinstance(dims, dict) else list(dims)


# Skinny shapes: where the default tile leaves at least half of the SMs without a tile (M = 512
# or 128 with N = 4096-8192, a single row), the schedules below, in this order, each taken when
# its CTAs fill most of the SMs in one wave (see skinny_choices).
FEW_TILES = _sched.NUM_SMS // 2
SKINNY_FILL = 0.75
# The order is the H100's (bench/results/2026-12-07-h100-matmul-2, skinny/ and plain/, speed
# against cuBLAS at the same time on the same card).
SKINNY: tuple[dict, ...] = (
    # 128 x 128 staged: 128 tiles at 512 x 4096: 0.984x cuBLAS at 6 stages, 0.960x at 5, 0.881x
    # at 5 unstaged (the 128 x 256 tile 0.65x, 64 x 256 with one consumer 0.91x, split-K of
    # 128 x 256 0.80x); the residual 1.099x eager at 5 stages staged
    {"tile_n": 128, "stages": 6, "tma_store": 128},
    {"tile_n": 128, "stages": 5},
    # 64 x 128, one consumer, a deep ring: 128 tiles at M = 128, bound by reading B once from
    # DRAM: 1.004x cuBLAS at 7 stages staged, 0.994-1.015x at 8 unstaged (4 stages 0.94x,
    # split-K 0.71-0.96x); the residual 1.053x eager at 8 stages
    {"tile_m": 64, "consumers": 1, "tile_n": 128, "stages": 7, "tma_store": 128},
    {"tile_m": 64, "consumers": 1, "tile_n": 128, "stages": 8},
    # a single row: the 64-row tile split 4 ways (0.975x cuBLAS at 1 x 4096 x 4096)
    {"tile_m": 64, "consumers": 1, "tile_n": 128, "stages": 4, "split_k": 4, "persistent": False},
)


def _ctas(s, rows: int, n: int) -> int:
    """CTAs one wave of `s` runs at rows x n: its tiles times the split."""
    return -(-rows // s.tile_m) * -(-n // s.tile_n) * s.split_k


def skinny_choices(ir: GemmIR, dims_list: list[dict]) -> list[Schedule]:
    """For a job whose largest shape has few wide tiles (at most FEW_TILES of the default
    tile), the SKINNY schedules whose CTAs fill at least SKINNY_FILL of the SMs in one wave at
    that shape, in SKINNY's order; else nothing."""
    if not dims_list or ir.b2 is not None:
        # two right operands: twice the work a tile; 128 x 128 staged measured best at the
        # skinny shapes too (bench/results/2026-12-07-h100-issue48)
        return []
    shapes = [gemm_dims({"problem": problem_text(ir)}, d)[:3] for d in dims_list]
    rows, n, _ = max(shapes, key=lambda t: t[0] * t[1] * t[2])
    if -(-rows // 128) * -(-n // 256) > FEW_TILES:
        return []
    out = []
    for opts in SKINNY:
        s = Schedule(problem=problem_text(ir), **opts)
        if SKINNY_FILL * _sched.NUM_SMS <= _ctas(s, rows, n) <= _sched.NUM_SMS:
            out.append(s)
    return out


def default_schedule(ir: GemmIR, dims=None) -> Schedule:
    """The schedule to use without search. For skinny shapes (skinny_choices), the first of
    SKINNY that fills the SMs and serves every shape. Otherwise 128 x 256 tiles (128 x 128 with
    two right operands), 4 stages, two consumer warpgroups, persistent in groups of 8 tile rows,
    the epilogue staged in 128 columns of shared memory and stored by TMA (on the H100,
    bench/results/2026-12-07-h100-issue48: 0.995-1.13x the speed of the same tile storing from
    registers over the issue's shapes with a 16-bit output, slower only in two cases within
    0.5%; an fp8 output staged 1.06-1.12x, bench/results/2026-12-07-h100-matmul-2); where the
    shapes refuse the staging (output rows not a multiple of 16 bytes), the same without it;
    where neither fits, the estimate's best of the space. Always TMA loads: the cp.async path
    ran slower than TMA at every K timed, aligned or not (bench/results/2026-12-07-h100-matmul-3:
    0.838x against 0.961x cuBLAS at 3072x5120x2048, 0.561x against 0.604x at K = 2056)."""
    dl = _dims_list(dims)
    tile_n = 128 if ir.b2 is not None else 256
    base = Schedule(tile_n=tile_n, problem=problem_text(ir))
    tries = [*skinny_choices(ir, dl), replace(base, tma_store=128), base]
    for s in tries:
        if fits(ir, s, dl):
            return s
    pool = space(ir, dl)
    if not pool:
        raise ValueError(f"no matmul schedule renders {ir.name} at these shapes")
    return _ranked(ir, pool, dl[0])[0] if dl else pool[0]


def _score(ir: GemmIR, s: Schedule, dims: dict) -> float:
    rows, n, k, nb = gemm_dims({"problem": s.problem}, dims)
    return estimate(s.to_dict(), rows, n, k, nb)["us"]


def _ranked(ir: GemmIR, pool, dims: dict) -> list[Schedule]:
    # ties (shapes where the L2 order does not show in the estimate): TMA loads (the estimate
    # charges cp.async its measured slowdown already), persistent, groups of 8 tile rows, the
    # deeper ring, the TMA-store epilogue, fast math
    return sorted(
        pool,
        key=lambda s: (
            round(_score(ir, s, dims), 3),
            s.load != "tma",
            not s.persistent,
            abs(s.group_m - 8),
            -s.stages,
            not s.tma_store,
            not s.fast_math,
        ),
    )


def seeds(ir: GemmIR, dims: dict, limit: int = SEEDS_PER_SHAPE) -> list[Schedule]:
    """A few schedules worth timing first at `dims`, best guess first: for each tile shape, its
    best-estimated variant, the tile shapes ordered by the estimate (the arithmetic intensity of a
    tile against how its count fills the SMs), so the seeds differ in layout, not only in
    pipeline depth."""
    pool = space(ir, [dims])
    if not pool:
        return []
    ranked = _ranked(ir, pool, dims)
    out: list[Schedule] = []
    shapes: set = set()
    for s in ranked:
        shape = (s.tile_m, s.tile_n)
        if shape in shapes:
            continue
        shapes.add(shape)
        out.append(s)
        if len(out) >= limit:
            break
    default = default_schedule(ir, [dims])
    if default not in out:
        # the default takes the place of the seed of its tile shape (the seeds keep distinct
        # tile shapes), or the last place
        same = [
            i for i, s in enumerate(out) if (s.tile_m, s.tile_n) == (default.tile_m, default.tile_n)
        ]
        if same:
            out[same[0]] = default
        else:
            out = out[: limit - 1] + [default]
    return out
