"""The segment-norm family: norms over several trailing axes (instance norm over H and W of an
NCHW tensor; any operator whose reductions all run over the same trailing run of two or more
axes, kept with keepdims, and whose outputs are per element): each segment (the trailing axes of
one index of the leading ones, contiguous) is a block's, one at a time (grid-stride).

The reductions run in stages (a variance after the mean it subtracts), every reduction of a
stage at once; each meets in a fixed order (a thread's elements, the warp's lanes by butterfly,
the warps in order) and every thread gets the result through shared memory. Where the segment
fits the schedule's `hold` 16-byte vectors a thread (and its length is a multiple of the vector)
it is read once into registers, all of a block's loads in flight at once, and the stages and
the outputs are computed from the registers; otherwise one pass over the segment a stage and a
last pass that computes the outputs and stores them. Inputs are of
the operand's shape or scalars (a per-channel weight, which would need the channel of a
segment, is refused yet)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit import ops as OPS
from factory.emit.module import module_text
from factory.emit.ptx import Builder, EmitError, f32_literal
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce.kernel import (
    COMBINE,
    ESIZE,
    IDENTITY,
    ColumnKernel,
    ident,
    shape_product,
)
from factory.families.common import ScheduleDict, checked_emit
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)
HOLDS = (0, 1, 2, 4, 8)
MINBLOCKS = (0, 4, 6, 8, 9, 12, 16)
MAX_BLOCKS = 65535


@dataclass(frozen=True)
class SegNormIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple  # OutputDecl
    shape: tuple  # the segment operand's shape
    first: int  # the first reduced axis: segments are shape[first:]
    stages: tuple[tuple[E.Reduce, ...], ...]  # the outermost node of each reduction chain
    operand: dict  # chain top -> (op, innermost operand)
    dims: tuple[str, ...]

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)


def _chain(n: E.Reduce):
    chain = []
    while isinstance(n, E.Reduce) and (not chain or n.op == chain[0].op):
        chain.append(n)
        n = n.x
    return chain, n


def lower(workload) -> SegNormIR:
    shape = None
    for o in workload.outputs:
        if o.dtype not in E.FLOAT_DTYPES:
            raise Unsupported(f"output {o.name} is {o.dtype}")
        if shape is None:
            shape = o.shape
        if o.shape != shape:
            raise Unsupported("outputs of different shapes")
    rank = len(shape)
    tops: dict[E.Node, tuple] = {}
    reduces = {n for o in workload.outputs for n in E.walk(o.expr) if isinstance(n, E.Reduce)}
    inner: set[E.Node] = {
        n.x for n in reduces if isinstance(n.x, E.Reduce) and n.x.op == n.op
    }  # nested reductions over several axes: their outermost node stands for them
    first = None
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Reduce) and n not in inner and n not in tops:
                chain, x = _chain(n)
                if x.shape != shape:
                    raise Unsupported("a reduction of an operand of another shape")
                if not all(r.keepdims for r in chain):
                    raise Unsupported("a reduction without keepdims=True inside a norm")
                axes = sorted(r.axis for r in chain)
                if axes != list(range(axes[0], rank)) or len(axes) < 2:
                    raise Unsupported(
                        "reductions over one trailing axis (the row family) or not over a "
                        "trailing run of axes"
                    )
                if first is not None and axes[0] != first:
                    raise Unsupported("reductions over different runs of axes")
                first = axes[0]
                if axes[0] == 0:
                    raise Unsupported("a reduction over every axis (no segment is kept)")
                if n.op not in E.REDUCE_OPS + E.EXTRA_REDUCE_OPS:
                    raise Unsupported(f"reduction {n.op}")
                tops[n] = (n.op, x)
    if not tops:
        raise Unsupported("no reduction: an elementwise operator (the row family)")
    segment_shape = shape[:first] + (1,) * (rank - first)
    stage: dict[E.Node, int] = {}
    inputs: dict[str, str] = {}
    allowed = (E.Input, E.Const, E.Unary, E.Binary, E.Compare, E.Where, E.Cast, E.Reduce)
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if not isinstance(n, allowed):
                raise Unsupported(f"{type(n).__name__} inside a segment norm")
            if isinstance(n, E.Reduce) and n in inner:
                continue
            if isinstance(n, E.Input):
                if n.dtype not in E.FLOAT_DTYPES or n.shape not in (shape, ()):
                    raise Unsupported(f"input {n.name} of shape {n.shape}: only the operand's")
                inputs[n.name] = n.dtype
            if isinstance(n, E.Binary) and n.op == "pow" and not isinstance(n.b, E.Const):
                raise Unsupported("pow needs a constant exponent")
            if isinstance(n, E.Cast) and n.to not in E.FLOAT_DTYPES:
                raise Unsupported(f"cast to {n.to}")
            if n.shape not in ((), shape, segment_shape):
                raise Unsupported(f"{type(n).__name__} of shape {n.shape} is broadcast")
            if isinstance(n, E.Reduce):
                stage[n] = 1 + max((stage.get(m, 0) for m in E.walk(tops[n][1])), default=0)
            else:
                stage[n] = max((stage.get(c, 0) for c in E.children(n)), default=0)
    if not inputs:
        raise Unsupported("the operator reads no input")
    depth = max(stage[t] for t in tops)
    stages = tuple(tuple(t for t in tops if stage[t] == s) for s in range(1, depth + 1))
    return SegNormIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        outputs=tuple(workload.outputs),
        shape=shape,
        first=first,
        stages=stages,
        operand=tops,
        dims=tuple(dict.fromkeys(d for d in shape if isinstance(d, str))),
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: a segment's block; vec: adjacent elements a load; hold: vectors a thread keeps
    in registers (0: every stage reads the segment again); prefetch (with hold): the held
    vectors kept as loaded (16-bit pairs packed) in two sets, the block's next segment loaded
    into one while the other is folded and written; minblocks: blocks a SM asked of ptxas
    (`.minnctapersm`, so it caps the registers a thread; 0: no directive); moments (with hold,
    without prefetch, for a mean and the mean square about it: `moments_pair`): both from one
    block-wide fold of (count, mean, M2) triples instead of a fold a stage."""

    family: str = "segnorm"
    threads: int = 256
    vec: int = 4
    hold: int = 0
    prefetch: int = 0
    minblocks: int = 0
    moments: int = 0

    def tag(self) -> str:
        t = f"t{self.threads}v{self.vec}"
        t = f"{t}h{self.hold}" if self.hold else t
        t = f"{t}p" if self.prefetch else t
        t = f"{t}c" if self.moments else t
        return f"{t}m{self.minblocks}" if self.minblocks else t


def vecs(ir) -> tuple[int, ...]:
    return tuple(v for v in VECS if v * ir.max_esize <= 16)


def moments_pair(ir):
    """(mu, var, a) where the IR's two stages are mu = mean(a) and var = mean((a - mu) ** 2)
    (or the square as a product), else None."""
    if len(ir.stages) != 2 or len(ir.stages[0]) != 1 or len(ir.stages[1]) != 1:
        return None
    mu, var = ir.stages[0][0], ir.stages[1][0]
    (op_m, a), (op_v, sq) = ir.operand[mu], ir.operand[var]
    if op_m != "mean" or op_v != "mean" or not isinstance(sq, E.Binary):
        return None
    if sq.op == "pow" and isinstance(sq.b, E.Const) and sq.b.value == 2:
        d = sq.a
    elif sq.op == "mul" and sq.a == sq.b:
        d = sq.a
    else:
        return None
    if isinstance(d, E.Binary) and d.op == "sub" and d.a == a and d.b == mu:
        return mu, var, a
    return None


def _segment(ir, dims) -> int:
    return math.prod(int(dims[d]) if isinstance(d, str) else d for d in ir.shape[ir.first :])


def is_valid(ir: SegNormIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "segnorm" or s.threads not in THREADS or s.vec not in vecs(ir):
        return False, "threads/vec outside the space"
    if s.hold not in HOLDS:
        return False, "hold outside the space"
    if s.prefetch not in (0, 1) or (s.prefetch and not s.hold):
        return False, "prefetch is 0 or 1, and needs held segments"
    if s.moments not in (0, 1) or (s.moments and (not s.hold or s.prefetch)):
        return False, "moments is 0 or 1, for held segments without prefetch"
    if s.moments and moments_pair(ir) is None:
        return False, "moments needs a mean and the mean square about it"
    if s.minblocks not in MINBLOCKS or s.minblocks * s.threads > 2048:
        return False, f"{s.minblocks} blocks of {s.threads} threads a SM"
    least = 80 if s.prefetch else 64 if s.moments else 48
    if s.minblocks and 65536 // (s.minblocks * s.threads) < least:
        # the registers the directive leaves a thread: ptxas spills the held vectors under
        # 48 (80 with the next segment in flight: two sets; 64 with the moments' triples:
        # 63 at t128 v8 h4, 28 bytes spilled at 56); instance and group norms, sm_90a
        return False, f"{s.minblocks} blocks of {s.threads} threads: too few registers"
    held_words = 2 * s.hold * s.vec * ir.max_esize // 4 if s.prefetch else s.hold * s.vec
    if held_words > min(64, 65536 // s.threads - 40):
        return False, f"{s.hold} x {s.vec} held values a thread: more registers than fit"
    if dims is not None:
        n = _segment(ir, dims)
        if n >= 4096 and s.threads * s.vec >= 2 * n:
            return False, f"{s.threads} x {s.vec} for segments of {n}: half idle"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    return [
        s
        for t, v, h, p, m, c in itertools.product(
            THREADS, vecs(ir), HOLDS, (0, 1), MINBLOCKS, (0, 1)
        )
        if all(
            is_valid(
                ir, s := Schedule(threads=t, vec=v, hold=h, prefetch=p, minblocks=m, moments=c), d
            )[0]
            for d in (dims_list or [None])
        )
    ]


def streaming_default(ir, dims) -> Schedule:
    v = max(vecs(ir))
    n = _segment(ir, dims)
    t = 64
    while t < 512 and 4 * t * v <= n:
        t *= 2
    s = Schedule(threads=t, vec=v)
    return s if is_valid(ir, s, dims)[0] else Schedule(threads=64, vec=1)


def default_schedule(ir, dims) -> Schedule:
    """Where a segment fits 16-byte vectors of 128-1024 threads, at most 4 a thread: the
    segment held in registers (one read of it, every load of the block in flight at once),
    with blocks a SM asked of ptxas for 9/16 of the SM's 2048 thread slots (`.minnctapersm`:
    9 blocks of 128 threads, 56 registers a thread; more segments in flight a SM); else a
    pass over it a stage. H100, instance norm of 128x256x64x64 bf16 (t128 v8 h4):
    bench/results/2026-12-07-h100-memfamilies-4, 9 blocks a SM 194.2 us (91.2% of copy)
    against 210.1 us without the directive (71 registers, 7 blocks) and 255.4 us with the
    next segment prefetched (94 registers)."""
    v = max(vecs(ir))
    n = _segment(ir, dims)
    t = 128
    while t < 1024 and 4 * t * v < n:
        t *= 2
    h = 1
    while h < 4 and h * t * v < n:
        h *= 2
    m = 2048 // t * 9 // 16
    s = Schedule(threads=t, vec=v, hold=h, minblocks=m if m in MINBLOCKS else 0)
    if h * t * v >= n and is_valid(ir, s, dims)[0]:
        return s
    return streaming_default(ir, dims)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    out = [d]
    t, v, h = d.threads, d.vec, d.hold
    changes = [(2 * t, v, h // 2), (t // 2, v, 2 * h), (t, v, 0), (2 * t, v, h), (t // 2, v, h),
               (t, max(1, v // 2), 2 * h)]  # fmt: skip
    if h:  # the held default without the directive (7 blocks at t128 v8 h4), with the next
        # segment in flight, and that at 6 blocks (80 registers, never timed). One fold of both
        # moments (`moments`) is in the space, not a seed: 25% slower than the default on an
        # H100 (bench/results/2026-12-07-h100-memfamilies-5)
        for p, m, c in ((0, 0, 0), (1, 0, 0), (1, 2048 // t * 6 // 16, 0)):
            if c and moments_pair(ir) is None:
                continue
            c = Schedule(threads=t, vec=v, hold=h, prefetch=p, minblocks=m, moments=c)
            if m in MINBLOCKS and c not in out and is_valid(ir, c, dims)[0]:
                out.append(c)
    for t, v, h in changes:
        s = Schedule(threads=t, vec=v, hold=h if h in HOLDS else 0)
        if t in THREADS and s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


class SegNormKernel(ColumnKernel):
    fast = False  # approximate div/sqrt/tanh (a subclass may allow them)

    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V = s.vec
        self.W = s.threads // 32
        self.nout = 1

    def element(self, node, loaded: dict, seg: dict, memo: dict) -> str:
        """The f32 register (or immediate) of `node` at one element."""
        b = self.b
        if node in memo:
            return memo[node]
        if node in seg:
            r = seg[node]
        elif isinstance(node, E.Input):
            r = loaded[node.name] if node.shape else loaded[node.name]
        elif isinstance(node, E.Const):
            r = f32_literal(node.value)
        elif isinstance(node, E.Unary):
            x = self.reg_of(self.element(node.x, loaded, seg, memo))
            r = OPS.UNARY[node.op](b, x, self.fast)
        elif isinstance(node, E.Binary):
            a = self.reg_of(self.element(node.a, loaded, seg, memo))
            if node.op == "pow":
                r = OPS.pow_const(b, a, node.b.value, self.fast)
            else:
                c = self.reg_of(self.element(node.b, loaded, seg, memo))
                r = OPS.BINARY[node.op](b, a, c, self.fast)
        elif isinstance(node, E.Compare):
            a = self.reg_of(self.element(node.a, loaded, seg, memo))
            c = self.reg_of(self.element(node.b, loaded, seg, memo))
            r = OPS.compare(b, node.op, a, c)
        elif isinstance(node, E.Where):
            p = self.element(node.cond, loaded, seg, memo)
            a = self.element(node.a, loaded, seg, memo)
            c = self.element(node.b, loaded, seg, memo)
            r = b.reg("f32")
            b.op(f"selp.f32 {r}, {a}, {c}, {p}")
        elif isinstance(node, E.Cast):
            r = OPS.cast_round(b, self.reg_of(self.element(node.x, loaded, seg, memo)), node.to)
        else:
            raise EmitError(f"cannot evaluate {type(node).__name__} per element")
        memo[node] = r
        return r

    def walk_segment(self, sbase, N, aligned, per_element) -> None:
        """Call per_element(loaded, j_pred_or_None, vec_index j, whole) over this thread's
        elements of the segment: whole aligned vectors, then elements."""
        b, V, T = self.b, self.V, self.s.threads
        ir = self.ir
        scalars = [n for n, dt in ir.inputs if self.scalar_input(n)]
        j0 = b.reg("b32")
        b.op(f"mul.lo.u32 {j0}, {self.tid}, {V}")
        top, end = b.new_label("seg"), b.new_label("seg_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {j0}, {N}")
        b.op(f"@{pe} bra.uni {end}")
        jend = b.reg("b32")
        b.op(f"add.u32 {jend}, {j0}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {jend}, {N}")
        b.op(f"and.pred {whole}, {whole}, {aligned}")
        at = b.reg("b32")
        b.op(f"add.u32 {at}, {sbase}, {j0}")
        el, nxt = b.new_label("seg_elems"), b.new_label("seg_next")
        b.op(f"@!{whole} bra {el}")
        per = {}
        for name, dtype in ir.inputs:
            if name in scalars:
                continue
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
            per[name] = self.load_vector(addr, dtype)
        per_element(
            [{**{n: per[n][j] for n in per}, **self.scalar_vals} for j in range(V)],
            None,
            at,
        )
        b.op(f"bra.uni {nxt}")
        b.label(el)
        vals, preds = [], []
        for j in range(V):
            qj, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {qj}, {j0}, {j}")
            b.op(f"setp.lt.u32 {pj}, {qj}, {N}")
            ins = {}
            for name, dtype in ir.inputs:
                if name in scalars:
                    continue
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
                ins[name] = self.load_scalar(self.plus(addr, j * ESIZE[dtype]), dtype, pj)
            vals.append({**ins, **self.scalar_vals})
            preds.append(pj)
        per_element(vals, preds, at)
        b.label(nxt)
        b.op(f"add.u32 {j0}, {j0}, {T * V}")
        b.op(f"bra.uni {top}")
        b.label(end)

    def scalar_input(self, name: str) -> bool:
        return any(
            isinstance(n, E.Input) and n.name == name and not n.shape
            for o in self.ir.outputs
            for n in E.walk(o.expr)
        )

    def block_fold(self, v: str, op: str) -> str:
        b = self.b
        for off in (16, 8, 4, 2, 1):
            t = b.reg("f32")
            b.op(f"shfl.sync.bfly.b32 {t}, {v}, {off}, 31, -1")
            b.op(f"{COMBINE[op]} {v}, {v}, {t}")
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {self.lane}, 0")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {self.warp}, 4, {self.smem}")
        b.op(f"@{l0} st.shared.f32 [{at}], {v}")
        b.op("bar.sync 0")
        r = b.reg("f32")
        b.op(f"ld.shared.f32 {r}, [{self.smem}]")
        for w in range(1, self.W):
            t = b.reg("f32")
            b.op(f"ld.shared.f32 {t}, [{self.smem}+{4 * w}]")
            b.op(f"{COMBINE[op]} {r}, {r}, {t}")
        b.op("bar.sync 0")
        return r

    def merge(self, x, y) -> tuple[str, str, str]:
        """Two (count, mean, M2) triples merged; symmetric in x and y to the bit (products and
        sums only, no fused multiply-add), so butterfly partners get the same triple:
        n = na + nb, mean = (na ma + nb mb) / max(n, 1), M2 = M2a + M2b + d^2 na nb / max(n, 1)
        with d = mb - ma (a count of 0 gives 0, not a division by zero)."""
        b = self.b
        (na, ma, qa), (nb, mb, qb) = x, y
        n, nm, t1, t2, m = (b.reg("f32") for _ in range(5))
        b.op(f"add.rn.f32 {n}, {na}, {nb}")
        b.op(f"max.f32 {nm}, {n}, 0f3F800000")
        b.op(f"mul.rn.f32 {t1}, {na}, {ma}")
        b.op(f"mul.rn.f32 {t2}, {nb}, {mb}")
        b.op(f"add.rn.f32 {t1}, {t1}, {t2}")
        b.op(f"div.rn.f32 {m}, {t1}, {nm}")
        d, w, q = b.reg("f32"), b.reg("f32"), b.reg("f32")
        b.op(f"sub.rn.f32 {d}, {mb}, {ma}")
        b.op(f"mul.rn.f32 {d}, {d}, {d}")
        b.op(f"mul.rn.f32 {w}, {na}, {nb}")
        b.op(f"mul.rn.f32 {d}, {d}, {w}")
        b.op(f"div.rn.f32 {d}, {d}, {nm}")
        b.op(f"add.rn.f32 {q}, {qa}, {qb}")
        b.op(f"add.rn.f32 {q}, {q}, {d}")
        return n, m, q

    def moments_fold(self, slots, elems, a, nf) -> tuple[str, str]:
        """(mean of a, mean square of a about it) over the segment by one block-wide fold: each
        thread's count, mean and M2 (sum of squares about its own mean) from its held values in
        a fixed order, merged across the warp by butterflies and across warps in warp order
        from shared memory (every thread the same order: the same bits)."""
        b, V = self.b, self.V
        cnt, s = b.reg("f32"), b.reg("f32")
        b.op(f"mov.f32 {cnt}, 0f00000000")
        b.op(f"mov.f32 {s}, 0f00000000")
        vals = []
        for (p, _, _), slot in zip(slots, elems, strict=True):
            vs = [self.reg_of(self.element(a, loaded, {}, {})) for loaded in slot]
            t = b.reg("f32")
            b.op(f"selp.f32 {t}, {f32_literal(float(V))}, 0f00000000, {p}")
            b.op(f"add.rn.f32 {cnt}, {cnt}, {t}")
            for v in vs:
                u = b.reg("f32")
                b.op(f"selp.f32 {u}, {v}, 0f00000000, {p}")
                b.op(f"add.rn.f32 {s}, {s}, {u}")
            vals.append((p, vs))
        nm, m, q = b.reg("f32"), b.reg("f32"), b.reg("f32")
        b.op(f"max.f32 {nm}, {cnt}, 0f3F800000")
        b.op(f"div.rn.f32 {m}, {s}, {nm}")
        b.op(f"mov.f32 {q}, 0f00000000")
        for p, vs in vals:
            for v in vs:
                d = b.reg("f32")
                b.op(f"sub.rn.f32 {d}, {v}, {m}")
                b.op(f"selp.f32 {d}, {d}, 0f00000000, {p}")
                b.op(f"fma.rn.f32 {q}, {d}, {d}, {q}")
        x = (cnt, m, q)
        for off in (16, 8, 4, 2, 1):
            y = tuple(b.reg("f32") for _ in range(3))
            for r, o in zip(y, x, strict=True):
                b.op(f"shfl.sync.bfly.b32 {r}, {o}, {off}, 31, -1")
            x = self.merge(x, y)
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {self.lane}, 0")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {self.warp}, 12, {self.smem}")
        for i, r in enumerate(x):
            b.op(f"@{l0} st.shared.f32 [{at}+{4 * i}], {r}")
        b.op("bar.sync 0")
        acc = None
        for w in range(self.W):
            y = tuple(b.reg("f32") for _ in range(3))
            for i, r in enumerate(y):
                b.op(f"ld.shared.f32 {r}, [{self.smem}+{12 * w + 4 * i}]")
            acc = y if acc is None else self.merge(acc, y)
        b.op("bar.sync 0")
        var = b.reg("f32")
        b.op(f"div.rn.f32 {var}, {acc[2]}, {nf}")
        return acc[1], var

    def held_segment(self, sbase, N, nf) -> None:
        """The segment read once into registers (vector i of this thread: elements
        (i * threads + tid) * vec .. + vec, each vector whole or outside the segment: N is a
        multiple of vec), every load issued before the first is used; then each stage folds
        the held values and the outputs are computed from them and stored."""
        b, V, T, ir = self.b, self.V, self.s.threads, self.ir
        j0 = b.reg("b32")
        b.op(f"mul.lo.u32 {j0}, {self.tid}, {V}")
        slots = []  # (predicate, element index, {input: raw words})
        for i in range(self.s.hold):
            j, p = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {j}, {j0}, {i * T * V}")
            b.op(f"setp.lt.u32 {p}, {j}, {N}")
            at = b.reg("b32")
            b.op(f"add.u32 {at}, {sbase}, {j}")
            raw = {}
            for name, dtype in ir.inputs:
                if name in self.scalar_vals:
                    continue
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
                raw[name] = self.load_raw(addr, dtype, p)
            slots.append((p, at, raw))
        elems = []  # per slot: V dicts of f32 values
        for _, _, raw in slots:
            per = {name: self.unpack_raw(words, dtype) for (name, dtype) in ir.inputs
                   if name in raw for words in [raw[name]]}  # fmt: skip
            elems.append([{**{n: per[n][e] for n in per}, **self.scalar_vals} for e in range(V)])
        seg: dict = {}
        if self.s.moments:
            mu, var, a = moments_pair(ir)
            seg[mu], seg[var] = self.moments_fold(slots, elems, a, nf)
        for reds in ir.stages if not self.s.moments else ():
            accs = {r: [b.reg("f32") for _ in range(V)] for r in reds}
            for r, row in accs.items():
                for a in row:
                    b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[r.op])}")
            for (p, _, _), slot in zip(slots, elems, strict=True):
                for e, loaded in enumerate(slot):
                    memo: dict = {}
                    for r, row in accs.items():
                        v = self.reg_of(self.element(ir.operand[r][1], loaded, seg, memo))
                        t = b.reg("f32")
                        b.op(f"selp.f32 {t}, {v}, {f32_literal(IDENTITY[r.op])}, {p}")
                        b.op(f"{COMBINE[r.op]} {row[e]}, {row[e]}, {t}")
            for r, row in accs.items():
                for a in row[1:]:
                    b.op(f"{COMBINE[r.op]} {row[0]}, {row[0]}, {a}")
                v = self.block_fold(row[0], r.op)
                if r.op == "mean":
                    m = b.reg("f32")
                    b.op(f"div.rn.f32 {m}, {v}, {nf}")
                    v = m
                seg[r] = v
        for (p, at, _), slot in zip(slots, elems, strict=True):
            for o in ir.outputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[o.dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[o.name]}")
                outs = []
                for loaded in slot:
                    memo = {}
                    outs.append(self.reg_of(self.element(o.expr, loaded, seg, memo)))
                self.store_pred(addr, o.dtype, outs, p)

    def pipelined(self, k, nk, K, N, nf) -> None:
        """Held segments with the next one in flight: two sets of registers (A, B) hold a
        segment each as loaded; the loads of the block's next segment go into one set before
        the other is folded and written, so a block keeps a segment's loads outstanding while
        it computes (the loop unrolled twice, A then B)."""
        b, V, T, ir = self.b, self.V, self.s.threads, self.ir
        es = {name: ESIZE[dtype] for name, dtype in ir.inputs}
        loaded = [n for n, _ in ir.inputs if n not in self.scalar_vals]

        def buffer():
            slots = []
            for _ in range(self.s.hold):
                words = {}
                for name in loaded:
                    nbytes = V * es[name]
                    words[name] = [b.reg("b16")] if nbytes == 2 else [
                        b.reg("b32") for _ in range(nbytes // 4)]  # fmt: skip
                    for r in words[name]:  # defined where a slot is never loaded
                        b.op(f"mov.{'b16' if r.startswith('%h') else 'b32'} {r}, 0")
                slots.append((b.reg("pred"), b.reg("b32"), words))
            return slots

        j0 = b.reg("b32")
        b.op(f"mul.lo.u32 {j0}, {self.tid}, {V}")

        def issue(kk, buf):
            """Segment kk's loads into buf (nothing where kk is past the last segment)."""
            pk, sbase = b.reg("pred"), b.reg("b32")
            b.op(f"setp.lt.u32 {pk}, {kk}, {K}")
            b.op(f"mul.lo.u32 {sbase}, {kk}, {N}")
            for i, (p, at, words) in enumerate(buf):
                j = b.reg("b32")
                b.op(f"add.u32 {j}, {j0}, {i * T * V}")
                b.op(f"setp.lt.u32 {p}, {j}, {N}")
                b.op(f"and.pred {p}, {p}, {pk}")
                b.op(f"add.u32 {at}, {sbase}, {j}")
                for name, dtype in ir.inputs:
                    if name not in loaded:
                        continue
                    addr = b.reg("b64")
                    b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                    b.op(f"add.u64 {addr}, {addr}, {self.base[name]}")
                    self.load_into(addr, words[name], p)

        def fold_and_store(buf):
            slots = [(p, at, {n: ws for n, ws in words.items()}) for p, at, words in buf]
            self.fold_held(slots, nf)

        A, B = buffer(), buffer()
        issue(k, A)
        top, end = b.new_label("piped_top"), b.new_label("piped_end")
        b.label(top)
        pd = b.reg("pred")
        b.op(f"setp.ge.u32 {pd}, {k}, {K}")
        b.op(f"@{pd} bra.uni {end}")
        k2 = b.reg("b32")
        b.op(f"add.u32 {k2}, {k}, {nk}")
        issue(k2, B)
        fold_and_store(A)
        b.op(f"setp.ge.u32 {pd}, {k2}, {K}")
        b.op(f"@{pd} bra.uni {end}")
        b.op(f"add.u32 {k}, {k2}, {nk}")
        issue(k, A)
        fold_and_store(B)
        b.op(f"bra.uni {top}")
        b.label(end)

    def load_into(self, addr: str, words: list[str], pred: str) -> None:
        """The registers `words` (one b16, or b32 words) loaded from addr under `pred`."""
        b = self.b
        if words[0].startswith("%h"):
            b.op(f"@{pred} ld.global.nc.b16 {words[0]}, [{addr}]")
        elif len(words) == 1:
            b.op(f"@{pred} ld.global.nc.b32 {words[0]}, [{addr}]")
        else:
            b.op(f"@{pred} ld.global.nc.v{len(words)}.b32 {{{', '.join(words)}}}, [{addr}]")

    def fold_held(self, slots, nf) -> None:
        """Stages and outputs of a segment whose vectors are held as loaded: slots of
        (predicate, element index, {input: raw words}); each use widens the words again."""
        b, V, ir = self.b, self.V, self.ir
        dtypes = dict(ir.inputs)

        def elems(raw):
            per = {n: self.unpack_raw(ws, dtypes[n]) for n, ws in raw.items()}
            return [{**{n: per[n][e] for n in per}, **self.scalar_vals} for e in range(V)]

        seg: dict = {}
        for reds in ir.stages:
            accs = {r: [b.reg("f32") for _ in range(V)] for r in reds}
            for r, row in accs.items():
                for a in row:
                    b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[r.op])}")
            for p, _, raw in slots:
                for e, loaded in enumerate(elems(raw)):
                    memo: dict = {}
                    for r, row in accs.items():
                        v = self.reg_of(self.element(ir.operand[r][1], loaded, seg, memo))
                        t = b.reg("f32")
                        b.op(f"selp.f32 {t}, {v}, {f32_literal(IDENTITY[r.op])}, {p}")
                        b.op(f"{COMBINE[r.op]} {row[e]}, {row[e]}, {t}")
            for r, row in accs.items():
                for a in row[1:]:
                    b.op(f"{COMBINE[r.op]} {row[0]}, {row[0]}, {a}")
                v = self.block_fold(row[0], r.op)
                if r.op == "mean":
                    m = b.reg("f32")
                    b.op(f"div.rn.f32 {m}, {v}, {nf}")
                    v = m
                seg[r] = v
        for p, at, raw in slots:
            slot = elems(raw)
            for o in ir.outputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[o.dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[o.name]}")
                outs = []
                for loaded in slot:
                    memo = {}
                    outs.append(self.reg_of(self.element(o.expr, loaded, seg, memo)))
                self.store_pred(addr, o.dtype, outs, p)

    def load_raw(self, addr: str, dtype: str, pred: str) -> list[str]:
        """vec elements at addr under `pred`, as loaded (b16 or b32 registers, zero if not)."""
        b, es = self.b, ESIZE[dtype]
        nbytes = self.V * es
        if nbytes == 2:
            h = b.reg("b16")
            b.op(f"mov.b16 {h}, 0")
            b.op(f"@{pred} ld.global.nc.b16 {h}, [{addr}]")
            return [h]
        words = [b.reg("b32") for _ in range(nbytes // 4)]
        for w in words:
            b.op(f"mov.b32 {w}, 0")
        if len(words) == 1:
            b.op(f"@{pred} ld.global.nc.b32 {words[0]}, [{addr}]")
        else:
            b.op(f"@{pred} ld.global.nc.v{len(words)}.b32 {{{', '.join(words)}}}, [{addr}]")
        return words

    def unpack_raw(self, words: list[str], dtype: str) -> list[str]:
        b = self.b
        if ESIZE[dtype] == 2 and self.V == 1:
            return [self.widen16(words[0], dtype)]
        out = []
        for w in words:
            if ESIZE[dtype] == 4:
                f = b.reg("f32")
                b.op(f"mov.b32 {f}, {w}")
                out.append(f)
            else:
                out += self.unpack16(w, dtype)
        return out

    def store_pred(self, addr: str, dtype: str, vals: list[str], pred: str) -> None:
        """Adjacent elements stored at addr (aligned to their size) under `pred`."""
        b, es = self.b, ESIZE[dtype]
        if es == 2 and len(vals) == 1:
            h = b.reg("b16")
            b.op(f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32 {h}, {vals[0]}")
            b.op(f"@{pred} st.global.b16 [{addr}], {h}")
            return
        if es == 4:
            words = vals
        else:
            cvt = "bf16x2" if dtype == "bf16" else "f16x2"
            words = []
            for e in range(0, len(vals), 2):
                w = b.reg("b32")
                b.op(f"cvt.rn.{cvt}.f32 {w}, {vals[e + 1]}, {vals[e]}")
                words.append(w)
        ty = "f32" if es == 4 else "b32"
        for g in range(0, len(words), 4):
            group = words[g : g + 4]
            where = f"[{addr}+{4 * g}]" if g else f"[{addr}]"
            if len(group) == 1:
                b.op(f"@{pred} st.global.{ty} {where}, {group[0]}")
            else:
                b.op(f"@{pred} st.global.v{len(group)}.{ty} {where}, {{{', '.join(group)}}}")

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b = self.ir, self.s, self.b
        V = self.V
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", o.name) for o in ir.outputs]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        K = self.product(ir.shape[: ir.first])
        N = self.product(ir.shape[ir.first :])
        self.base = {}
        for name in [*(n for n, _ in ir.inputs), *(o.name for o in ir.outputs)]:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            self.base[name] = r
        self.scalar_vals = {}
        for name, dtype in ir.inputs:
            if self.scalar_input(name):
                self.scalar_vals[name] = self.load_scalar(self.base[name], dtype, "%p_true")
        self.tid = self.u32("%tid.x")
        self.lane, self.warp = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {self.lane}, {self.tid}, 31")
        b.op(f"shr.u32 {self.warp}, {self.tid}, 5")
        self.smem = self.u32("red_smem")
        nmod = b.reg("b32")
        b.op(f"and.b32 {nmod}, {N}, {V - 1}")
        aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {aligned}, {nmod}, 0")
        nf = b.reg("f32")
        b.op(f"cvt.rn.f32.u32 {nf}, {N}")
        if s.hold:  # the segment fits the held vectors: N <= threads x vec x hold, aligned
            held = b.reg("pred")
            b.op(f"setp.le.u32 {held}, {N}, {s.threads * V * s.hold}")
            b.op(f"and.pred {held}, {held}, {aligned}")
        k, nk = self.u32("%ctaid.x"), self.u32("%nctaid.x")
        top, done = b.new_label("segment"), b.new_label("done")
        if s.prefetch:
            piped = b.new_label("piped")
            b.op(f"@{held} bra.uni {piped}")
        b.label(top)
        pd = b.reg("pred")
        b.op(f"setp.ge.u32 {pd}, {k}, {K}")
        b.op(f"@{pd} bra.uni {done}")
        sbase = b.reg("b32")
        b.op(f"mul.lo.u32 {sbase}, {k}, {N}")
        if s.hold and not s.prefetch:
            held_l, next_l = b.new_label("held"), b.new_label("next")
            b.op(f"@{held} bra.uni {held_l}")
        seg: dict = {}
        for reds in ir.stages:
            accs = {r: [b.reg("f32") for _ in range(V)] for r in reds}
            for r, row in accs.items():
                for a in row:
                    b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[r.op])}")

            def accumulate(elems, preds, at, accs=accs):
                for j, loaded in enumerate(elems):
                    memo: dict = {}
                    for r, row in accs.items():
                        v = self.reg_of(self.element(ir.operand[r][1], loaded, seg, memo))
                        if preds is not None:
                            t = b.reg("f32")
                            b.op(f"selp.f32 {t}, {v}, {f32_literal(IDENTITY[r.op])}, {preds[j]}")
                            v = t
                        b.op(f"{COMBINE[r.op]} {row[j]}, {row[j]}, {v}")

            self.walk_segment(sbase, N, aligned, accumulate)
            for r, row in accs.items():
                for a in row[1:]:
                    b.op(f"{COMBINE[r.op]} {row[0]}, {row[0]}, {a}")
                v = self.block_fold(row[0], r.op)
                if r.op == "mean":
                    m = b.reg("f32")
                    b.op(f"div.rn.f32 {m}, {v}, {nf}")
                    v = m
                seg[r] = v

        def store(elems, preds, at):
            for o in ir.outputs:
                es = ESIZE[o.dtype]
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {es}")
                b.op(f"add.u64 {addr}, {addr}, {self.base[o.name]}")
                outs = []
                for loaded in elems:
                    memo: dict = {}
                    outs.append(self.reg_of(self.element(o.expr, loaded, seg, memo)))
                if preds is None and V > 1:
                    self.store_vector(addr, o.dtype, outs)
                    continue
                for j, v in enumerate(outs):
                    g = f"@{preds[j]} " if preds is not None else ""
                    if es == 4:
                        b.op(f"{g}st.global.f32 [{addr}+{4 * j}], {v}")
                    else:
                        h = b.reg("b16")
                        b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                        b.op(f"{g}st.global.b16 [{addr}+{2 * j}], {h}")

        self.walk_segment(sbase, N, aligned, store)
        if s.hold and not s.prefetch:
            b.op(f"bra.uni {next_l}")
            b.label(held_l)
            self.held_segment(sbase, N, nf)
            b.label(next_l)
        b.op(f"add.u32 {k}, {k}, {nk}")
        b.op(f"bra.uni {top}")
        b.label(done)
        b.op("ret")
        if s.prefetch:
            b.label(piped)
            self.pipelined(k, nk, K, N, nf)
            b.op("ret")
        entry = f"{ident(ir.name)}_segnorm_{s.tag()}"
        # the header names the schedule as before prefetch existed, where it is off
        header = {k: v for k, v in s.to_dict().items() if k not in LATE_FIELDS or v}
        words = 3 * self.W if s.moments else self.W  # moments: a triple a warp
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{words}];"]
        lines = b.lines
        if self.scalar_vals:
            lines = ["    setp.eq.u32 %p_true, 0, 0;", *lines]
            body.append("    .reg .pred %p_true;")
        ptx = module_text(
            family="segnorm", workload=ir.name, schedule=header, arch=self.arch,
            entry=entry, params=params, threads=s.threads, body=body, lines=lines,
        )  # fmt: skip
        if s.minblocks:  # blocks a SM for ptxas: after the entry's thread count
            at = ptx.index("\n", ptx.index(".maxntid"))
            ptx = ptx[:at] + f"\n.minnctapersm {s.minblocks}" + ptx[at:]
        grid = f"min({shape_product(ir.shape[: ir.first])}, {MAX_BLOCKS})"
        return Emitted(ptx, entry, tuple(params), Launch((grid, 1, 1), (s.threads, 1, 1)))


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        return SegNormKernel(ir, s, arch).render()

    return checked_emit("segnorm", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [log2(elements), log2(s.threads), float(s.vec), float(s.hold), float(s.prefetch),
            float(s.minblocks)]  # fmt: skip


LATE_DEFAULTS = {"hold": 0, "prefetch": 0, "minblocks": 0, "moments": 0}
LATE_FIELDS = ("prefetch", "minblocks", "moments")  # left out of the PTX header where 0


def canonical(schedule: dict) -> dict:
    """The schedule without the fields added after the first records, where at their default
    (so a record written before them and one written since name the same schedule)."""
    return {k: v for k, v in schedule.items() if LATE_DEFAULTS.get(k, object()) != v}


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    held = f", held in registers ({s.hold} loads a thread)" if s.hold else ""
    held += ", the next segment loaded while one is computed" if s.prefetch else ""
    held += ", both moments in one fold" if s.moments else ""
    held += f", {s.minblocks} blocks a SM" if s.minblocks else ""
    return f"segment norm: a segment a block of {s.threads} threads x {s.vec} a load{held}"


FAMILY = Family(
    name="segnorm",
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
    legend="segment norm: threads of a segment's block x elements a load",
    features=features,
    feature_fields=("threads", "vec", "hold", "prefetch", "minblocks"),
    roofline=lambda workload, dims: Roofline(bytes=io_bytes(workload, dims)),
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("threads", "vec", "hold", "prefetch", "minblocks", "moments"),
)

__all__ = ["FAMILY", "SegNormIR", "Schedule", "lower"]
