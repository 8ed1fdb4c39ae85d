"""The pooling family: maxpool/avgpool over the trailing one or two axes (a 1-D window along the
last axis, or 2-D over the last two: NCHW max pooling), of an elementwise expression of inputs of
the pooled tensor's shape.

Two layouts (the schedule's `layout`). "strip" (the default where it fits; pool/strip.py): a
lane owns `vec` adjacent outputs of a row and walks a band of consecutive output rows, loading
each input row once as one vector (plus the window's halo columns) and carrying the rows two
windows share in registers, `unroll` output rows' loads in flight at once. "window": a block
takes one plane (grid-stride over planes), thread rows walk the output rows, lanes `vec`
adjacent outputs each, and every window element is read under its own predicate, the
overlapping windows' reuse left to the L1 and L2 caches. In both, a window element outside the
axis is the padding: -inf for max, a counted zero for avg (torch's count_include_pad)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import Builder, f32_literal
from factory.families.base import Family, Roofline, Unsupported, log2
from factory.families.colreduce import operand_inputs
from factory.families.colreduce.kernel import ESIZE, ColumnKernel, ident, shape_product
from factory.families.common import ScheduleDict, checked_emit
from factory.families.pool.strip import StripKernel, strip_ok
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (64, 128, 256, 512)
LANES = (8, 16, 32, 64, 128)
VECS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4)
MINBLOCKS = (0, 8, 10, 12, 16, 20)
LAYOUTS = ("window", "strip")
MAX_BLOCKS = 65535


@dataclass(frozen=True)
class PoolIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    out: str
    out_dtype: str
    op: str  # max / avg
    operand: E.Node
    order: tuple[E.Node, ...]
    shape: tuple  # the operand's
    out_shape: tuple
    window: tuple[int, int]  # (kh, kw); kh = 1 for a 1-D pool
    stride: tuple[int, int]
    padding: tuple[int, int]
    nd: int
    dims: tuple[str, ...]  # input dims, then the derived dims of the pooled axes

    @property
    def outputs(self):  # ColumnKernel.evaluate reads outputs[i].operand
        return (self,)


def lower(workload) -> PoolIR:
    if len(workload.outputs) != 1:
        raise Unsupported("the pooling family writes one output")
    o = workload.outputs[0]
    n = o.expr
    if not isinstance(n, E.Pool):
        raise Unsupported("an output that is not a maxpool/avgpool")
    if o.dtype not in E.FLOAT_DTYPES:
        raise Unsupported(f"output {o.name} is {o.dtype}")
    order, inputs = operand_inputs(
        n.x, n.x.shape, inside="a pooling's operand", of_shape="the pooled shape"
    )
    if not inputs:
        raise Unsupported("the pooling reads no input")
    nd = len(n.window)
    pad1 = (lambda t: (1, *t)) if nd == 1 else (lambda t: t)
    dims = [d for d in n.x.shape if isinstance(d, str)]
    dims += [d for d in n.shape if isinstance(d, str) and d not in dims]
    return PoolIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        out=o.name,
        out_dtype=o.dtype,
        op=n.op,
        operand=n.x,
        order=tuple(order),
        shape=n.x.shape,
        out_shape=n.shape,
        window=pad1(n.window),
        stride=pad1(n.stride),
        padding=(0, *n.padding) if nd == 1 else n.padding,
        nd=nd,
        dims=tuple(dict.fromkeys(dims)),
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads per block = lanes (along an output row, vec outputs each) x thread rows; the
    strip layout's thread rows walk bands of output rows, `unroll` rows a step; minblocks
    (strip): blocks a SM asked of ptxas (`.minnctapersm`, capping registers; 0: none)."""

    family: str = "pool"
    threads: int = 256
    lanes: int = 32
    vec: int = 2
    layout: str = "window"
    unroll: int = 1
    minblocks: int = 0

    def tag(self) -> str:
        t = f"t{self.threads}l{self.lanes}v{self.vec}"
        t = t if self.layout == "window" else f"{t}s{self.unroll}"
        return f"{t}m{self.minblocks}" if self.minblocks else t

    def header(self) -> dict:
        """The schedule as the PTX header names it (minblocks, added late, left out at 0)."""
        return {k: v for k, v in self.to_dict().items() if k != "minblocks" or v}


def _dim(d, dims) -> int:
    return int(dims[d]) if isinstance(d, str) else int(d)


def _out_hw(ir, dims) -> tuple[int, int]:
    ow = _dim(ir.out_shape[-1], dims)
    oh = _dim(ir.out_shape[-2], dims) if ir.nd == 2 else 1
    return oh, ow


def is_valid(ir: PoolIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "pool" or s.threads not in THREADS or s.lanes not in LANES:
        return False, "threads/lanes outside the space"
    if s.lanes > s.threads or s.vec not in VECS:
        return False, "lanes/vec outside the space"
    if s.layout not in LAYOUTS or s.unroll not in UNROLLS:
        return False, "layout/unroll outside the space"
    if s.layout == "window" and (s.vec > 4 or s.unroll != 1 or s.minblocks):
        return False, "the window layout takes vec <= 4, no unroll, no minblocks"
    if s.minblocks not in MINBLOCKS or s.minblocks * s.threads > 2048:
        return False, f"{s.minblocks} blocks of {s.threads} threads a SM"
    if s.minblocks and 65536 // (s.minblocks * s.threads) < (48 if s.unroll <= 2 else 64):
        # the registers the directive leaves a thread: under 48 (two rows a step) or 64
        # (four) ptxas spills the strip's rows (3x3/2 bf16 max-pool, sm_90a)
        return False, f"{s.minblocks} blocks of {s.threads} threads: too few registers"
    if s.layout == "strip":
        ok, why = strip_ok(ir, s.vec, s.unroll)
        if not ok:
            return False, why
    if dims is not None:
        oh, ow = _out_hw(ir, dims)
        if oh * ow >= 1024:  # (smaller planes fill no layout)
            if s.lanes * s.vec >= 2 * ow and not (s.lanes == LANES[0] and s.vec == 1):
                return False, f"{s.lanes} lanes x {s.vec} for output rows of {ow}: half idle"
            strip_1d = s.layout == "strip" and ir.nd == 1  # (its thread rows take rows)
            if s.threads // s.lanes > 2 * oh and not strip_1d:
                return False, f"{s.threads // s.lanes} thread rows for {oh} output rows"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    out = []
    shapes = [("window", 1)] + [("strip", u) for u in UNROLLS]
    for t, ln, v, (lay, u), m in itertools.product(THREADS, LANES, VECS, shapes, MINBLOCKS):
        s = Schedule(threads=t, lanes=ln, vec=v, layout=lay, unroll=u, minblocks=m)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def strip_default(ir, dims) -> Schedule | None:
    """16 bytes of input a lane a row (vec = 16 / (stride_w x the widest input's size)), the
    fewest lanes that cover an output row (at least 8, at most 32; 128 for a 1-D pool), 128
    threads for a 2-D pool (fewer where thread rows would outnumber output rows; 256 for 1-D),
    two output rows a step (1-D: four rows of the leading axes), and for a 2-D pool blocks a
    SM asked of ptxas for 10/16 of the SM's 2048 thread slots (`.minnctapersm` 10 at 128
    threads: 48 registers a thread against 72 without, 10 blocks a SM against 7); None where
    the strip layout does not fit. H100, 3x3/2 max pool of 168x64x112x112 bf16:
    bench/results/2026-12-07-h100-memfamilies-3, 128 threads 124.8 us (88.5% of copy), 256
    threads 137.5 us, 256 threads with four rows a step 170.4 us; -4, 128 threads at 10
    blocks a SM 119.8 us (92.7%) against 127.7 us without the directive, 64 threads 126.1."""
    oh, ow = _out_hw(ir, dims)
    es = max(ESIZE[d] for _, d in ir.inputs)
    v = 16 // (ir.stride[1] * es) if 16 % (ir.stride[1] * es) == 0 else 0
    while v > 1 and LANES[0] * v >= 2 * ow:
        v //= 2
    if v not in VECS:
        return None
    lanes = LANES[0]
    widest = 32 if ir.nd == 2 else LANES[-1]
    while lanes < widest and lanes * v < ow:
        lanes *= 2
    threads = 128 if ir.nd == 2 else 256
    while ir.nd == 2 and threads > THREADS[0] and threads // lanes > oh:
        threads //= 2
    unroll = 2 if ir.nd == 2 else 4  # 1-D: rows of the leading axes, four at once
    threads = max(threads, lanes)
    m = 2048 // threads * 10 // 16 if ir.nd == 2 else 0  # (1-D: never timed with it)
    m = m if m in MINBLOCKS else 0
    s = Schedule(threads=threads, lanes=lanes, vec=v, layout="strip", unroll=unroll, minblocks=m)
    if m and not is_valid(ir, s, dims)[0]:
        s = Schedule(**{**s.to_dict(), "minblocks": 0})
    return s if is_valid(ir, s, dims)[0] else None


def default_schedule(ir, dims) -> Schedule:
    strip = strip_default(ir, dims)
    if strip is not None:
        return strip
    return window_default(ir, dims)


def window_default(ir, dims) -> Schedule:
    oh, ow = _out_hw(ir, dims)
    v = 2
    while v > 1 and LANES[0] * v >= 2 * ow:
        v //= 2
    lanes = 32
    while lanes > LANES[0] and lanes * v >= 2 * ow:
        lanes //= 2
    threads = 256
    while threads > THREADS[0] and threads // lanes > 2 * oh:
        threads //= 2
    s = Schedule(threads=max(threads, lanes), lanes=lanes, vec=v)
    return s if is_valid(ir, s, dims)[0] else Schedule(threads=64, lanes=8, vec=1)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    out = [d]
    # the strip without the blocks-a-SM directive (the default before -4: 72 registers for
    # the 3x3/2 bf16 max-pool, 7 blocks a SM), 64 threads at 20 blocks a SM, and without
    fewer = {"minblocks": 0} if d.layout == "strip" else {}
    changes = [fewer, {"threads": 64, "minblocks": 20}, {"threads": 64, "minblocks": 0},
               {"threads": 256, "minblocks": 0}, {"unroll": 1}, {"unroll": 4, "minblocks": 0},
               {"threads": 512, "minblocks": 0}, {"vec": d.vec // 2 or 1}]  # fmt: skip
    if d.layout == "strip":
        changes.append(window_default(ir, dims).to_dict())
    else:
        changes += [{"vec": 1}, {"vec": 4}, {"threads": 128}, {"threads": 512}, {"lanes": 64}]
    for ch in changes:
        s = Schedule(**{**d.to_dict(), **ch})
        if s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


class PoolKernel(ColumnKernel):
    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V = s.vec
        self.nout = 1

    def bases_and_lanes(self, L: int):
        """Every tensor's global address (its pointer parameter) and the thread's lane and
        thread row (lanes of L threads side by side)."""
        b = self.b
        base = {}
        for name in [*(n for n, _ in self.ir.inputs), self.ir.out]:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            base[name] = r
        tid = self.u32("%tid.x")
        lane, trow = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, {L - 1}")
        b.op(f"shr.u32 {trow}, {tid}, {int(math.log2(L))}")
        return base, tid, lane, trow

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b = self.ir, self.s, self.b
        V, T, L = self.V, s.threads, s.lanes
        TR = T // L
        nd = ir.nd
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", ir.out)]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        planes = self.product(ir.shape[:-nd])
        H = self.dim_reg(ir.shape[-2]) if nd == 2 else self.u32(1)
        W = self.dim_reg(ir.shape[-1])
        OH = self.dim_reg(ir.out_shape[-2]) if nd == 2 else self.u32(1)
        OW = self.dim_reg(ir.out_shape[-1])
        base, tid, lane, trow = self.bases_and_lanes(L)
        plane, nplanes = self.u32("%ctaid.x"), self.u32("%nctaid.x")
        HW, OHW = b.reg("b32"), b.reg("b32")
        b.op(f"mul.lo.u32 {HW}, {H}, {W}")
        b.op(f"mul.lo.u32 {OHW}, {OH}, {OW}")
        (kh_, kw_), (sh, sw), (ph, pw) = ir.window, ir.stride, ir.padding
        pad_value = f32_literal(-math.inf if ir.op == "max" else 0.0)
        combine = "max.f32" if ir.op == "max" else "add.f32"
        top_p, end_p = b.new_label("plane"), b.new_label("plane_end")
        b.label(top_p)
        pp = b.reg("pred")
        b.op(f"setp.ge.u32 {pp}, {plane}, {planes}")
        b.op(f"@{pp} bra.uni {end_p}")
        ibase, obase = b.reg("b32"), b.reg("b32")
        b.op(f"mul.lo.u32 {ibase}, {plane}, {HW}")
        b.op(f"mul.lo.u32 {obase}, {plane}, {OHW}")
        oh = b.reg("b32")
        b.op(f"mov.u32 {oh}, {trow}")
        top_r, end_r = b.new_label("orow"), b.new_label("orow_end")
        b.label(top_r)
        pr = b.reg("pred")
        b.op(f"setp.ge.u32 {pr}, {oh}, {OH}")
        b.op(f"@{pr} bra.uni {end_r}")
        ih0 = b.reg("b32")  # the window's first input row (may wrap below 0: then > H)
        b.op(f"mul.lo.u32 {ih0}, {oh}, {sh}")
        b.op(f"sub.u32 {ih0}, {ih0}, {ph}")
        ow0 = b.reg("b32")
        b.op(f"mul.lo.u32 {ow0}, {lane}, {V}")
        top_c, end_c = b.new_label("ocol"), b.new_label("ocol_end")
        b.label(top_c)
        pc = b.reg("pred")
        b.op(f"setp.ge.u32 {pc}, {ow0}, {OW}")
        b.op(f"@{pc} bra.uni {end_c}")
        for j in range(V):
            ow, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {ow}, {ow0}, {j}")
            b.op(f"setp.lt.u32 {pj}, {ow}, {OW}")
            iw0 = b.reg("b32")
            b.op(f"mul.lo.u32 {iw0}, {ow}, {sw}")
            b.op(f"sub.u32 {iw0}, {iw0}, {pw}")
            acc = b.reg("f32")
            b.op(f"mov.f32 {acc}, {pad_value if ir.op == 'max' else f32_literal(0.0)}")
            for dh in range(kh_):
                ih, vh = b.reg("b32"), b.reg("pred")
                b.op(f"add.u32 {ih}, {ih0}, {dh}")
                b.op(f"setp.lt.u32 {vh}, {ih}, {H}")  # also false for rows before 0
                b.op(f"and.pred {vh}, {vh}, {pj}")
                row = b.reg("b32")
                b.op(f"mad.lo.u32 {row}, {ih}, {W}, {ibase}")
                for dw in range(kw_):
                    iw, ok = b.reg("b32"), b.reg("pred")
                    b.op(f"add.u32 {iw}, {iw0}, {dw}")
                    b.op(f"setp.lt.u32 {ok}, {iw}, {W}")
                    b.op(f"and.pred {ok}, {ok}, {vh}")
                    at = b.reg("b32")
                    b.op(f"add.u32 {at}, {row}, {iw}")
                    ins = {}
                    for name, dtype in ir.inputs:
                        addr = b.reg("b64")
                        b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                        b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                        ins[name] = self.load_scalar(addr, dtype, ok)
                    v = self.evaluate(ins)[0]
                    t = b.reg("f32")
                    b.op(f"selp.f32 {t}, {v}, {pad_value}, {ok}")
                    b.op(f"{combine} {acc}, {acc}, {t}")
            if ir.op == "avg":
                b.op(f"div.rn.f32 {acc}, {acc}, {f32_literal(float(kh_ * kw_))}")
            oat = b.reg("b32")
            b.op(f"mad.lo.u32 {oat}, {oh}, {OW}, {obase}")
            b.op(f"add.u32 {oat}, {oat}, {ow}")
            es = ESIZE[ir.out_dtype]
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {oat}, {es}")
            b.op(f"add.u64 {addr}, {addr}, {base[ir.out]}")
            if es == 4:
                b.op(f"@{pj} st.global.f32 [{addr}], {acc}")
            else:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if ir.out_dtype == 'bf16' else 'f16'}.f32 {h}, {acc}")
                b.op(f"@{pj} st.global.b16 [{addr}], {h}")
        b.op(f"add.u32 {ow0}, {ow0}, {L * V}")
        b.op(f"bra.uni {top_c}")
        b.label(end_c)
        b.op(f"add.u32 {oh}, {oh}, {TR}")
        b.op(f"bra.uni {top_r}")
        b.label(end_r)
        b.op(f"add.u32 {plane}, {plane}, {nplanes}")
        b.op(f"bra.uni {top_p}")
        b.label(end_p)
        b.op("ret")
        entry = f"{ident(ir.name)}_{ir.op}pool_{s.tag()}"
        ptx = module_text(
            family="pool", workload=ir.name, schedule=s.header(), arch=self.arch,
            entry=entry, params=params, threads=T, body=b.declarations(), lines=b.lines,
        )  # fmt: skip
        grid = f"min({shape_product(ir.shape[:-nd])}, {MAX_BLOCKS})"
        return Emitted(ptx, entry, tuple(params), Launch((grid, 1, 1), (T, 1, 1)))


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        if s.layout == "strip":
            return StripKernel(PoolKernel(ir, s, arch)).render()
        return PoolKernel(ir, s, arch).render()

    return checked_emit("pool", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def roofline(workload, dims) -> Roofline:
    """Every input read once, the output written once (derived dims from the shape row)."""
    total = 0.0
    for t in (*workload.inputs, *workload.outputs):
        total += math.prod(_dim(d, dims) for d in t.shape) * E.DTYPE_BYTES.get(t.dtype, 4)
    return Roofline(bytes=total)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [log2(elements), log2(s.threads), log2(s.lanes), float(s.vec),
            float(s.layout == "strip"), float(s.unroll), float(s.minblocks)]  # fmt: skip


LATE_DEFAULTS = {"layout": "window", "unroll": 1, "minblocks": 0}


def canonical(schedule: dict) -> dict:
    """The schedule without the fields added after the first records, where at their default
    (so a record written before them and one written since name the same schedule)."""
    return {k: v for k, v in schedule.items() if LATE_DEFAULTS.get(k, object()) != v}


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    if s.layout == "strip":
        return (
            f"pool strip: a plane a block of {s.threads} threads = {s.lanes} lanes x {s.vec} "
            f"outputs, {s.threads // s.lanes} bands of output rows, {s.unroll} rows a step"
            + (f", {s.minblocks} blocks a SM" if s.minblocks else "")
        )
    return (
        f"pool: a plane a block of {s.threads} threads = {s.lanes} lanes x {s.vec} outputs, "
        f"{s.threads // s.lanes} output rows at a time"
    )


FAMILY = Family(
    name="pool",
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
    legend="pool: lanes along an output row x outputs a lane, thread rows over output rows",
    features=features,
    feature_fields=("threads", "lanes", "vec", "layout", "unroll", "minblocks"),
    roofline=roofline,
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("threads", "lanes", "vec", "layout", "unroll", "minblocks"),
)

__all__ = ["FAMILY", "PoolIR", "Schedule", "lower"]
