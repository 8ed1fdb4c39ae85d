"""The split-row family: row operators (softmax, LayerNorm, RMSNorm, elementwise work with a
per-column input, ...) over too few rows to fill the GPU: every shape of the job has at most
FEW_ROWS rows of at least LONG_ROW elements. The row family gives a row to a block, so one row
of 16M elements runs on one SM of 132; here a row is cut into chunks, a chunk a task, and the
row statistics meet in a workspace (kernel.py says how, and why it cannot hang).

The operator is lowered by the row family's IR (`factory.families.row.ir.lower`), so it reads
the same manifests; this family only refuses what its emitter does not do (gathers, integer
inputs) and shapes with enough rows for the row family."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.device import device_for
from factory.emit import Emitted
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce.kernel import ESIZE
from factory.families.common import ScheduleDict, checked_emit, seeds_from
from factory.families.row import ir as row_ir
from factory.families.rowsplit.kernel import (
    MAX_ROWS,
    ROW_CHUNKS,
    SplitKernel,
    passes,
    unique_reductions,
)

ARCHS = ("sm_90", "sm_100")
FEW_ROWS = 64  # at most this many rows in every shape of the job
LONG_ROW = 32768  # of at least this many elements
THREADS = (128, 256, 512)
UNROLLS = (1, 2, 4)
CHUNKS = tuple(1 << p for p in range(10, 18))  # 1K .. 128K elements a task
GROUPS = (1, 2, 4, 8, 16, 64)  # rows a step of the ticket order (kernel.py)
LAGS = (1, 2)  # steps between a row's passes
STREAMS = (False, True)
KEEPS = (False, True)  # evict-last on the statistics passes' reads (passes > 1 only)
# the values the search walks: keep timed level with the default on an H100 (no L2 set-aside
# for persisting lines; bench/results/2026-12-07-h100-memfamilies-5), so it stays a valid
# schedule for the lab bench but out of the space and the seeds
SPACE_KEEPS = (False,)


@dataclass(frozen=True)
class RowSplitIR:
    """The row IR (`kir`) and what the split adds: the passes over a row."""

    kir: row_ir.KernelIR
    passes: int

    @property
    def name(self) -> str:
        return self.kir.name

    @property
    def max_esize(self) -> int:
        sizes = [
            t.elem_bytes for t in self.kir.inputs if t.role in (row_ir.ROLE_ROW, row_ir.ROLE_COL)
        ]
        sizes += [ESIZE[o.dtype] for o in self.kir.outputs if o.role == row_ir.ROLE_ROW]
        return max(sizes, default=4)


def rows_and_length(kir, dims: dict) -> tuple[int, int]:
    rows = math.prod(int(dims[d]) for d in kir.batch_dims)
    return rows, int(dims[kir.row_dim])


def lower_kernel_ir(workload):
    """The row IR of `workload`, refusing what the split emitter does not render."""
    kir = row_ir.lower(workload)
    if kir.gathers:
        raise Unsupported("a gather along the row (the row family)")
    for t in kir.inputs:
        if t.dtype not in ESIZE:
            raise Unsupported(f"input {t.name} is {t.dtype}: float inputs only")
    for o in kir.outputs:
        if o.dtype not in ESIZE:
            raise Unsupported(f"output {o.name} is {o.dtype}")
    return kir


def lower(workload) -> RowSplitIR:
    kir = lower_kernel_ir(workload)
    shapes = list(workload.shapes)
    if not shapes:
        raise Unsupported("no shapes to decide whether the rows are few")
    for dims in shapes:
        rows, n = rows_and_length(kir, dims)
        if rows > FEW_ROWS or n < LONG_ROW:
            raise Unsupported(
                f"{rows} rows of {n}: enough rows to fill the GPU a row a block (the row "
                f"family); this family takes at most {FEW_ROWS} rows of {LONG_ROW} or more"
            )
    return RowSplitIR(kir=kir, passes=passes(kir))


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: a block; vec: adjacent elements a load (16 bytes of the widest dtype);
    unroll: vectors a thread has in flight; chunk: elements a task (a power of two); blocks:
    the grid; with reductions, group: rows a step of the ticket order (their chunks handed
    out chunk-major, so a per-column input's chunk serves them together) and lag: steps
    between a row's passes (pass k of group g is handed out beside pass 0 of group
    g + k x lag); stream: the output pass's reads of the row (its last) and its stores
    marked evict-first in L2, so that they do not push out what a later pass re-reads; keep
    (with reductions only): the statistics passes' reads of the row marked evict-last in L2,
    since a later pass reads them again (per-column inputs keep the default policy). `keep`
    came last: `to_dict` leaves it out while off, so the dicts (records, the PTX header) of
    every schedule without it are as they were."""

    family: str = "rowsplit"
    threads: int = 256
    vec: int = 4
    unroll: int = 2
    chunk: int = 8192
    blocks: int = 264
    group: int = 1
    lag: int = 1
    stream: bool = False
    keep: bool = False

    def to_dict(self) -> dict:
        d = super().to_dict()
        if not d["keep"]:
            del d["keep"]
        return d

    def tag(self) -> str:
        return (
            f"t{self.threads}v{self.vec}u{self.unroll}c{self.chunk}b{self.blocks}"
            f"g{self.group}l{self.lag}{'e' if self.stream else ''}{'k' if self.keep else ''}"
        )


def vec_of(ir) -> int:
    """Elements a 16-byte load of the IR's widest dtype holds (the flat family's too)."""
    return 16 // ir.max_esize


def block_counts(arch: str = "sm_90") -> tuple[int, ...]:
    sms = device_for(arch).sms
    return (sms, 2 * sms, 4 * sms)


def is_valid(ir: RowSplitIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "rowsplit":
        return False, "not a rowsplit schedule"
    if s.threads not in THREADS or s.unroll not in UNROLLS or s.chunk not in CHUNKS:
        return False, "threads/unroll/chunk outside the space"
    if s.vec != vec_of(ir):
        return False, f"vec is {vec_of(ir)} for these dtypes (16-byte loads)"
    if s.group not in GROUPS or s.lag not in LAGS or s.stream not in STREAMS or s.blocks < 1:
        return False, "group/lag/stream/blocks outside the space"
    if s.keep not in KEEPS:
        return False, "keep outside the space"
    if ir.passes == 1 and (s.group, s.lag, s.keep) != (1, 1, False):
        return False, "one pass: no row groups, no lag, no statistics reads to keep"
    if s.chunk < s.threads * s.vec * s.unroll:
        return False, "a chunk smaller than one step of the block"
    if dims is not None:
        rows, n = rows_and_length(ir.kir, dims)
        chunks = -(-n // s.chunk)
        if rows * n >= 1 << 31:
            return False, f"{rows} x {n} elements: 32-bit indices"
        if ir.passes > 1 and (rows > MAX_ROWS or rows * chunks > ROW_CHUNKS):
            return False, f"{rows} rows of {chunks} chunks: past the workspace"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    v = vec_of(ir)
    out = []
    for t, u, c, blk, g, lag, st, kp in itertools.product(
        THREADS, UNROLLS, CHUNKS, block_counts(), GROUPS, LAGS, STREAMS, SPACE_KEEPS
    ):
        if ir.passes == 1 and (g, lag, kp) != (1, 1, False):
            continue
        s = Schedule(threads=t, vec=v, unroll=u, chunk=c, blocks=blk, group=g, lag=lag,
                     stream=st, keep=kp)  # fmt: skip
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def default_schedule(ir, dims) -> Schedule:
    """Blocks of 256 threads with four 16-byte vectors in flight each: two an SM (32 KiB an
    SM, about what Little's law asks of HBM3 at an unloaded latency: ~3.3 TB/s x ~700 ns /
    132 SMs is ~18 KiB); with reductions four an SM (64 KiB, held to 64 registers by
    `.minnctapersm`: a task's block fold, ticket and waits leave its loads idle a while).
    With reductions (H100, bench/results/2026-12-07-h100-memfamilies-3, RMSNorm and softmax
    bf16: the timed fastest at each of the five shapes): a row's passes two steps apart
    (lag 1 was 7-25% slower for softmax at 64x1M and 8x16M); where a per-column input would be read
    again by every row and the rows do not fit L2 together, 8 rows a step (or as many as fit
    16 MiB) with the passes a step apart: w read once a chunk for the step's rows, and the
    output pass of a step that many tickets behind its statistics, so it rarely waits
    (RMSNorm 64x1M 148 against 169 us, 8x16M 283 against 350). Tasks of 32K elements over
    several rows (16K at 8x1M was 5-14% slower); a single row: about a task an SM up to 1M
    elements (8K at 1M), else about two a block of the grid (16K at 16M: 8K and 32K were
    4-8% slower for softmax).
    Without reductions, one pass over every row: tasks of at least 8K elements, about two a
    block (shorter tasks lost to their fixed cost on the H100,
    bench/results/2026-12-07-h100-memfamilies); where that is less than 8K elements an SM,
    about a task an SM (fewer threads and vectors in flight where the chunk is short)."""
    v = vec_of(ir)
    sms = device_for("sm_90").sms
    blocks = 4 * sms if ir.passes > 1 else 2 * sms
    rows, n = rows_and_length(ir.kir, dims)
    row_bytes = n * ir.max_esize
    l2_share = 16 * 1024 * 1024
    g, lag, stream = 1, 2, True
    per_column = any(t.role == row_ir.ROLE_COL for t in ir.kir.inputs)
    if ir.passes > 1 and rows > 1 and per_column and rows * row_bytes > l2_share:
        fits = 2 * row_bytes <= l2_share
        most = min(8, l2_share // row_bytes, rows) if fits else rows
        g, lag = max(x for x in GROUPS if x <= most), 1
    if ir.passes == 1:
        g, lag, stream = 1, 1, False  # one pass: not timed with the hints yet
    per = rows * n if ir.passes == 1 else n
    pairs = 2 * sms  # one-pass tasks are sized by two blocks an SM
    if ir.passes > 1 and rows > 1:
        chunk = min(32768, max(8192, 1 << round(math.log2(rows * n / 256))))
    elif ir.passes > 1 and per >= sms * 8192:
        chunk = max(8192, 1 << round(math.log2(per / (2 * blocks))))
    elif per >= sms * 8192:
        chunk = max(8192, 1 << round(math.log2(per / (2 * pairs))))
    else:
        chunk = 1 << round(math.log2(max(per / sms, 1)))
    chunk = max(CHUNKS[0], min(CHUNKS[-1], chunk), 128 * v)
    threads, unroll = (
        (256, 4) if chunk >= 256 * v * 4 else (256, 2) if chunk >= 256 * v * 2 else (128, 1)
    )
    if ir.passes > 1:
        # in 64 registers: at most 128 bytes of loads a thread a step, over the row and
        # per-column inputs (LayerNorm fp32 with four steps of x, w, b spills)
        vectors = sum(t.role in (row_ir.ROLE_ROW, row_ir.ROLE_COL) for t in ir.kir.inputs)
        unroll = max(u for u in UNROLLS if u <= max(1, min(unroll, 8 // max(vectors, 1))))
    shape = dict(blocks=blocks, group=g, lag=lag, stream=stream)
    s = Schedule(threads=threads, vec=v, unroll=unroll, chunk=chunk, **shape)
    if not is_valid(ir, s, dims)[0]:
        s = Schedule(threads=256, vec=v, unroll=2, chunk=CHUNKS[-1], **shape)
    return s


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    changes = (
        {"chunk": d.chunk * 2},
        {"chunk": d.chunk // 2},
        {"unroll": 4},
        {"threads": 512},
        {"blocks": d.blocks // 2},
        {"lag": 3 - d.lag},
        {"group": 1},
        {"stream": not d.stream},
    )
    return seeds_from(d, changes, lambda s: is_valid(ir, s, dims)[0])


def split_emitter(family: str, archs, schedule_cls, is_valid, flat: bool):
    """The `emit(ir, schedule, arch)` of a family whose kernel is SplitKernel over `ir.kir`:
    with `flat`, the whole tensor as one row (the flat family), else rows cut into chunks."""

    def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
        def render(ir, s, arch):
            return SplitKernel(ir.kir, s, arch, flat=flat, family=family).render()

        return checked_emit(family, archs, schedule_cls, is_valid, render, ir, schedule, arch)

    return emit


emit = split_emitter("rowsplit", ARCHS, Schedule, is_valid, flat=False)


def elements_and_tasks(s, dims: dict, dim_order: list) -> tuple[int, float]:
    """The elements over `dim_order` (1 with none) and the tasks of `s.chunk` they make (at
    least 1): the feature inputs both SplitKernel families share."""
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return elements, max(1.0, elements / s.chunk)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements, tasks = elements_and_tasks(s, dims, dim_order)
    return [
        log2(elements),
        log2(s.threads),
        float(s.unroll),
        log2(s.chunk),
        tasks / max(s.blocks, 1),
        log2(s.group),
        float(s.lag),
        float(s.stream),
    ]


LATE_DEFAULTS = {"lag": 1, "stream": False, "keep": False}


def canonical(schedule: dict) -> dict:
    """The schedule without the fields added after the first records (lag, stream, keep),
    where at their default, so that a record written before them and one written since name
    the same schedule (its ticket order has changed since: the same name, today's kernel)."""
    return {k: v for k, v in schedule.items() if LATE_DEFAULTS.get(k, object()) != v}


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    return (
        f"split rows: tasks of {s.chunk} elements over {s.blocks} blocks of {s.threads} "
        f"threads x {s.vec} a load, {s.unroll} in flight, {s.group} rows a step, passes "
        f"{s.lag} steps apart{', the last reads and the stores evict-first' if s.stream else ''}"
        f"{', the statistics reads evict-last' if s.keep else ''}"
    )


def roofline(workload, dims) -> Roofline:
    return Roofline(bytes=io_bytes(workload, dims))


def reductions_of(ir) -> list:
    return unique_reductions(ir.kir)


FAMILY = Family(
    name="rowsplit",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=default_schedule,
    seeds=seeds,
    fits=lambda ir, s, dims_list: all(is_valid(ir, s, d)[0] for d in dims_list),
    space_fits=True,
    schedule_from_dict=Schedule.from_dict,
    canonical=canonical,
    label=label,
    legend="split rows: elements a task, blocks, threads x elements a load, loads in flight",
    features=features,
    feature_fields=("threads", "unroll", "chunk", "blocks", "group", "lag", "stream"),
    roofline=roofline,
    # the row family's torch baselines (F.softmax, F.rms_norm, ...); its Triton and Liger
    # kernels take a row a program, a block of the whole row: not for rows of millions
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.row.baselines",
    layout_fields=("chunk", "blocks", "threads"),
)

__all__ = ["FAMILY", "RowSplitIR", "Schedule", "lower"]
