"""The protocol every operator family implements, and what families share.

A family is one kind of kernel (the row kernel; a tensor-core matmul; ...). Everything outside
its folder reaches it only through a `Family` record from the registry (`factory.families`):
the agents ask it for a space and seeds, the compile stage for PTX, the cost model for features
and a roofline, the GPU worker for baselines, the portal for a schedule's label.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from factory.device import Device, device_for
from factory.spec.types import BaselineUnavailable  # noqa: F401 - families raise it


class Unsupported(Exception):
    """The family cannot lower this workload; the message says why, naming the construct."""


@dataclass(frozen=True)
class Roofline:
    """The least work one call of an operator must do at a shape."""

    bytes: float  # every input read once, every output written once
    flops: float = 0.0  # floating point operations the maths needs (a multiply-add is two)

    def time_us(self, device: Device | None = None) -> float:
        """The time the busier of memory and arithmetic takes at the device's ceilings, plus a
        launch floor (microseconds)."""
        d = device or device_for(None)
        memory = self.bytes / d.copy_bytes_per_us
        compute = self.flops / d.peak_bf16_flops_per_us if self.flops else 0.0
        return d.launch_floor_us + max(memory, compute)


def _no_features(schedule: dict, dims: dict, dim_order: list[str]) -> list[float]:
    return []


def _asdict_label(schedule: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(schedule.items()) if k != "family")


@dataclass
class Family:
    """One operator family behind the seam. Required: how to lower a workload, its space, the
    validity predicate and the emitter; the rest has working defaults.

    lower(workload) -> ir; raises Unsupported(reason) for what the family cannot do.
    space(ir, dims_list) -> list of frozen schedule dataclasses (every one valid).
    is_valid(ir, schedule, dims) -> bool or (bool, reason): the one validity predicate.
    emit(ir, schedule, arch) -> factory.emit.Emitted; asserts validity, raises EmitError.
    default_schedule(ir, dims) -> the schedule to use with no search.
    seeds(ir, dims) -> screened starting schedules at one shape, best first.
    fits(ir, schedule, dims_list) -> whether one kernel of it serves every shape of a job.
    space_fits: `space` already holds only schedules that fit the job.
    reports([ptx]) -> compile reports (factory.compile.CompileReport), side by side.
    recap(ir, schedule) -> the schedule under a register cap that compiles clean, or None.
    schedule_from_dict(d) -> the schedule a stored dict names.
    canonical(d) -> the dict that names the same schedule in evidence (fields at a default added
        late, or fitted from the job's shapes, left out), so records written before and since
        compare equal.
    label(schedule_dict) -> a short human name; legend: how to read labels.
    features(schedule_dict, dims, dim_order) -> cost-model features of a schedule at a shape
        (what the hardware sees: waves, occupancy, bytes and FLOPs per tile, ...);
        feature_fields: the schedule fields `features` reads (results cached per their values).
    roofline(workload, dims) -> Roofline: the least bytes and FLOPs of one call.
    baselines: the GPU worker's baseline names for this family, strongest first;
        baselines_module: a module importable without the emitter (torch-side functions,
        `idiomatic(name, workload, compiled)` and `library(name, workload)`) or None.
    min_warps_per_sm: the reviewer's floor of resident warps per SM. Memory-bound families need
        loads in flight (Little's law: ~600 ns latency x ~4.8 TB/s is ~2.9 MB chip-wide, ~22 KB
        per SM: 12 warps issuing 16-byte loads x 4); a tensor-core family keeps its pipeline in
        shared memory and runs one block of a few warpgroups per SM.
    scalar_access_note(schedule) -> why adjacent scalar global accesses are by design in this
        schedule (the reviewer then warns rather than rejects), or None.
    layout_fields: the schedule fields that say how the work is spread (the agents keep a
        generation from crowding into one layout); moves(schedule) -> [(changes, why)]: steps
        of several fields at once that one-field mutation cannot make.
    split_dims(ir) -> the dims whose every value wants a kernel of its own (the row length for
        the row family): the portal offers a job per value.
    """

    lower: Callable
    space: Callable
    is_valid: Callable
    emit: Callable
    default_schedule: Callable | None = None
    seeds: Callable | None = None
    fits: Callable | None = None
    space_fits: bool = False
    reports: Callable | None = None
    recap: Callable | None = None
    name: str = "custom"
    schedule_from_dict: Callable | None = None
    canonical: Callable[[dict], dict] | None = None
    label: Callable[[dict], str] = _asdict_label
    legend: str = ""
    features: Callable[[dict, dict, list], list[float]] = _no_features
    feature_fields: tuple[str, ...] = ()
    roofline: Callable | None = None
    baselines: tuple[str, ...] = ("torch_eager", "torch_compile", "torch_compile_max_autotune")
    baselines_module: str | None = None
    split_dims: Callable[[Any], tuple[str, ...]] = lambda ir: ()
    min_warps_per_sm: int = 12
    scalar_access_note: Callable[[dict], str | None] = lambda schedule: None
    layout_fields: tuple[str, ...] = ()
    moves: Callable[[Any], list] = lambda schedule: []
    extra: dict[str, Any] = field(default_factory=dict)

    def accepts(self, workload) -> bool:
        try:
            self.lower(workload)
        except Unsupported:
            return False
        return True

    def roofline_of(self, workload, dims: dict) -> Roofline:
        if self.roofline is not None:
            return self.roofline(workload, dims)
        return Roofline(bytes=io_bytes(workload, dims))


def io_bytes(workload, dims: dict[str, int]) -> float:
    """Fewest bytes an operator moves: every input read once, every output written once."""
    from factory.spec.expr import DTYPE_BYTES

    total = 0.0
    for t in (*workload.inputs, *workload.outputs):
        n = 1
        for d in t.shape:
            n *= int(dims[d]) if isinstance(d, str) else int(d)
        total += n * DTYPE_BYTES.get(t.dtype, 4)
    return total


def log2(x: float) -> float:
    return math.log2(max(float(x), 1e-3))
