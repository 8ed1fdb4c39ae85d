"""The segment-reduction family: reductions that keep a leading or middle run of axes and reduce
the axes after it (and any before it): batch-norm statistics of an NCHW activation (mean over
N, H, W per channel), instance-norm statistics (mean over H, W per (n, c)), a loss per sample
(mean over every axis but the first).

The operand is viewed as (A, K, B): A the reduced axes before the kept run K (possibly none), B
the reduced axes after it (contiguous, at least one). A cluster of `split` blocks takes one k at
a time (grid-stride over K): thread rows walk A (split over the cluster's blocks), lanes walk B
with 16-byte loads (`unroll` of them in flight a thread where a segment row holds them); every
thread's partial meets the block's in a fixed order (warp butterflies,
then warps in order), the blocks' in rank order through distributed shared memory."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import Builder, f32_literal
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce import ELEMENTWISE, OutputPlan, reduce_chain
from factory.families.colreduce.kernel import ESIZE, IDENTITY, ColumnKernel, ident, shape_product
from factory.families.common import ScheduleDict, checked_emit
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (64, 128, 256, 512)
LANES = (8, 16, 32, 64, 128, 256, 512)
SPLITS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4)
MAX_CLUSTERS = 2048
SMS = 132


@dataclass(frozen=True)
class SegIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[OutputPlan, ...]
    order: tuple[E.Node, ...]
    shape: tuple
    before: tuple  # A
    kept: tuple  # K
    after: tuple  # B
    dims: tuple[str, ...]

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)


def lower(workload) -> SegIR:
    plans, shape, axes_seen = [], None, None
    for o in workload.outputs:
        op, operand, axes = reduce_chain(o.expr)
        if op not in E.REDUCE_OPS + E.EXTRA_REDUCE_OPS:
            raise Unsupported(f"reduction {op} is not supported")
        if o.dtype not in E.FLOAT_DTYPES:
            raise Unsupported(f"output {o.name} is {o.dtype}")
        rank = len(operand.shape)
        kept = [a for a in range(rank) if a not in axes]
        if not kept:
            raise Unsupported("a reduction over every axis (the whole-tensor family)")
        if kept != list(range(kept[0], kept[-1] + 1)):
            raise Unsupported(f"kept axes {tuple(kept)} are not adjacent (one run of axes)")
        if kept[-1] == rank - 1:
            raise Unsupported("the last axis is kept (the column family)")
        if kept[0] == 0 and len(axes) == 1:
            raise Unsupported("one trailing axis reduced: the row family's reduction")
        if shape is not None and (operand.shape, axes) != (shape, axes_seen):
            raise Unsupported("outputs reduce operands of different shapes or axes")
        shape, axes_seen = operand.shape, axes
        plans.append(OutputPlan(o.name, o.dtype, op, operand))
    order, seen, inputs = [], set(), {}
    for p in plans:
        for n in E.walk(p.operand):
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            if not isinstance(n, ELEMENTWISE):
                raise Unsupported(f"{type(n).__name__} inside a segment reduction's operand")
            if isinstance(n, E.Input):
                if n.dtype not in E.FLOAT_DTYPES or n.shape != shape:
                    raise Unsupported(f"input {n.name}: only float inputs of the operand's shape")
                inputs[n.name] = n.dtype
            if isinstance(n, E.Binary) and n.op == "pow" and not isinstance(n.b, E.Const):
                raise Unsupported("pow needs a constant exponent")
            if isinstance(n, E.Cast) and n.to not in E.FLOAT_DTYPES:
                raise Unsupported(f"cast to {n.to}")
            if n.shape not in ((), shape) and not isinstance(n, E.Const):
                raise Unsupported(f"{type(n).__name__} of shape {n.shape} is broadcast")
    if not inputs:
        raise Unsupported("the operand reads no input")
    kept = [a for a in range(len(shape)) if a not in axes_seen]
    return SegIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        outputs=tuple(plans),
        order=tuple(order),
        shape=shape,
        before=shape[: kept[0]],
        kept=shape[kept[0] : kept[-1] + 1],
        after=shape[kept[-1] + 1 :],
        dims=tuple(dict.fromkeys(d for d in shape if isinstance(d, str))),
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads per block: lanes along B (vec elements a load) x thread rows along A; split:
    the blocks of a cluster sharing one kept index, A split over them; unroll: vectors of a
    segment a thread loads at once (all issued before the first is used)."""

    family: str = "segreduce"
    threads: int = 256
    lanes: int = 64
    vec: int = 4
    split: int = 1
    unroll: int = 1

    @property
    def rows(self) -> int:
        return self.threads // self.lanes

    def tag(self) -> str:
        t = f"t{self.threads}l{self.lanes}v{self.vec}s{self.split}"
        return f"{t}u{self.unroll}" if self.unroll > 1 else t


def vecs(ir) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4, 8) if v * ir.max_esize <= 16)


def _size(shape, dims) -> int:
    return math.prod(int(dims[d]) if isinstance(d, str) else int(d) for d in shape)


def is_valid(ir: SegIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "segreduce" or s.threads not in THREADS or s.lanes not in LANES:
        return False, "threads/lanes outside the space"
    if s.lanes > s.threads or s.vec not in vecs(ir) or s.split not in SPLITS:
        return False, "lanes/vec/split outside the space"
    if s.unroll not in UNROLLS:
        return False, "unroll outside the space"
    if s.vec * len(ir.outputs) > 32 or s.vec * s.unroll * len(ir.inputs) > 64:
        return False, "too many registers a thread"
    if dims is not None and _size(ir.before, dims) * _size(ir.after, dims) >= 4096:
        # (smaller segments fill no layout: every one is as good as another there)
        a, b = _size(ir.before, dims), _size(ir.after, dims)
        if s.lanes * s.vec >= 2 * b and not (s.lanes == LANES[0] and s.vec == 1):
            return False, f"{s.lanes} lanes x {s.vec} for segments of {b}: half idle"
        if s.rows > 1 and s.split * s.rows > 2 * a:
            return False, f"{s.split} x {s.rows} thread rows for {a} segments"
        if s.unroll > 1 and (s.unroll - 1) * s.lanes * s.vec + s.vec > b:
            return False, f"{s.unroll} vectors in flight never fit segments of {b}"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    out = []
    for t, ln, v, sp, u in itertools.product(THREADS, LANES, vecs(ir), SPLITS, UNROLLS):
        s = Schedule(threads=t, lanes=ln, vec=v, split=sp, unroll=u)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def _pow2_at_most(x: int) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1, x)))))


def default_schedule(ir, dims) -> Schedule:
    a, k, b = _size(ir.before, dims), _size(ir.kept, dims), _size(ir.after, dims)
    v = max(vecs(ir))
    while v > 1 and LANES[0] * v >= 2 * b:
        v //= 2
    lanes = max(LANES[0], min(256, _pow2_at_most(max(1, b // v))))
    threads = max(lanes, 256)
    while threads // lanes > 1 and (threads // lanes) > 2 * a and threads > THREADS[0]:
        threads //= 2
    threads = max(threads, lanes)
    split = 1
    while split < SPLITS[-1] and k * split < 2 * SMS and 2 * split * (threads // lanes) <= a:
        split *= 2
    # two vectors in flight a thread where a segment row holds two lanes' sweeps
    unroll = 2 if b >= 2 * lanes * v else 1
    s = Schedule(threads=threads, lanes=lanes, vec=v, split=split, unroll=unroll)
    if is_valid(ir, s, dims)[0]:
        return s
    s = Schedule(threads=threads, lanes=lanes, vec=v, split=split)
    return s if is_valid(ir, s, dims)[0] else Schedule(threads=64, lanes=8, vec=1, split=1)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    out = [d]
    for ch in ({"unroll": 4}, {"split": min(8, d.split * 2)}, {"unroll": 1},
               {"split": max(1, d.split // 2)}, {"threads": min(512, d.threads * 2)},
               {"lanes": max(8, d.lanes // 2)}):  # fmt: skip
        s = Schedule(**{**d.to_dict(), **ch})
        if s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


class SegKernel(ColumnKernel):
    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V, self.L, self.S = s.vec, s.lanes, s.split
        self.TR = s.threads // s.lanes
        self.W = s.threads // 32
        self.nout = len(ir.outputs)

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b = self.ir, self.s, self.b
        V, L, S, TR, W, T = self.V, self.L, self.S, self.TR, self.W, s.threads
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", o.name) for o in ir.outputs]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        A, K, B = self.product(ir.before), self.product(ir.kept), self.product(ir.after)
        base = {}
        for name, _ in ir.inputs:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            base[name] = r
        obase = []
        for o in ir.outputs:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(o.name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            obase.append(r)
        tid = self.u32("%tid.x")
        lane, trow, wlane, warp = b.reg("b32"), b.reg("b32"), b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, {L - 1}")
        b.op(f"shr.u32 {trow}, {tid}, {int(math.log2(L))}")
        b.op(f"and.b32 {wlane}, {tid}, 31")
        b.op(f"shr.u32 {warp}, {tid}, 5")
        cl, ncl = b.reg("b32"), b.reg("b32")
        b.op(f"mov.u32 {cl}, %ctaid.x")
        b.op(f"shr.u32 {cl}, {cl}, {int(math.log2(S))}")
        b.op(f"mov.u32 {ncl}, %nctaid.x")
        b.op(f"shr.u32 {ncl}, {ncl}, {int(math.log2(S))}")
        rank = self.u32("%cluster_ctarank") if S > 1 else self.u32(0)
        g = b.reg("b32")
        b.op(f"mad.lo.u32 {g}, {rank}, {TR}, {trow}")
        G = S * TR
        bmod = b.reg("b32")
        b.op(f"and.b32 {bmod}, {B}, {V - 1}")
        aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {aligned}, {bmod}, 0")
        KB = b.reg("b32")
        b.op(f"mul.lo.u32 {KB}, {K}, {B}")
        nf = b.reg("f32")
        ab = b.reg("b32")
        b.op(f"mul.lo.u32 {ab}, {A}, {B}")
        b.op(f"cvt.rn.f32.u32 {nf}, {ab}")
        smem = self.u32("red_smem")
        k = b.reg("b32")
        b.op(f"mov.u32 {k}, {cl}")
        item, done = b.new_label("item"), b.new_label("done")
        b.label(item)
        pd = b.reg("pred")
        b.op(f"setp.ge.u32 {pd}, {k}, {K}")
        b.op(f"@{pd} bra.uni {done}")
        accs = [[b.reg("f32") for _ in range(V)] for _ in ir.outputs]
        for o, row in zip(ir.outputs, accs, strict=True):
            for a_ in row:
                b.op(f"mov.f32 {a_}, {f32_literal(IDENTITY[o.op])}")
        a = b.reg("b32")
        b.op(f"mov.u32 {a}, {g}")
        rows, rows_end = b.new_label("rows"), b.new_label("rows_end")
        b.label(rows)
        pa = b.reg("pred")
        b.op(f"setp.ge.u32 {pa}, {a}, {A}")
        b.op(f"@{pa} bra.uni {rows_end}")
        seg = b.reg("b32")  # the segment's first element: (a * K + k) * B
        b.op(f"mad.lo.u32 {seg}, {a}, {KB}, 0")
        b.op(f"mad.lo.u32 {seg}, {k}, {B}, {seg}")
        j = b.reg("b32")
        b.op(f"mul.lo.u32 {j}, {lane}, {V}")
        cols, cols_end = b.new_label("cols"), b.new_label("cols_end")
        if s.unroll > 1:
            self.wide_sweeps(j, B, seg, aligned, base, accs, cols)
        b.label(cols)
        pj = b.reg("pred")
        b.op(f"setp.ge.u32 {pj}, {j}, {B}")
        b.op(f"@{pj} bra.uni {cols_end}")
        jend = b.reg("b32")
        b.op(f"add.u32 {jend}, {j}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {jend}, {B}")
        b.op(f"and.pred {whole}, {whole}, {aligned}")
        at = b.reg("b32")
        b.op(f"add.u32 {at}, {seg}, {j}")
        elems, next_ = b.new_label("elems"), b.new_label("next")
        b.op(f"@!{whole} bra {elems}")
        per = {}
        for name, dtype in ir.inputs:
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {base[name]}")
            per[name] = self.load_vector(addr, dtype)
        for jj in range(V):
            vals = self.evaluate({name: per[name][jj] for name, _ in ir.inputs})
            for o, row, v in zip(ir.outputs, accs, vals, strict=True):
                self.combine(row[jj], v, o.op)
        b.op(f"bra.uni {next_}")
        b.label(elems)
        for jj in range(V):
            q, pq = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {q}, {j}, {jj}")
            b.op(f"setp.lt.u32 {pq}, {q}, {B}")
            ins = {}
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"add.u32 {q}, {q}, {seg}")
                b.op(f"mul.wide.u32 {addr}, {q}, {ESIZE[dtype]}")
                b.op(f"sub.u32 {q}, {q}, {seg}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                ins[name] = self.load_scalar(addr, dtype, pq)
            vals = self.evaluate(ins)
            for o, row, v in zip(ir.outputs, accs, vals, strict=True):
                t = b.reg("f32")
                b.op(f"selp.f32 {t}, {v}, {f32_literal(IDENTITY[o.op])}, {pq}")
                self.combine(row[jj], t, o.op)
        b.label(next_)
        b.op(f"add.u32 {j}, {j}, {L * V}")
        b.op(f"bra.uni {cols}")
        b.label(cols_end)
        b.op(f"add.u32 {a}, {a}, {G}")
        b.op(f"bra.uni {rows}")
        b.label(rows_end)
        # every thread's partial, in a fixed order: its V, lanes by butterfly, warps in order
        vals = []
        for o, row in zip(ir.outputs, accs, strict=True):
            for x in row[1:]:
                self.combine(row[0], x, o.op)
            vals.append(row[0])
        for off in (16, 8, 4, 2, 1):
            for o, v in zip(ir.outputs, vals, strict=True):
                t = b.reg("f32")
                b.op(f"shfl.sync.bfly.b32 {t}, {v}, {off}, 31, -1")
                self.combine(v, t, o.op)
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {wlane}, 0")
        wat = b.reg("b32")
        b.op(f"mad.lo.u32 {wat}, {warp}, {4 * self.nout}, {smem}")
        for q, v in enumerate(vals):
            b.op(f"@{l0} st.shared.f32 [{wat}+{4 * q}], {v}")
        b.op("bar.sync 0")
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {tid}, 0")
        skip = b.new_label("warps_met")
        b.op(f"@!{t0} bra {skip}")
        for w in range(1, W):
            for q, (o, v) in enumerate(zip(ir.outputs, vals, strict=True)):
                t = b.reg("f32")
                b.op(f"ld.shared.f32 {t}, [{smem}+{4 * (w * self.nout + q)}]")
                self.combine(v, t, o.op)
        top = W * self.nout
        if S > 1:
            for q, v in enumerate(vals):
                b.op(f"st.shared.f32 [{smem}+{4 * (top + q)}], {v}")
        b.label(skip)
        if S > 1:
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            writer = b.reg("pred")
            b.op(f"setp.eq.u32 {writer}, {rank}, 0")
            b.op(f"and.pred {writer}, {writer}, {t0}")
            gathered = b.new_label("gathered")
            b.op(f"@!{writer} bra {gathered}")
            for r in range(1, S):
                remote = b.reg("b32")
                b.op(f"mapa.shared::cluster.u32 {remote}, {smem}, {r}")
                for q, (o, v) in enumerate(zip(ir.outputs, vals, strict=True)):
                    t = b.reg("f32")
                    b.op(f"ld.shared::cluster.f32 {t}, [{remote}+{4 * (top + q)}]")
                    self.combine(v, t, o.op)
            b.label(gathered)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
        else:
            writer = t0
        stored = b.new_label("stored")
        b.op(f"@!{writer} bra {stored}")
        for o, v, ob in zip(ir.outputs, vals, obase, strict=True):
            if o.op == "mean":
                m = b.reg("f32")
                b.op(f"div.rn.f32 {m}, {v}, {nf}")
                v = m
            es = ESIZE[o.dtype]
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {k}, {es}")
            b.op(f"add.u64 {addr}, {addr}, {ob}")
            if es == 4:
                b.op(f"st.global.f32 [{addr}], {v}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                b.op(f"st.global.b16 [{addr}], {h}")
        b.label(stored)
        b.op("bar.sync 0")  # the next item's slots are written after this one's are read
        b.op(f"add.u32 {k}, {k}, {ncl}")
        b.op(f"bra.uni {item}")
        b.label(done)
        b.op("ret")
        entry = f"{ident(ir.name)}_segreduce_{s.tag()}"
        words = W * self.nout + self.nout
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{words}];"]
        ptx = module_text(
            family="segreduce", workload=ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=T, body=body, lines=b.lines, cluster=S,
        )  # fmt: skip
        clusters = f"min({shape_product(ir.kept)}, {MAX_CLUSTERS})"
        grid = f"{S}*{clusters}" if S > 1 else clusters
        launch = Launch((grid, 1, 1), (T, 1, 1), cluster=(S, 1, 1) if S > 1 else None)
        return Emitted(ptx, entry, tuple(params), launch)


def _wide_sweeps(self, j, B, seg, aligned, base, accs, cols) -> None:
    """While `unroll` whole vectors of this thread (L x V apart) lie inside the segment row
    (B a multiple of V): load them all, then fold them in order; the vectors left go one at a
    time (the loop at `cols`)."""
    b, U, L, V = self.b, self.s.unroll, self.L, self.V
    ir = self.ir
    wide = b.new_label("wide")
    b.op(f"@!{aligned} bra {cols}")
    b.label(wide)
    last = b.reg("b32")
    b.op(f"add.u32 {last}, {j}, {(U - 1) * L * V + V}")
    pw = b.reg("pred")
    b.op(f"setp.gt.u32 {pw}, {last}, {B}")
    b.op(f"@{pw} bra {cols}")
    at = b.reg("b32")
    b.op(f"add.u32 {at}, {seg}, {j}")
    loaded = []
    for u in range(U):
        per = {}
        for name, dtype in ir.inputs:
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {base[name]}")
            per[name] = self.load_vector(self.plus(addr, u * L * V * ESIZE[dtype]), dtype)
        loaded.append(per)
    for per in loaded:
        for jj in range(V):
            vals = self.evaluate({name: per[name][jj] for name, _ in ir.inputs})
            for o, row, v in zip(ir.outputs, accs, vals, strict=True):
                self.combine(row[jj], v, o.op)
    b.op(f"add.u32 {j}, {j}, {U * L * V}")
    b.op(f"bra {wide}")


SegKernel.wide_sweeps = _wide_sweeps


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        return SegKernel(ir, s, arch).render()

    return checked_emit("segreduce", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [log2(elements), log2(s.threads), log2(s.lanes), float(s.vec * 4), float(s.split),
            float(s.unroll)]  # fmt: skip


LATE_DEFAULTS = {"unroll": 1}


def canonical(schedule: dict) -> dict:
    """The schedule without the fields added after the first records, where at their default
    (so a record written before them and one written since name the same schedule)."""
    return {k: v for k, v in schedule.items() if LATE_DEFAULTS.get(k, object()) != v}


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    return (
        f"segments: a kept index a cluster of {s.split}, {s.threads} threads = {s.lanes} lanes "
        f"x {s.vec} along the segment, {s.rows} thread rows, {s.unroll} loads in flight"
    )


FAMILY = Family(
    name="segreduce",
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
    legend="segments: cluster size, lanes along the contiguous reduced axes x elements a load, "
    "thread rows along the reduced axes before the kept ones",
    features=features,
    feature_fields=("threads", "lanes", "vec", "split", "unroll"),
    roofline=lambda workload, dims: Roofline(bytes=io_bytes(workload, dims)),
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("threads", "lanes", "split"),
)

__all__ = ["FAMILY", "SegIR", "Schedule", "lower"]
