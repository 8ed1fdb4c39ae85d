"""The arg-reduction family: argmax/argmin along any axis of an elementwise expression of
inputs of one shape, to an int32 or int64 index (greedy sampling, routing): along the last
axis one row a block; along a leading or middle axis the column family's (P, R, Q) layout (lanes
along Q, thread rows and a cluster's blocks along R), a (value, index) pair a column.

Each thread walks its row's chunks of threads x vec elements carrying a (value, index) pair;
the pairs meet by warp butterflies, then across warps through shared memory. A pair wins when
its value is larger (smaller for argmin), or it is NaN and the other is not, or the values tie
(NaN ties NaN) and its index is smaller: numpy's answer, the first index on ties, whatever the
order of the combinations. Exact: verified bit for bit."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import Builder, f32_literal
from factory.families.base import Family, Roofline, Unsupported, io_bytes, log2
from factory.families.colreduce import operand_inputs
from factory.families.colreduce.kernel import (
    ESIZE,
    MAX_CLUSTERS,
    ColumnKernel,
    ident,
    shape_product,
)
from factory.families.common import ScheduleDict, checked_emit
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

ARCHS = ("sm_90", "sm_100")
THREADS = (32, 64, 128, 256, 512, 1024)
UNROLLS = (1, 2)


@dataclass(frozen=True)
class ArgIR:
    name: str
    inputs: tuple[tuple[str, str], ...]
    out: str
    out_dtype: str
    op: str  # argmax / argmin
    operand: E.Node
    order: tuple[E.Node, ...]
    shape: tuple  # the operand's
    dims: tuple[str, ...]
    axis: int = -1  # non-negative; the last: a row a block, else columns

    @property
    def columns(self) -> bool:
        return self.axis != len(self.shape) - 1

    @property
    def outputs(self):  # ColumnKernel.evaluate reads outputs[i].operand
        return (self,)

    @property
    def max_esize(self) -> int:
        return max(E.DTYPE_BYTES[d] for _, d in self.inputs)


def lower(workload) -> ArgIR:
    if len(workload.outputs) != 1:
        raise Unsupported("the arg-reduction family writes one index output")
    o = workload.outputs[0]
    n = o.expr
    if not isinstance(n, E.ArgReduce):
        raise Unsupported("an output that is not an argmax/argmin")
    if o.dtype not in E.INDEX_DTYPES:
        raise Unsupported(f"output {o.name} is {o.dtype}: declare int32 or int64")
    order, inputs = operand_inputs(
        n.x, n.x.shape, inside="an argmax/argmin's operand", of_shape="the operand's shape"
    )
    if not inputs:
        raise Unsupported("the operand reads no input")
    return ArgIR(
        name=workload.name.replace("-", "_"),
        inputs=tuple(inputs.items()),
        out=o.name,
        out_dtype=o.dtype,
        op=n.op,
        operand=n.x,
        order=tuple(order),
        shape=n.x.shape,
        dims=tuple(dict.fromkeys(d for d in n.x.shape if isinstance(d, str))),
        axis=n.axis,
    )


@dataclass(frozen=True)
class Schedule(ScheduleDict):
    """threads: a block; vec: adjacent elements a load; unroll: loads in flight (rows).
    Along a leading or middle axis (columns): lanes along the kept inner axes, the rest of the
    threads rows along the reduced axis, split: a cluster's blocks sharing it."""

    family: str = "argreduce"
    threads: int = 256
    vec: int = 4
    unroll: int = 2
    lanes: int = 32
    split: int = 1

    def tag(self) -> str:
        if self.split > 1 or self.lanes != 32:
            return f"t{self.threads}l{self.lanes}v{self.vec}s{self.split}"
        return f"t{self.threads}v{self.vec}u{self.unroll}"


def vecs(ir) -> tuple[int, ...]:
    return tuple(v for v in (1, 2, 4, 8) if v * ir.max_esize <= 16)


def _row(ir, dims) -> int:
    d = ir.shape[ir.axis]
    return int(dims[d]) if isinstance(d, str) else int(d)


def _size(shape, dims) -> int:
    return math.prod(int(dims[d]) if isinstance(d, str) else int(d) for d in shape)


LANES = (8, 16, 32, 64, 128)
MAX_SMEM_BYTES = 48 * 1024  # static shared memory of a block
SPLITS = (1, 2, 4, 8)


def is_valid(ir: ArgIR, s: Schedule, dims) -> tuple[bool, str]:
    if s.family != "argreduce" or s.threads not in THREADS or s.vec not in vecs(ir):
        return False, "threads/vec outside the space"
    if s.unroll not in UNROLLS:
        return False, "unroll outside the space"
    if ir.columns:
        if s.lanes not in LANES or s.lanes > s.threads or s.split not in SPLITS or s.unroll != 1:
            return False, "columns: lanes/split outside the space (unroll 1)"
        if 8 * s.threads * s.vec > MAX_SMEM_BYTES:
            return False, "the thread rows' (value, index) pairs do not fit 48 KiB of shared memory"
        if dims is not None:
            q, r = _size(ir.shape[ir.axis + 1 :], dims), _row(ir, dims)
            if s.lanes * s.vec >= 2 * q and not (s.lanes == LANES[0] and s.vec == 1):
                return False, f"{s.lanes} lanes x {s.vec} for {q} columns: half idle"
            if s.split > 1 and s.split * (s.threads // s.lanes) > r:
                return False, f"split {s.split} for {r} rows"
        return True, ""
    if s.lanes != 32 or s.split != 1:
        return False, "lanes and split are a columns layout's"
    if dims is not None:
        n = _row(ir, dims)
        if s.threads > 32 and s.threads * s.vec >= 2 * n:
            return False, f"{s.threads} x {s.vec} for rows of {n}: half idle"
    return True, ""


def space(ir, dims_list) -> list[Schedule]:
    out = []
    if ir.columns:
        grid = itertools.product(THREADS, vecs(ir), (1,), LANES, SPLITS)
    else:
        grid = itertools.product(THREADS, vecs(ir), UNROLLS, (32,), (1,))
    for t, v, u, ln, sp in grid:
        s = Schedule(threads=t, vec=v, unroll=u, lanes=ln, split=sp)
        if all(is_valid(ir, s, d)[0] for d in (dims_list or [None])):
            out.append(s)
    return out


def default_schedule(ir, dims) -> Schedule:
    v = max(vecs(ir))
    n = _row(ir, dims)
    if ir.columns:
        q, p = _size(ir.shape[ir.axis + 1 :], dims), _size(ir.shape[: ir.axis], dims)
        while v > 1 and LANES[0] * v >= 2 * q:
            v //= 2
        lanes = 32
        while lanes > LANES[0] and lanes * v >= 2 * q:
            lanes //= 2
        rows = 256 // lanes
        clusters = p * math.ceil(q / (lanes * v))
        split = 1
        while split < 8 and clusters * split < 4 * 132 and 2 * split * rows <= n:
            split *= 2
        s = Schedule(threads=256, vec=v, unroll=1, lanes=lanes, split=split)
        if is_valid(ir, s, dims)[0]:
            return s
        return Schedule(threads=256, vec=1, unroll=1, lanes=LANES[0], split=1)
    t = 32
    while t < 256 and 4 * t * v < n:  # 256 (85.1% of copy) beat 512 (83.7%) and 1024 (79.3%)
        t *= 2  # at 2048 x 65536 bf16 on an H100 (bench/results/2026-12-07-h100-memfamilies-3)
    s = Schedule(threads=t, vec=v, unroll=2)
    return s if is_valid(ir, s, dims)[0] else Schedule(threads=32, vec=1, unroll=1)


def seeds(ir, dims) -> list[Schedule]:
    d = default_schedule(ir, dims)
    out = [d]
    for ch in ({"threads": d.threads * 2}, {"threads": d.threads // 2}, {"unroll": 1},
               {"split": min(8, d.split * 2)}, {"split": max(1, d.split // 2)}):  # fmt: skip
        s = Schedule(**{**d.to_dict(), **ch})
        if s.threads in THREADS and s not in out and is_valid(ir, s, dims)[0]:
            out.append(s)
    return out


class ArgKernel(ColumnKernel):
    def __init__(self, ir, s, arch):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.V = s.vec
        self.W = s.threads // 32
        self.nout = 1

    def take(self, v: str, i: str, ov: str, oi: str) -> str:
        """pred: (ov, oi) beats (v, i) (see the module docstring)."""
        b = self.b
        better = b.reg("pred")
        b.op(f"setp.{'gt' if self.ir.op == 'argmax' else 'lt'}.f32 {better}, {ov}, {v}")
        on, vn = b.reg("pred"), b.reg("pred")
        b.op(f"setp.neu.f32 {on}, {ov}, {ov}")  # ov is NaN
        b.op(f"setp.neu.f32 {vn}, {v}, {v}")
        nan_wins = b.reg("pred")
        b.op(f"not.pred {nan_wins}, {vn}")
        b.op(f"and.pred {nan_wins}, {nan_wins}, {on}")
        tie, both = b.reg("pred"), b.reg("pred")
        b.op(f"setp.eq.f32 {tie}, {ov}, {v}")
        b.op(f"and.pred {both}, {on}, {vn}")
        b.op(f"or.pred {tie}, {tie}, {both}")
        first = b.reg("pred")
        b.op(f"setp.lt.u32 {first}, {oi}, {i}")
        b.op(f"and.pred {tie}, {tie}, {first}")
        b.op(f"or.pred {better}, {better}, {nan_wins}")
        b.op(f"or.pred {better}, {better}, {tie}")
        return better

    def fold(self, v: str, i: str, ov: str, oi: str) -> None:
        p = self.take(v, i, ov, oi)
        self.b.op(f"selp.f32 {v}, {ov}, {v}, {p}")
        self.b.op(f"selp.b32 {i}, {oi}, {i}, {p}")

    def store_index(self, addr: str, idx: str, pred: str | None = None) -> None:
        g = f"@{pred} " if pred else ""
        if E.DTYPE_BYTES[self.ir.out_dtype] == 4:
            self.b.op(f"{g}st.global.b32 [{addr}], {idx}")
        else:
            zero = self.u32(0)
            self.b.op(f"{g}st.global.v2.b32 [{addr}], {{{idx}, {zero}}}")

    def render_columns(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        """(P, R, Q), R reduced: the column family's layout, a (value, index) pair a column."""
        ir, s, b = self.ir, self.s, self.b
        V, T, L, S = self.V, s.threads, s.lanes, s.split
        TR = T // L
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", ir.out)]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        P = self.product(ir.shape[: ir.axis])
        R = self.product(ir.shape[ir.axis : ir.axis + 1])
        Q = self.product(ir.shape[ir.axis + 1 :])
        base = {}
        for name in [*(n for n, _ in ir.inputs), ir.out]:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            base[name] = r
        tid = self.u32("%tid.x")
        lane, trow = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, {L - 1}")
        b.op(f"shr.u32 {trow}, {tid}, {int(math.log2(L))}")
        cl, ncl = self.u32("%ctaid.x"), self.u32("%nctaid.x")
        lg = int(math.log2(S))
        b.op(f"shr.u32 {cl}, {cl}, {lg}")
        b.op(f"shr.u32 {ncl}, {ncl}, {lg}")
        rank = self.u32("%cluster_ctarank") if S > 1 else self.u32(0)
        g = b.reg("b32")
        b.op(f"mad.lo.u32 {g}, {rank}, {TR}, {trow}")
        p, qb, carry_into_p = self.column_blocks(Q, L * V, cl)
        qmod = b.reg("b32")
        b.op(f"and.b32 {qmod}, {Q}, {V - 1}")
        qaligned = b.reg("pred")
        b.op(f"setp.eq.u32 {qaligned}, {qmod}, 0")
        RQ = b.reg("b32")
        b.op(f"mul.lo.u32 {RQ}, {R}, {Q}")
        smem = self.u32("red_smem")
        mine = b.reg("b32")
        b.op(f"mul.lo.u32 {mine}, {tid}, {8 * V}")
        b.op(f"add.u32 {mine}, {mine}, {smem}")
        worst = -math.inf if ir.op == "argmax" else math.inf
        item, done = b.new_label("item"), b.new_label("done")
        b.label(item)
        pd = b.reg("pred")
        b.op(f"setp.ge.u32 {pd}, {p}, {P}")
        b.op(f"@{pd} bra.uni {done}")
        q0 = b.reg("b32")
        b.op(f"mad.lo.u32 {q0}, {qb}, {L * V}, 0")
        b.op(f"mad.lo.u32 {q0}, {lane}, {V}, {q0}")
        qend = b.reg("b32")
        b.op(f"add.u32 {qend}, {q0}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {qend}, {Q}")
        b.op(f"and.pred {whole}, {whole}, {qaligned}")
        preds = []
        for j in range(V):
            qj, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {qj}, {q0}, {j}")
            b.op(f"setp.lt.u32 {pj}, {qj}, {Q}")
            preds.append(pj)
        bv = [b.reg("f32") for _ in range(V)]
        bi = [b.reg("b32") for _ in range(V)]
        for v_, i_ in zip(bv, bi, strict=True):
            b.op(f"mov.f32 {v_}, {f32_literal(worst)}")
            b.op(f"mov.u32 {i_}, {R}")
        r = b.reg("b32")
        b.op(f"mov.u32 {r}, {g}")
        top, end = b.new_label("rows"), b.new_label("rows_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {r}, {R}")
        b.op(f"@{pe} bra.uni {end}")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {p}, {RQ}, {q0}")
        b.op(f"mad.lo.u32 {at}, {r}, {Q}, {at}")
        el, ld = b.new_label("elems"), b.new_label("loaded")
        b.op(f"@!{whole} bra {el}")
        per = {}
        for name, dtype in ir.inputs:
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
            b.op(f"add.u64 {addr}, {addr}, {base[name]}")
            per[name] = self.load_vector(addr, dtype)
        for j in range(V):
            v = self.evaluate({name: per[name][j] for name, _ in ir.inputs})[0]
            self.fold(bv[j], bi[j], v, r)
        b.op(f"bra {ld}")
        b.label(el)
        for j in range(V):
            ins = {}
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                ins[name] = self.load_scalar(self.plus(addr, j * ESIZE[dtype]), dtype, preds[j])
            v = self.evaluate(ins)[0]
            self.fold(bv[j], bi[j], v, r)
        b.label(ld)
        b.op(f"add.u32 {r}, {r}, {S * TR}")
        b.op(f"bra.uni {top}")
        b.label(end)
        first = b.reg("pred")
        b.op(f"setp.eq.u32 {first}, {trow}, 0")
        if TR > 1:
            for j in range(V):
                b.op(f"st.shared.f32 [{mine}+{8 * j}], {bv[j]}")
                b.op(f"st.shared.b32 [{mine}+{8 * j + 4}], {bi[j]}")
            b.op("bar.sync 0")
            skip = b.new_label("rows_met")
            b.op(f"@!{first} bra {skip}")
            for t in range(1, TR):
                for j in range(V):
                    ov, oi = b.reg("f32"), b.reg("b32")
                    off = 8 * (t * L * V + j)
                    b.op(f"ld.shared.f32 {ov}, [{mine}+{off}]")
                    b.op(f"ld.shared.b32 {oi}, [{mine}+{off + 4}]")
                    self.fold(bv[j], bi[j], ov, oi)
            b.label(skip)
        if S > 1:
            pub = b.new_label("published")
            b.op(f"@!{first} bra {pub}")
            for j in range(V):
                b.op(f"st.shared.f32 [{mine}+{8 * j}], {bv[j]}")
                b.op(f"st.shared.b32 [{mine}+{8 * j + 4}], {bi[j]}")
            b.label(pub)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            lead = b.reg("pred")
            b.op(f"setp.eq.u32 {lead}, {rank}, 0")
            b.op(f"and.pred {lead}, {lead}, {first}")
            gathered = b.new_label("gathered")
            b.op(f"@!{lead} bra {gathered}")
            for k in range(1, S):
                remote = b.reg("b32")
                b.op(f"mapa.shared::cluster.u32 {remote}, {mine}, {k}")
                for j in range(V):
                    ov, oi = b.reg("f32"), b.reg("b32")
                    b.op(f"ld.shared::cluster.f32 {ov}, [{remote}+{8 * j}]")
                    b.op(f"ld.shared::cluster.b32 {oi}, [{remote}+{8 * j + 4}]")
                    self.fold(bv[j], bi[j], ov, oi)
            b.label(gathered)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            writer = lead
        else:
            writer = first
        stored = b.new_label("stored")
        b.op(f"@!{writer} bra {stored}")
        oat = b.reg("b32")
        b.op(f"mad.lo.u32 {oat}, {p}, {Q}, {q0}")
        es = E.DTYPE_BYTES[ir.out_dtype]
        for j in range(V):
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {oat}, {es}")
            b.op(f"add.u64 {addr}, {addr}, {base[ir.out]}")
            self.store_index(self.plus(addr, j * es), bi[j], preds[j])
        b.label(stored)
        if TR > 1 and S == 1:
            b.op("bar.sync 0")
        b.op(f"add.u32 {qb}, {qb}, {ncl}")
        carry_into_p()
        b.op(f"bra.uni {item}")
        b.label(done)
        b.op("ret")
        entry = f"{ident(ir.name)}_{ir.op}_{s.tag()}"
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{2 * T * V}];"]
        ptx = module_text(
            family="argreduce", workload=ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=T, body=body, lines=b.lines, cluster=S,
        )  # fmt: skip
        outer = shape_product(ir.shape[: ir.axis])
        inner = shape_product(ir.shape[ir.axis + 1 :])
        clusters = f"min({outer}*ceildiv({inner}, {L * V}), {MAX_CLUSTERS})"
        grid = f"{S}*{clusters}" if S > 1 else clusters
        launch = Launch((grid, 1, 1), (T, 1, 1), cluster=(S, 1, 1) if S > 1 else None)
        return Emitted(ptx, entry, tuple(params), launch)

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        if self.ir.columns:
            return self.render_columns()
        ir, s, b = self.ir, self.s, self.b
        V, T, W = self.V, s.threads, self.W
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", ir.out)]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        M, N = self.product(ir.shape[:-1]), self.product(ir.shape[-1:])
        base = {}
        for name in [*(n for n, _ in ir.inputs), ir.out]:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            base[name] = r
        tid, row = self.u32("%tid.x"), self.u32("%ctaid.x")
        lane, warp = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, 31")
        b.op(f"shr.u32 {warp}, {tid}, 5")
        done = b.new_label("done")
        pr = b.reg("pred")
        b.op(f"setp.ge.u32 {pr}, {row}, {M}")
        b.op(f"@{pr} bra.uni {done}")
        rowstart = b.reg("b32")
        b.op(f"mul.lo.u32 {rowstart}, {row}, {N}")
        nmod = b.reg("b32")
        b.op(f"and.b32 {nmod}, {N}, {V - 1}")
        aligned = b.reg("pred")
        b.op(f"setp.eq.u32 {aligned}, {nmod}, 0")
        worst = -math.inf if ir.op == "argmax" else math.inf
        bv, bi = b.reg("f32"), b.reg("b32")
        b.op(f"mov.f32 {bv}, {f32_literal(worst)}")
        b.op(f"mov.u32 {bi}, {N}")  # past the row: loses every tie
        k = b.reg("b32")
        b.op(f"mul.lo.u32 {k}, {tid}, {V}")
        step = T * V
        tail = b.new_label("tail")
        b.op(f"@!{aligned} bra {tail}")
        U = s.unroll
        # In the vector loop a thread meets each column j of its vectors in increasing index
        # order, so lane j's own pair needs no tie rule: a later element wins only when it is
        # strictly better or NaN, and only while the pair's value is a number. V pairs: V
        # independent chains, folded with the full rule after the loop; a pair keeps the
        # base k of its element, j added at the fold.
        cmp = "gt" if ir.op == "argmax" else "lt"
        av = [b.reg("f32") for _ in range(V)]
        ab = [b.reg("b32") for _ in range(V)]
        for j in range(V):
            b.op(f"mov.f32 {av[j]}, {f32_literal(worst)}")
            b.op(f"mov.u32 {ab[j]}, {N}")  # past the row: no element taken
        for width in [U, 1] if U > 1 else [1]:
            top, end = b.new_label("vec"), b.new_label("vec_end")
            b.label(top)
            last = b.reg("b32")
            b.op(f"add.u32 {last}, {k}, {(width - 1) * step + V}")
            pe = b.reg("pred")
            b.op(f"setp.gt.u32 {pe}, {last}, {N}")
            b.op(f"@{pe} bra.uni {end}")
            loads = []
            for u in range(width):
                at = b.reg("b32")
                b.op(f"add.u32 {at}, {k}, {u * step}")
                b.op(f"add.u32 {at}, {at}, {rowstart}")
                per = {}
                for name, dtype in ir.inputs:
                    addr = b.reg("b64")
                    b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                    b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                    per[name] = self.load_vector(addr, dtype)
                loads.append(per)
            for u, per in enumerate(loads):
                kb = k
                if u:
                    kb = b.reg("b32")
                    b.op(f"add.u32 {kb}, {k}, {u * step}")
                for j in range(V):
                    v = self.evaluate({name: per[name][j] for name, _ in ir.inputs})[0]
                    p, nan, num = b.reg("pred"), b.reg("pred"), b.reg("pred")
                    b.op(f"setp.{cmp}.f32 {p}, {v}, {av[j]}")
                    b.op(f"setp.neu.f32 {nan}, {v}, {v}")
                    b.op(f"or.pred {p}, {p}, {nan}")
                    b.op(f"setp.eq.f32 {num}, {av[j]}, {av[j]}")
                    b.op(f"and.pred {p}, {p}, {num}")
                    b.op(f"selp.f32 {av[j]}, {v}, {av[j]}, {p}")
                    b.op(f"selp.b32 {ab[j]}, {kb}, {ab[j]}, {p}")
            b.op(f"add.u32 {k}, {k}, {width * step}")
            b.op(f"bra.uni {top}")
            b.label(end)
        for j in range(V):  # the V pairs in order, by the full rule
            idx = b.reg("b32")
            b.op(f"add.u32 {idx}, {ab[j]}, {j}")
            self.fold(bv, bi, av[j], idx)
        b.label(tail)
        top, end = b.new_label("elems"), b.new_label("elems_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {k}, {N}")
        b.op(f"@{pe} bra.uni {end}")
        for j in range(V):
            kj, pj = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {kj}, {k}, {j}")
            b.op(f"setp.lt.u32 {pj}, {kj}, {N}")
            at = b.reg("b32")
            b.op(f"add.u32 {at}, {kj}, {rowstart}")
            ins = {}
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                ins[name] = self.load_scalar(addr, dtype, pj)
            v = self.evaluate(ins)[0]
            p = self.take(bv, bi, v, kj)
            b.op(f"and.pred {p}, {p}, {pj}")
            b.op(f"selp.f32 {bv}, {v}, {bv}, {p}")
            b.op(f"selp.b32 {bi}, {kj}, {bi}, {p}")
        b.op(f"add.u32 {k}, {k}, {step}")
        b.op(f"bra.uni {top}")
        b.label(end)
        for off in (16, 8, 4, 2, 1):
            ov, oi = b.reg("f32"), b.reg("b32")
            b.op(f"shfl.sync.bfly.b32 {ov}, {bv}, {off}, 31, -1")
            b.op(f"shfl.sync.bfly.b32 {oi}, {bi}, {off}, 31, -1")
            self.fold(bv, bi, ov, oi)
        smem = self.u32("red_smem")
        l0 = b.reg("pred")
        b.op(f"setp.eq.u32 {l0}, {lane}, 0")
        at = b.reg("b32")
        b.op(f"mad.lo.u32 {at}, {warp}, 8, {smem}")
        b.op(f"@{l0} st.shared.f32 [{at}], {bv}")
        b.op(f"@{l0} st.shared.b32 [{at}+4], {bi}")
        b.op("bar.sync 0")
        t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {t0}, {tid}, 0")
        b.op(f"@!{t0} bra.uni {done}")
        for w in range(1, W):
            ov, oi = b.reg("f32"), b.reg("b32")
            b.op(f"ld.shared.f32 {ov}, [{smem}+{8 * w}]")
            b.op(f"ld.shared.b32 {oi}, [{smem}+{8 * w + 4}]")
            self.fold(bv, bi, ov, oi)
        past = b.reg("pred")  # no element taken: every one is the worst value, so the first
        b.op(f"setp.ge.u32 {past}, {bi}, {N}")
        b.op(f"selp.b32 {bi}, 0, {bi}, {past}")
        addr = b.reg("b64")
        es = E.DTYPE_BYTES[ir.out_dtype]
        b.op(f"mul.wide.u32 {addr}, {row}, {es}")
        b.op(f"add.u64 {addr}, {addr}, {base[ir.out]}")
        if es == 4:
            b.op(f"st.global.b32 [{addr}], {bi}")
        else:
            zero = self.u32(0)
            b.op(f"st.global.v2.b32 [{addr}], {{{bi}, {zero}}}")
        b.label(done)
        b.op("ret")
        entry = f"{ident(ir.name)}_{ir.op}_{s.tag()}"
        body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{2 * W}];"]
        ptx = module_text(
            family="argreduce", workload=ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=T, body=body, lines=b.lines,
        )  # fmt: skip
        # every thread slot of an SM (32 registers) where a thread's loads are at most 32
        # bytes, else three quarters (42): the loads in flight are the only latency cover,
        # and the loop's V pairs fit either way without spills
        held = sum(ESIZE[d] for _, d in ir.inputs) * V * U
        slots = 2048 if held <= 32 else 1536
        head = f".maxntid {T}, 1, 1"
        ptx = ptx.replace(head, f"{head}\n.minnctapersm {max(1, slots // T)}", 1)
        rows = "(" + "*".join(str(d) for d in ir.shape[:-1]) + ")" if ir.shape[:-1] else "1"
        return Emitted(ptx, entry, tuple(params), Launch((rows, 1, 1), (T, 1, 1)))


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    def render(ir, s, arch):
        return ArgKernel(ir, s, arch).render()

    return checked_emit("argreduce", ARCHS, Schedule, is_valid, render, ir, schedule, arch)


def features(schedule: dict, dims: dict, dim_order: list) -> list[float]:
    s = Schedule.from_dict(schedule)
    elements = math.prod(int(dims[d]) for d in dim_order if d in dims) if dim_order else 1
    return [log2(elements), log2(s.threads), float(s.vec * 4), float(s.unroll)]


def label(schedule: dict) -> str:
    s = Schedule.from_dict(schedule)
    return f"arg: a row a block of {s.threads} threads x {s.vec} a load, {s.unroll} in flight"


FAMILY = Family(
    name="argreduce",
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
    legend="arg: threads of a row's block x elements a load, loads in flight",
    features=features,
    feature_fields=("threads", "vec", "unroll"),
    roofline=lambda workload, dims: Roofline(bytes=io_bytes(workload, dims)),
    baselines=("torch_eager", "torch_compile", "torch_compile_max_autotune"),
    baselines_module="factory.families.colreduce.baselines",
    layout_fields=("threads", "vec"),
)

__all__ = ["FAMILY", "ArgIR", "Schedule", "lower"]
