"""The column-reduction family: reductions over leading or middle axes, the kept innermost axis
coalesced across threads (bias gradients: a sum over tokens; batch-norm statistics per channel
of an NHWC activation; a mean over the sequence of a [B, S, D] tensor).

- `lower`: every output is sum/mean/max/min/prod over one adjacent run of axes (one or several,
  the same run for every output) of an elementwise expression of inputs of the operand's shape;
  the last axis is kept. The operand is viewed as (P, R, Q): P the kept axes before the run, R
  the reduced run, Q the kept axes after it (contiguous). Refuses anything else, saying why.
- `Schedule`: threads per block, lanes along Q, vec columns a lane (16-byte loads), split (a
  cluster of blocks shares a column block and meets through distributed shared memory), unroll
  (rows in flight a thread).
- `kernel.ColumnKernel`: the emitter. `baselines`: torch.sum(x, dim=...) and friends.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.common import ScheduleDict, checked_emit
from factory.spec import expr as E

ARCHS = ("sm_90", "sm_100")
THREADS = (128, 256, 512)
LANES = (8, 16, 32, 64, 128, 256)
SPLITS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4, 8)
SMS = 132  # an H100's SMs: the seeds aim at two blocks on each
MAX_SMEM_BYTES = 48 * 1024
ELEMENTWISE = (E.Input, E.Const, E.Unary, E.Binary, E.Compare, E.Where, E.Cast)


def operand_inputs(x, shape, *, inside: str, of_shape: str) -> tuple[list, dict]:
    """Every node of the elementwise operand `x` in walk order, and its float inputs by name
    (name -> dtype). Refuses (Unsupported) a node that is not elementwise, an input that is not
    float or not of `shape`, pow with a non-constant exponent, a cast to a non-float type, and a
    broadcast node. `inside` and `of_shape` name the operand and the shape in the refusals."""
    order, inputs = [], {}
    for m in E.walk(x):
        order.append(m)
        if not isinstance(m, ELEMENTWISE):
            raise Unsupported(f"{type(m).__name__} inside {inside}")
        if isinstance(m, E.Input):
            if m.dtype not in E.FLOAT_DTYPES or m.shape != shape:
                raise Unsupported(f"input {m.name}: only float inputs of {of_shape}")
            inputs[m.name] = m.dtype
        if isinstance(m, E.Binary) and m.op == "pow" and not isinstance(m.b, E.Const):
            raise Unsupported("pow needs a constant exponent")
        if isinstance(m, E.Cast) and m.to not in E.FLOAT_DTYPES:
            raise Unsupported(f"cast to {m.to}")
        if m.shape not in ((), shape) and not isinstance(m, E.Const):
            raise Unsupported(f"{type(m).__name__} of shape {m.shape} is broadcast")
    return order, inputs


@dataclass(frozen=True)
class OutputPlan:
    name: str
    dtype: str
    op: str  # sum / mean / max / min / prod
    operand: E.Node  # the elementwise expression reduced


@dataclass(frozen=True)
class ColReduceIR:
    name: str
    inputs: tuple[tuple[str, str], ...]  # (name, dtype) of the inputs the operands read
    outputs: tuple[OutputPlan, ...]
    order: tuple[E.Node, ...]  # the operands' nodes, operands first
    shape: tuple  # the operand's shape
    outer: tuple  # P: kept axes before the reduced run
    reduced: tuple  # R: the reduced run
    inner: tuple  # Q: kept axes after it (the last axis among them)
    dims: tuple[str, ...]  # dim names, in the order of the kernel's parameters

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)


def reduce_chain(node: E.Node) -> tuple[str, E.Node, tuple[int, ...]]:
    """(op, operand, reduced axes of the operand) of nested same-op Reduce nodes; Unsupported
    where `node` is not one."""
    chain = []
    while isinstance(node, E.Reduce):
        chain.append(node)
        node = node.x
    if not chain:
        raise Unsupported("an output that is not a reduction (sum/mean/max/min/prod)")
    ops = {r.op for r in chain}
    if len(ops) != 1:
        raise Unsupported(f"nested reductions of different kinds ({', '.join(sorted(ops))})")
    orig = list(range(len(node.shape)))
    axes: list[int] = []
    for r in reversed(chain):  # innermost first
        a = orig[r.axis]
        if a in axes:
            raise Unsupported("a reduction over an axis already reduced")
        axes.append(a)
        if not r.keepdims:
            orig.pop(r.axis)
    return chain[0].op, node, tuple(sorted(axes))


def lower(workload) -> ColReduceIR:
    plans, operand_shape, axes_seen = [], None, None
    for o in workload.outputs:
        op, operand, axes = reduce_chain(o.expr)
        if op not in E.REDUCE_OPS + E.EXTRA_REDUCE_OPS:
            raise Unsupported(f"reduction {op} is not supported")
        if o.dtype not in E.FLOAT_DTYPES:
            raise Unsupported(f"output {o.name} is {o.dtype}; column reductions give floats")
        rank = len(operand.shape)
        if rank - 1 in axes:
            raise Unsupported(
                "a reduction over the last axis: the column family keeps the last axis "
                "(the row family reduces along it; the whole-tensor family reduces everything)"
            )
        if list(axes) != list(range(axes[0], axes[-1] + 1)):
            raise Unsupported(f"reduced axes {axes} are not adjacent (one run of axes)")
        if operand_shape is not None and (operand.shape, axes) != (operand_shape, axes_seen):
            raise Unsupported("outputs reduce operands of different shapes or axes")
        operand_shape, axes_seen = operand.shape, axes
        plans.append(OutputPlan(o.name, o.dtype, op, operand))
    order: list[E.Node] = []
    seen: set[E.Node] = set()
    inputs: dict[str, str] = {}
    for p in plans:
        for n in E.walk(p.operand):
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            if not isinstance(n, ELEMENTWISE):
                raise Unsupported(f"{type(n).__name__} inside a column reduction's operand")
            if isinstance(n, E.Input):
                if n.dtype not in E.FLOAT_DTYPES:
                    raise Unsupported(f"input {n.name} is {n.dtype}: index data is not reduced")
                if n.shape != operand_shape:
                    raise Unsupported(
                        f"input {n.name} of shape {n.shape} is broadcast into the operand "
                        f"{operand_shape}: only inputs of the operand's shape"
                    )
                inputs[n.name] = n.dtype
            if isinstance(n, E.Binary) and n.op == "pow" and not isinstance(n.b, E.Const):
                raise Unsupported("pow needs a constant exponent")
            if isinstance(n, E.Cast) and n.to not in E.FLOAT_DTYPES:
                raise Unsupported(f"cast to {n.to}")
            if n.shape not in ((), operand_shape) and not isinstance(n, E.Const):
                raise Unsupported(f"{type(n).__name__} of shape {n.shape} is broadcast")
    if not inputs:
        raise Unsupported("the operand reads no input")
    a0, a1 = axes_seen[0], axes_seen[-1]
    dims = tuple(dict.fromkeys(d for d in operand_shape if isinstance(d, str)))
    return ColReduceIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        outputs=tuple(plans),
        order=tuple(order),
        shape=operand_shape,
        outer=operand_shape[:a0],
        reduced=operand_shape[a0 : a1 + 1],
        inner=operand_shape[a1 + 1 :],
        dims=dims,
    )


# -- schedules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: per block; lanes: threads along the kept axis Q (the rest are thread rows along
    R); vec: adjacent columns a lane (one load of vec * element bytes a row); split: blocks of a
    cluster sharing one column block (R split over them); unroll: rows a thread has in flight."""

    family: str = "colreduce"
    threads: int = 256
    lanes: int = 32
    vec: int = 4
    split: int = 1
    unroll: int = 2

    @property
    def rows(self) -> int:
        return self.threads // self.lanes

    def tag(self) -> str:
        return f"t{self.threads}l{self.lanes}v{self.vec}s{self.split}u{self.unroll}"


def _size(shape, dims) -> int:
    return math.prod(int(dims[d]) if isinstance(d, str) else int(d) for d in shape)


def vecs(ir: ColReduceIR) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4, 8) if v * ir.max_esize <= 16)


def is_valid(ir: ColReduceIR, s: Schedule, dims) -> tuple[bool, str]:
    """The one validity predicate: the layout is well formed for this IR, and (with dims) not
    wasteful at that shape."""
    if s.family != "colreduce":
        return False, "not a colreduce schedule"
    if s.threads not in THREADS or s.lanes not in LANES or s.lanes > s.threads:
        return False, "threads/lanes outside the space"
    if s.vec not in vecs(ir):
        return False, f"vec {s.vec} x {ir.max_esize} bytes is past a 16-byte load"
    if s.split not in SPLITS or s.unroll not in UNROLLS:
        return False, "split/unroll outside the space"
    nout = len(ir.outputs)
    if s.vec * s.unroll * len(ir.inputs) > 64 or s.vec * nout > 32:
        return False, "too many registers a thread (vec x unroll x inputs)"
    if s.threads * s.vec * nout * 4 > MAX_SMEM_BYTES:
        return False, "the thread rows' partials do not fit 48 KiB of shared memory"
    if dims is not None:
        q, r = _size(ir.inner, dims), _size(ir.reduced, dims)
        if s.lanes * s.vec >= 2 * q and not (s.lanes == LANES[0] and s.vec == 1):
            return False, f"{s.lanes} lanes x {s.vec} columns for {q} columns: half idle"
        if s.split > 1 and s.split * s.rows > r:
            return False, f"split {s.split} x {s.rows} thread rows for {r} rows"
    return True, ""


def space(ir: ColReduceIR, dims_list) -> list[Schedule]:
    out = []
    for t, ln, v, sp, u in itertools.product(THREADS, LANES, vecs(ir), SPLITS, UNROLLS):
        s = Schedule(threads=t, lanes=ln, vec=v, split=sp, unroll=u)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def fits(ir, s: Schedule, dims_list) -> bool:
    return all(is_valid(ir, s, d)[0] for d in dims_list)


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def default_schedule(ir: ColReduceIR, dims) -> Schedule:
    """16-byte loads; lanes to cover the columns (up to a warp), narrower where the column
    blocks are too few to give each SM four blocks even split four ways; 256 threads; a split
    of at most 4 that brings the blocks to about four a SM, and eight rows in flight a thread
    where every thread row of the cluster has eight rows and a thread holds at most 32 loaded
    values (vec x rows x inputs: fp32 16-byte loads of one input; 64-72 registers, so four
    blocks of 256 threads an SM), else four, else two.
    H100, 2026-12-07 (bench/results/2026-12-07-h100-memfamilies): clusters of 4 beat clusters
    of 8 at four rows in flight (bias grad bf16 92.8 against 110.5 us, NHWC statistics fp32
    105.4 against 122.8), and four rows beat two (bias grad fp32 96.4 against 107.2);
    (-4) eight rows beat four: NHWC statistics fp32 95.2 against 108.3 us (92.9% of copy),
    bias grad fp32 98.4 against 105.5. 16-bit data at eight rows (64 values: 96-98 registers,
    two blocks an SM) never timed: a seed."""
    v = max(vecs(ir))
    q, r, p = _size(ir.inner, dims), _size(ir.reduced, dims), _size(ir.outer, dims)
    while v > 1 and LANES[0] * v >= 2 * q:
        v //= 2
    lanes = min(32, max(LANES[0], _pow2_at_least(math.ceil(q / v))))
    while lanes > LANES[0] and lanes * v >= 2 * q:
        lanes //= 2
    want = 4 * SMS
    while lanes > LANES[0] and p * math.ceil(q / (lanes * v)) * 4 < want:
        lanes //= 2
    rows = 256 // lanes
    clusters = p * math.ceil(q / (lanes * v))
    split = 1
    while split < 4 and clusters * split < want and 2 * split * rows <= r:
        split *= 2
    for unroll in (8, 4, 2):
        s = Schedule(threads=256, lanes=lanes, vec=v, split=split, unroll=unroll)
        held = v * unroll * len(ir.inputs)  # loaded values a thread has in flight
        if unroll == 2 or (r >= unroll * split * rows and held <= 32):
            if is_valid(ir, s, dims)[0]:
                return s
    return Schedule(threads=256, lanes=LANES[0], vec=1, split=1, unroll=1)


def seeds(ir: ColReduceIR, dims) -> list[Schedule]:
    """The default, then its neighbours in unroll, lanes, split and threads; all valid. 512
    threads come late: slower wherever timed (H100, 2026-12-07: column max over the sequence
    118.0 against 94.2 us, bias grad bf16 110.3 against 92.8, NHWC statistics 111.7 against
    105.4)."""
    d = default_schedule(ir, dims)
    cands = [d]
    for change in (
        {"unroll": 4 if d.unroll == 8 else 8},
        {"lanes": min(d.threads, d.lanes * 2), "split": min(8, d.split * 2)},
        {"split": min(8, d.split * 2)},
        {"split": max(1, d.split // 2)},
        {"lanes": min(d.threads, d.lanes * 2)},
        {"unroll": 2},
        {"threads": 512},
        {"threads": 128},
    ):
        s = Schedule(**{**d.to_dict(), **change})
        if s not in cands and is_valid(ir, s, dims)[0]:
            cands.append(s)
    return cands


FEATURE_FIELDS = ("threads", "lanes", "vec", "split", "unroll")


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    """What the hardware sees of a layout: the elements, bytes a lane loads a row, rows in
    flight, thread rows, lanes, the split (cluster size), threads."""
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [
        log2(elements),
        float(s.vec * 4),
        float(s.unroll),
        float(s.rows),
        log2(s.lanes),
        float(s.split),
        log2(s.threads),
    ]


def roofline(workload, dims) -> Roofline:
    return Roofline(bytes=io_bytes(workload, dims))


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    return (
        f"columns: {s.threads} threads = {s.lanes} lanes x {s.vec} columns, {s.rows} thread "
        f"rows, split {s.split}, unroll {s.unroll}"
    )


def emit(ir: ColReduceIR, schedule, arch: str = "sm_90") -> Emitted:
    from factory.families.colreduce.kernel import ColumnKernel

    def render(ir, s, arch):
        return ColumnKernel(ir, s, arch).render()

    return checked_emit("colreduce", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


FAMILY = Family(
    name="colreduce",
    lower=lower,
    space=space,
    is_valid=is_valid,
    emit=emit,
    default_schedule=default_schedule,
    seeds=seeds,
    fits=fits,
    space_fits=True,
    schedule_from_dict=Schedule.from_dict,
    label=label,
    legend="columns: threads = lanes along the kept axis x columns a lane, thread rows along "
    "the reduced axes, split = blocks of a cluster sharing the reduced axes, unroll = rows in "
    "flight",
    features=features,
    feature_fields=FEATURE_FIELDS,
    roofline=roofline,
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    min_warps_per_sm=12,
    layout_fields=("threads", "lanes", "vec", "split"),
)

__all__ = ["FAMILY", "ColReduceIR", "Schedule", "lower"]
