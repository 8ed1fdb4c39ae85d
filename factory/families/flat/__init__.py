"""The flat family: elementwise operators with no reduction and no broadcast along a row (every
input of the output's shape, or a scalar), in any dtype, at any row length. The tensor is one
flat run of elements: chunks of `chunk` elements handed to a grid-stride loop of blocks, each
thread `unroll` 16-byte vectors in flight, the tail under per-element predicates. A row layout
(the row family) is the wrong shape for work that has no row: short rows leave lanes idle and
long ones leave SMs idle.

The emitter is the split-row family's (factory.families.rowsplit.kernel) in its "static" mode
with the whole tensor as one row; no workspace, no atomics."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.device import device_for
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce.kernel import ESIZE
from factory.families.common import ScheduleDict, seeds_from
from factory.families.row import ir as row_ir
from factory.families.rowsplit import elements_and_tasks, lower_kernel_ir, split_emitter, vec_of

ARCHS = ("sm_90", "sm_100")
THREADS = (128, 256, 512)
UNROLLS = (1, 2, 4)
CHUNKS = tuple(1 << p for p in range(10, 19))  # 1K .. 256K elements a task
MAX_ELEMENTS = 1 << 31  # 32-bit element indices


@dataclass(frozen=True)
class FlatIR:
    kir: row_ir.KernelIR

    @property
    def name(self) -> str:
        return self.kir.name

    @property
    def max_esize(self) -> int:
        sizes = [t.elem_bytes for t in self.kir.inputs if t.role == row_ir.ROLE_ROW]
        sizes += [ESIZE[o.dtype] for o in self.kir.outputs]
        return max(sizes, default=4)

    @property
    def dims(self) -> tuple[str, ...]:
        return (*self.kir.batch_dims, self.kir.row_dim)


def lower(workload) -> FlatIR:
    kir = lower_kernel_ir(workload)
    if kir.reductions:
        raise Unsupported("a reduction: not a flat elementwise operator")
    for t in kir.inputs:
        if t.role not in (row_ir.ROLE_ROW, row_ir.ROLE_SCALAR):
            raise Unsupported(
                f"input {t.name} is broadcast ({t.role}): a flat kernel reads every input at "
                "the output's shape or as one scalar (the row family handles broadcasts)"
            )
    for o in kir.outputs:
        if o.role != row_ir.ROLE_ROW:
            raise Unsupported(f"output {o.name} is per row: not a flat elementwise operator")
    return FlatIR(kir=kir)


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: a block; vec: adjacent elements a load (16 bytes of the widest dtype); unroll:
    vectors a thread has in flight; chunk: elements a block takes at a time (a power of two);
    blocks: the most blocks of the grid-stride loop."""

    family: str = "flat"
    threads: int = 256
    vec: int = 4
    unroll: int = 4
    chunk: int = 16384
    blocks: int = 1056

    def tag(self) -> str:
        return f"t{self.threads}v{self.vec}u{self.unroll}c{self.chunk}b{self.blocks}"


# blocks = ONE_A_TASK: a block for every chunk, no grid-stride loop (torch's own elementwise
# kernels launch that way)
ONE_A_TASK = 1 << 30


def block_counts(arch: str = "sm_90") -> tuple[int, ...]:
    sms = device_for(arch).sms
    return (2 * sms, 4 * sms, 8 * sms, 16 * sms, ONE_A_TASK)


def _elements(ir, dims) -> int:
    return math.prod(int(dims[d]) for d in ir.dims)


def is_valid(ir: FlatIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "flat":
        return False, "not a flat schedule"
    if s.threads not in THREADS or s.unroll not in UNROLLS or s.chunk not in CHUNKS:
        return False, "threads/unroll/chunk outside the space"
    if s.vec != vec_of(ir):
        return False, f"vec is {vec_of(ir)} for these dtypes (16-byte loads)"
    if s.blocks < 1:
        return False, "blocks outside the space"
    if s.chunk < s.threads * s.vec * s.unroll:
        return False, "a chunk smaller than one step of the block"
    if dims is not None and _elements(ir, dims) >= MAX_ELEMENTS:
        return False, "2^31 elements or more: 32-bit indices"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    v = vec_of(ir)
    out = []
    for t, u, c, blk in itertools.product(THREADS, UNROLLS, CHUNKS, block_counts()):
        s = Schedule(threads=t, vec=v, unroll=u, chunk=c, blocks=blk)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def default_schedule(ir, dims) -> Schedule:
    """512 threads with four 16-byte vectors in flight each, a block a chunk of one such step
    (32 KiB of fp32), a block for every chunk: the launch of torch's own elementwise kernels.
    On the H100 (bench/results/2026-12-07-h100-memfamilies) 512 threads led the grid-stride
    seeds (97.8% of copy against torch's 100.2% at 256 x 393216 fp32)."""
    v = vec_of(ir)
    return Schedule(threads=512, vec=v, unroll=4, chunk=512 * v * 4, blocks=ONE_A_TASK)


def seeds(ir, dims) -> list[Schedule]:
    """The default, then the grid-stride layouts the first GPU run measured (512 and 256
    threads, 16K-element or larger chunks, eight blocks an SM), then smaller steps."""
    d = default_schedule(ir, dims)
    sms = device_for("sm_90").sms
    loop = {"blocks": 8 * sms, "chunk": max(16384, d.chunk)}
    changes = (
        {**loop},
        {**loop, "threads": 256},
        {"threads": 256},
        {"unroll": 2},
        {**loop, "threads": 256, "unroll": 2},
        {"threads": 128},
    )
    return seeds_from(d, changes, lambda s: is_valid(ir, s, dims)[0])


emit = split_emitter("flat", ARCHS, Schedule, is_valid, flat=True)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements, tasks = elements_and_tasks(s, dims, dim_order)
    return [log2(elements), log2(s.threads), float(s.unroll), log2(s.chunk),
            tasks / min(max(s.blocks, 1), tasks)]  # fmt: skip


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    grid = "a block a task" if s.blocks >= ONE_A_TASK else f"over at most {s.blocks} blocks"
    return (
        f"flat: {s.chunk} elements a task, {grid}, {s.threads} threads x {s.vec} a load, "
        f"{s.unroll} in flight"
    )


FAMILY = Family(
    name="flat",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=default_schedule,
    seeds=seeds,
    fits=lambda ir, s, dims_list: all(is_valid(ir, s, d)[0] for d in dims_list),
    space_fits=True,
    schedule_from_dict=Schedule.from_dict,
    label=label,
    legend="flat: elements a task, blocks, threads x elements a load, loads in flight",
    features=features,
    feature_fields=("threads", "unroll", "chunk", "blocks"),
    roofline=lambda workload, dims: Roofline(bytes=io_bytes(workload, dims)),
    # the row family's baselines: the same operators (F.softmax, F.rms_norm, SiLU-mul, ...)
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune", "triton", "liger"),
    baselines_module="factory.families.row.baselines",
    layout_fields=("chunk", "blocks", "threads", "unroll"),
)

__all__ = ["FAMILY", "FlatIR", "Schedule", "lower"]
