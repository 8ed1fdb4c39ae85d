"""The column-reduction emitter: a tensor viewed as (P, R, Q), reduced over R (one or several
adjacent axes), the kept innermost run Q coalesced across threads.

A block is `lanes` threads along Q, each owning `vec` adjacent columns (one 16-byte load a row
where Q is a multiple of vec), times `threads // lanes` thread rows; a cluster of `split` blocks
shares one column block, each thread walking every (split * rows)-th row of R, `unroll` rows in
flight. Partial results meet in a fixed order (thread rows through shared memory, then the
cluster's blocks through distributed shared memory, rank order), so every run gives the same
bits: one kernel, no atomics, no workspace. Work items (p, column block) are handed out
grid-stride to at most MAX_CLUSTERS clusters, (p, qb) stepped without integer division.

Every path is correct for any P, R, Q >= 1: a thread whose columns are not one whole aligned
vector takes the element path (each column under its own predicate)."""

from __future__ import annotations

import math

from factory.emit import Emitted
from factory.emit import ops as OPS
from factory.emit.module import ident, module_text
from factory.emit.ptx import Builder, EmitError, f32_literal
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

MAX_CLUSTERS = 2048
IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}
COMBINE = {"sum": "add.f32", "mean": "add.f32", "prod": "mul.f32", "max": "max.f32",
           "min": "min.f32"}  # fmt: skip
ESIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def shape_product(dims: tuple) -> str:
    """Shape arithmetic text of a product of dims ("1" for none)."""
    parts = [str(d) for d in dims]
    return "(" + "*".join(parts) + ")" if parts else "1"


class ColumnKernel:
    """Renders a ColReduceIR (factory.families.colreduce.ir) with a Schedule."""

    def __init__(self, ir, s, arch: str):
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.L, self.V, self.S, self.U = s.lanes, s.vec, s.split, s.unroll
        self.TR = s.threads // s.lanes
        self.nout = len(ir.outputs)

    # -- helpers ---------------------------------------------------------------------------------

    def dim_reg(self, d) -> str:
        b = self.b
        r = b.reg("b32")
        if isinstance(d, str):
            b.op(f"ld.param.u32 {r}, [p_{ident(d)}]")
        else:
            b.op(f"mov.u32 {r}, {int(d)}")
        return r

    def product(self, dims) -> str:
        b = self.b
        acc = b.reg("b32")
        b.op(f"mov.u32 {acc}, 1")
        for d in dims:
            r = self.dim_reg(d)
            b.op(f"mul.lo.u32 {acc}, {acc}, {r}")
        return acc

    def column_blocks(self, Q: str, width: int, first: str):
        """The walk over (leading index p, column block qb) pairs of `width` columns each (a power
        of two) in a row of Q columns: qb starts at `first` with p = 0; the returned
        `carry_into_p()` emits the loop that moves whole rows of blocks from qb into p (call it
        after each advance of qb)."""
        b = self.b
        nqb = b.reg("b32")
        b.op(f"add.u32 {nqb}, {Q}, {width - 1}")
        b.op(f"shr.u32 {nqb}, {nqb}, {int(math.log2(width))}")
        p, qb = self.u32(0), b.reg("b32")
        b.op(f"mov.u32 {qb}, {first}")

        def carry_into_p():
            top, done_ = b.new_label("norm"), b.new_label("norm_done")
            b.label(top)
            pn = b.reg("pred")
            b.op(f"setp.lt.u32 {pn}, {qb}, {nqb}")
            b.op(f"@{pn} bra.uni {done_}")
            b.op(f"sub.u32 {qb}, {qb}, {nqb}")
            b.op(f"add.u32 {p}, {p}, 1")
            b.op(f"bra.uni {top}")
            b.label(done_)

        carry_into_p()
        return p, qb, carry_into_p

    def u32(self, value) -> str:
        r = self.b.reg("b32")
        self.b.op(f"mov.u32 {r}, {value}")
        return r

    # -- element evaluation --------------------------------------------------------------------

    def evaluate(self, loaded: dict[str, str]) -> list[str]:
        """f32 registers of each output's operand at one element, from the inputs' values."""
        b, memo = self.b, {}
        for n in self.ir.order:
            if isinstance(n, E.Input):
                memo[n] = loaded[n.name]
            elif isinstance(n, E.Const):
                memo[n] = f32_literal(n.value)
            elif isinstance(n, E.Unary):
                memo[n] = OPS.UNARY[n.op](b, self.reg_of(memo[n.x]), False)
            elif isinstance(n, E.Binary):
                if n.op == "pow":
                    memo[n] = OPS.pow_const(b, self.reg_of(memo[n.a]), n.b.value, False)
                else:
                    memo[n] = OPS.BINARY[n.op](
                        b, self.reg_of(memo[n.a]), self.reg_of(memo[n.b]), False
                    )
            elif isinstance(n, E.Compare):
                memo[n] = OPS.compare(b, n.op, self.reg_of(memo[n.a]), self.reg_of(memo[n.b]))
            elif isinstance(n, E.Where):
                r = b.reg("f32")
                b.op(f"selp.f32 {r}, {memo[n.a]}, {memo[n.b]}, {memo[n.cond]}")
                memo[n] = r
            elif isinstance(n, E.Cast):
                memo[n] = OPS.cast_round(b, self.reg_of(memo[n.x]), n.to)
            else:  # lower() refuses everything else
                raise EmitError(f"cannot evaluate {type(n).__name__}")
        return [self.reg_of(memo[o.operand]) for o in self.ir.outputs]

    def reg_of(self, v: str) -> str:
        """A register for an operand that may be an immediate (a constant)."""
        if v.startswith("0f"):
            r = self.b.reg("f32")
            self.b.op(f"mov.f32 {r}, {v}")
            return r
        return v

    # -- loads ---------------------------------------------------------------------------------

    def load_vector(self, ptr: str, dtype: str) -> list[str]:
        """vec elements at ptr (aligned to their size) as f32 registers."""
        b, V, es = self.b, self.V, ESIZE[dtype]
        nbytes = V * es
        if es == 2 and V == 1:
            h = b.reg("b16")
            b.op(f"ld.global.nc.b16 {h}, [{ptr}]")
            return [self.widen16(h, dtype)]
        words = [b.reg("b32") for _ in range(max(1, nbytes // 4))]
        if len(words) == 1:
            b.op(f"ld.global.nc.b32 {words[0]}, [{ptr}]")
        else:
            b.op(f"ld.global.nc.v{len(words)}.b32 {{{', '.join(words)}}}, [{ptr}]")
        out = []
        for w in words:
            if es == 4:
                f = b.reg("f32")
                b.op(f"mov.b32 {f}, {w}")
                out.append(f)
            else:
                out += self.unpack16(w, dtype)
        return out

    def widen16(self, h: str, dtype: str) -> str:
        f = self.b.reg("f32")
        self.b.op(f"cvt.f32.{'bf16' if dtype == 'bf16' else 'f16'} {f}, {h}")
        return f

    def unpack16(self, w: str, dtype: str) -> list[str]:
        b = self.b
        lo, hi = b.reg("b16"), b.reg("b16")
        b.op(f"mov.b32 {{{lo}, {hi}}}, {w}")
        return [self.widen16(lo, dtype), self.widen16(hi, dtype)]

    def load_scalar(self, ptr: str, dtype: str, pred: str) -> str:
        b = self.b
        if ESIZE[dtype] == 4:
            f = b.reg("f32")
            b.op(f"mov.f32 {f}, 0f00000000")
            b.op(f"@{pred} ld.global.nc.f32 {f}, [{ptr}]")
            return f
        h = b.reg("b16")
        b.op(f"mov.b16 {h}, 0")
        b.op(f"@{pred} ld.global.nc.b16 {h}, [{ptr}]")
        return self.widen16(h, dtype)

    def store_vector(self, addr: str, dtype: str, vals: list[str]) -> None:
        """Adjacent elements (f32 registers) stored at addr (aligned to their size): 16-bit ones
        packed two to a word, then words four to a store."""
        b, es = self.b, ESIZE[dtype]
        if es == 4:
            words = vals
        else:
            if len(vals) == 1:
                h = b.reg("b16")
                b.op(f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32 {h}, {vals[0]}")
                b.op(f"st.global.b16 [{addr}], {h}")
                return
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
                b.op(f"st.global.{ty} {where}, {group[0]}")
            else:
                b.op(f"st.global.v{len(group)}.{ty} {where}, {{{', '.join(group)}}}")

    def combine(self, acc: str, v: str, op: str) -> None:
        self.b.op(f"{COMBINE[op]} {acc}, {acc}, {v}")

    # -- the kernel ----------------------------------------------------------------------------

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b = self.ir, self.s, self.b
        L, V, S, TR = self.L, self.V, self.S, self.TR
        inputs = ir.inputs  # (name, dtype) of the inputs the operands read
        params = [KernelParam("tensor", "u64", name) for name, _ in inputs]
        params += [KernelParam("tensor", "u64", o.name) for o in ir.outputs]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]

        b.comment("P kept outer, R reduced, Q kept inner (contiguous)")
        P, R, Q = self.product(ir.outer), self.product(ir.reduced), self.product(ir.inner)
        base = {}
        for name, _ in inputs:
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
        tid, lane, trow = self.u32("%tid.x"), b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, {L - 1}")
        b.op(f"shr.u32 {trow}, {tid}, {int(math.log2(L))}")
        ctaid, nctaid = self.u32("%ctaid.x"), self.u32("%nctaid.x")
        cl, ncl = b.reg("b32"), b.reg("b32")
        b.op(f"shr.u32 {cl}, {ctaid}, {int(math.log2(S))}")
        b.op(f"shr.u32 {ncl}, {nctaid}, {int(math.log2(S))}")
        rank = self.u32("%cluster_ctarank") if S > 1 else self.u32(0)
        # the first row this thread walks, and the stride between its rows
        g = b.reg("b32")
        b.op(f"mad.lo.u32 {g}, {rank}, {TR}, {trow}")
        G = S * TR
        # column blocks: nqb = ceildiv(Q, L * V)
        nqb = b.reg("b32")
        b.op(f"add.u32 {nqb}, {Q}, {L * V - 1}")
        b.op(f"shr.u32 {nqb}, {nqb}, {int(math.log2(L * V))}")
        # the first item (p, qb) = divmod(cl, nqb), by subtraction
        p, qb = self.u32(0), b.reg("b32")
        b.op(f"mov.u32 {qb}, {cl}")
        norm = b.new_label("norm")
        norm_done = b.new_label("norm_done")
        b.label(norm)
        pn = b.reg("pred")
        b.op(f"setp.lt.u32 {pn}, {qb}, {nqb}")
        b.op(f"@{pn} bra.uni {norm_done}")
        b.op(f"sub.u32 {qb}, {qb}, {nqb}")
        b.op(f"add.u32 {p}, {p}, 1")
        b.op(f"bra.uni {norm}")
        b.label(norm_done)
        # the vector path: Q a multiple of V (every row's columns aligned)
        qmod = b.reg("b32")
        b.op(f"and.b32 {qmod}, {Q}, {V - 1}")
        qaligned = b.reg("pred")
        b.op(f"setp.eq.u32 {qaligned}, {qmod}, 0")
        RQ = b.reg("b32")
        b.op(f"mul.lo.u32 {RQ}, {R}, {Q}")
        # bytes between a thread's rows, per input
        stride = {}
        for name, dtype in inputs:
            r = b.reg("b64")
            b.op(f"mul.wide.u32 {r}, {Q}, {G * ESIZE[dtype]}")
            stride[name] = r
        rf = b.reg("f32")
        b.op(f"cvt.rn.f32.u32 {rf}, {R}")
        words = TR * L * V * self.nout
        smem = self.u32("red_smem")
        mine = b.reg("b32")  # this thread's first shared slot, in bytes
        b.op(f"mad.lo.u32 {mine}, {trow}, {L}, {lane}")
        b.op(f"mul.lo.u32 {mine}, {mine}, {V * self.nout * 4}")
        b.op(f"add.u32 {mine}, {mine}, {smem}")

        item, done = b.new_label("item"), b.new_label("done")
        b.label(item)
        pd = b.reg("pred")
        b.op(f"setp.ge.u32 {pd}, {p}, {P}")
        b.op(f"@{pd} bra.uni {done}")
        q0 = b.reg("b32")
        b.op(f"mad.lo.u32 {q0}, {qb}, {L * V}, 0")
        b.op(f"mad.lo.u32 {q0}, {lane}, {V}, {q0}")
        accs = [[b.reg("f32") for _ in range(V)] for _ in ir.outputs]
        for o, row in zip(ir.outputs, accs, strict=True):
            for a in row:
                b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[o.op])}")
        # pointers to (p, g, q0) of each input
        elem = b.reg("b32")
        b.op(f"mad.lo.u32 {elem}, {g}, {Q}, {q0}")
        b.op(f"mad.lo.u32 {elem}, {p}, {RQ}, {elem}")
        ptr0 = {}
        for name, dtype in inputs:
            r = b.reg("b64")
            b.op(f"mul.wide.u32 {r}, {elem}, {ESIZE[dtype]}")
            b.op(f"add.u64 {r}, {r}, {base[name]}")
            ptr0[name] = r
        # whole vector: Q % V == 0 and q0 + V <= Q
        qend = b.reg("b32")
        b.op(f"add.u32 {qend}, {q0}, {V}")
        vok = b.reg("pred")
        b.op(f"setp.le.u32 {vok}, {qend}, {Q}")
        b.op(f"and.pred {vok}, {vok}, {qaligned}")
        elems, reduced = b.new_label("elems"), b.new_label("reduced")
        b.op(f"@!{vok} bra {elems}")
        self.row_loops(inputs, ptr0, stride, g, R, accs, vector=True, q0=q0, Q=Q)
        b.op(f"bra {reduced}")
        b.label(elems)
        self.row_loops(inputs, ptr0, stride, g, R, accs, vector=False, q0=q0, Q=Q)
        b.label(reduced)

        # thread rows meet in shared memory, in row order
        first = b.reg("pred")
        b.op(f"setp.eq.u32 {first}, {trow}, 0")
        if TR > 1:
            for k, row in enumerate(accs):
                for j, a in enumerate(row):
                    b.op(f"st.shared.f32 [{mine}+{4 * (j * self.nout + k)}], {a}")
            b.op("bar.sync 0")
            skip = b.new_label("rows_met")
            b.op(f"@!{first} bra {skip}")
            for t in range(1, TR):
                for k, (o, row) in enumerate(zip(ir.outputs, accs, strict=True)):
                    for j, a in enumerate(row):
                        v = b.reg("f32")
                        off = 4 * (t * L * V * self.nout + j * self.nout + k)
                        b.op(f"ld.shared.f32 {v}, [{mine}+{off}]")
                        self.combine(a, v, o.op)
            b.label(skip)
        if S > 1:
            # the cluster's blocks meet through distributed shared memory, in rank order
            pub = b.new_label("published")
            b.op(f"@!{first} bra {pub}")
            for k, row in enumerate(accs):
                for j, a in enumerate(row):
                    b.op(f"st.shared.f32 [{mine}+{4 * (j * self.nout + k)}], {a}")
            b.label(pub)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            lead = b.reg("pred")
            b.op(f"setp.eq.u32 {lead}, {rank}, 0")
            b.op(f"and.pred {lead}, {lead}, {first}")
            gathered = b.new_label("gathered")
            b.op(f"@!{lead} bra {gathered}")
            for k_rank in range(1, S):
                remote = b.reg("b32")
                b.op(f"mapa.shared::cluster.u32 {remote}, {mine}, {k_rank}")
                for k, (o, row) in enumerate(zip(ir.outputs, accs, strict=True)):
                    for j, a in enumerate(row):
                        v = b.reg("f32")
                        off = 4 * (j * self.nout + k)
                        b.op(f"ld.shared::cluster.f32 {v}, [{remote}+{off}]")
                        self.combine(a, v, o.op)
            b.label(gathered)
            b.op("barrier.cluster.arrive.release.aligned")
            b.op("barrier.cluster.wait.acquire.aligned")
            writer = lead
        else:
            writer = first
        stored = b.new_label("stored")
        b.op(f"@!{writer} bra {stored}")
        oelem = b.reg("b32")
        b.op(f"mad.lo.u32 {oelem}, {p}, {Q}, {q0}")
        for o, row, ob in zip(ir.outputs, accs, obase, strict=True):
            es = ESIZE[o.dtype]
            optr = b.reg("b64")
            b.op(f"mul.wide.u32 {optr}, {oelem}, {es}")
            b.op(f"add.u64 {optr}, {optr}, {ob}")
            for j, a in enumerate(row):
                v = a
                if o.op == "mean":
                    v = b.reg("f32")
                    b.op(f"div.rn.f32 {v}, {a}, {rf}")
                v = self.finish(o, v)
                qj, pj = b.reg("b32"), b.reg("pred")
                b.op(f"add.u32 {qj}, {q0}, {j}")
                b.op(f"setp.lt.u32 {pj}, {qj}, {Q}")
                if es == 4:
                    b.op(f"@{pj} st.global.f32 [{optr}+{4 * j}], {v}")
                else:
                    h = b.reg("b16")
                    b.op(f"cvt.rn.{'bf16' if o.dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
                    b.op(f"@{pj} st.global.b16 [{optr}+{2 * j}], {h}")
        b.label(stored)
        if TR > 1 and S == 1:
            b.op("bar.sync 0")  # the next item's slots are written after this one's are read
        # the next item: qb += clusters, carried into p
        b.op(f"add.u32 {qb}, {qb}, {ncl}")
        carry, carried = b.new_label("carry"), b.new_label("carried")
        b.label(carry)
        pc = b.reg("pred")
        b.op(f"setp.lt.u32 {pc}, {qb}, {nqb}")
        b.op(f"@{pc} bra.uni {carried}")
        b.op(f"sub.u32 {qb}, {qb}, {nqb}")
        b.op(f"add.u32 {p}, {p}, 1")
        b.op(f"bra.uni {carry}")
        b.label(carried)
        b.op(f"bra.uni {item}")
        b.label(done)
        b.op("ret")

        entry = f"{ident(ir.name)}_colreduce_{s.tag()}"
        ptx = self.assemble(entry, params, words)
        clusters = f"min({shape_product(ir.outer)}*ceildiv({shape_product(ir.inner)}, {L * V})"
        clusters += f", {MAX_CLUSTERS})"
        grid = f"{S}*{clusters}" if S > 1 else clusters
        launch = Launch((grid, 1, 1), (s.threads, 1, 1), cluster=(S, 1, 1) if S > 1 else None)
        return Emitted(ptx, entry, tuple(params), launch)

    def finish(self, o, v: str) -> str:
        """The output's epilogue applied to the reduced value (elementwise, per lower())."""
        return v

    def row_loops(self, inputs, ptr0, stride, g, R, accs, *, vector: bool, q0, Q) -> None:
        """Walk rows g, g + G, ... < R: `unroll` rows at a time, then one at a time."""
        b, U, G = self.b, self.U, self.S * self.TR
        ptr = {}
        for name, _ in inputs:
            r = b.reg("b64")
            b.op(f"mov.u64 {r}, {ptr0[name]}")
            ptr[name] = r
        r = b.reg("b32")
        b.op(f"mov.u32 {r}, {g}")
        preds = []
        if not vector:
            for j in range(self.V):
                qj, pj = b.reg("b32"), b.reg("pred")
                b.op(f"add.u32 {qj}, {q0}, {j}")
                b.op(f"setp.lt.u32 {pj}, {qj}, {Q}")
                preds.append(pj)
        for width in [U, 1] if U > 1 else [1]:
            top, end = b.new_label("rows"), b.new_label("rows_end")
            last = b.reg("b32")
            b.label(top)
            b.op(f"add.u32 {last}, {r}, {(width - 1) * G}")
            pe = b.reg("pred")
            b.op(f"setp.ge.u32 {pe}, {last}, {R}")
            b.op(f"@{pe} bra.uni {end}")
            rows = []  # [row][input] -> list of V f32 registers
            for u in range(width):
                per = {}
                for name, dtype in inputs:
                    addr = b.reg("b64")
                    off = u * G * ESIZE[dtype]
                    if u:
                        b.op(f"mul.wide.u32 {addr}, {Q}, {off}")
                        b.op(f"add.u64 {addr}, {addr}, {ptr[name]}")
                    else:
                        b.op(f"mov.u64 {addr}, {ptr[name]}")
                    if vector:
                        per[name] = self.load_vector(addr, dtype)
                    else:
                        per[name] = [
                            self.load_scalar(self.plus(addr, j * ESIZE[dtype]), dtype, preds[j])
                            for j in range(self.V)
                        ]
                rows.append(per)
            for per in rows:
                for j in range(self.V):
                    vals = self.evaluate({name: per[name][j] for name, _ in inputs})
                    for o, row, v in zip(self.ir.outputs, accs, vals, strict=True):
                        self.combine(row[j], v, o.op)
            for name, _ in inputs:
                if width == 1:
                    b.op(f"add.u64 {ptr[name]}, {ptr[name]}, {stride[name]}")
                else:
                    b.op(f"mad.lo.u64 {ptr[name]}, {stride[name]}, {width}, {ptr[name]}")
            b.op(f"add.u32 {r}, {r}, {width * G}")
            b.op(f"bra.uni {top}")
            b.label(end)

    def plus(self, addr: str, off: int) -> str:
        if not off:
            return addr
        r = self.b.reg("b64")
        self.b.op(f"add.u64 {r}, {addr}, {off}")
        return r

    def assemble(self, entry: str, params, words: int) -> str:
        s = self.s
        body = self.b.declarations()
        body.append(f"    .shared .align 16 .f32 red_smem[{max(words, 1)}];")
        return module_text(
            family="colreduce", workload=self.ir.name, schedule=s.to_dict(), arch=self.arch,
            entry=entry, params=params, threads=s.threads, body=body, lines=self.b.lines,
            cluster=self.S,
        )  # fmt: skip
