"""The pool family's strip layout: a lane owns `vec` adjacent outputs of a row and walks down a
band of consecutive output rows, so each input row is loaded once per lane (one vector of
vec * stride_w elements, plus the window's halo columns as single elements) and the rows that two
consecutive windows share are carried in registers, reduced across the window's width.

A block takes one plane at a time (grid-stride). Its threads are `lanes` along the output row
times `threads // lanes` thread rows; thread row r owns output rows [r * band, (r + 1) * band),
band = ceil(OH / rows) rounded up to `unroll`. A 1-D pool's planes are one row each: there the
rows (the leading axes) are dealt to blocks `thread rows x unroll` at a time instead, each
thread row taking `unroll` consecutive rows. Per step the lane loads the new input rows of
`unroll` output rows at once (the loads issued before any is used), evaluates the operand per
element (padding and rows or columns outside the plane take -inf for max, a counted zero for
avg), reduces each row over the window's width, then each output over the window's height.

A lane whose vector is whole and aligned (W a multiple of vec * stride_w, the vector inside the
row) takes the vector path; the others load every element under its own predicate. Outputs are
stored as one vector where OW is a multiple of vec and the lane's outputs are all inside the
row, else element by element."""

from __future__ import annotations

import math

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.emit.ptx import f32_literal
from factory.families.colreduce.kernel import ESIZE, ident, shape_product
from factory.spec.types import KernelParam, Launch

VECTOR_BYTES = (2, 4, 8, 16)


def strip_geometry(ir, vec: int, unroll: int) -> dict:
    """Sizes the strip layout works with (all static): the span a lane loads per input row
    (e = vec * stride_w elements), the halo columns left and right of it, the rows carried
    from one step to the next, and which rows of a step's (unroll - 1) * sh + kh are needed."""
    (kh, kw), (sh, sw), (_, pw) = ir.window, ir.stride, ir.padding
    e = vec * sw
    right = max(0, kw - pw - sw)
    carry = max(kh - sh, 0)
    span = (unroll - 1) * sh + kh
    needed = [r for r in range(span) if any(u * sh <= r < u * sh + kh for u in range(unroll))]
    new = [r for r in needed if r >= carry]
    return {"e": e, "left": pw, "right": right, "carry": carry, "new": new,
            "width": pw + e + right}  # fmt: skip


def strip_ok(ir, vec: int, unroll: int) -> tuple[bool, str]:
    g = strip_geometry(ir, vec, unroll)
    for name, dtype in ir.inputs:
        if g["e"] * ESIZE[dtype] not in VECTOR_BYTES:
            return False, f"strip: a lane's {g['e']} elements of {name} are not one load"
    if len(g["new"]) * g["width"] + g["carry"] * vec > 96:
        return False, "strip: too many values a step"
    return True, ""


class StripKernel:
    """Renders a PoolIR in the strip layout; `k` is the PoolKernel whose helpers it uses."""

    def __init__(self, k):
        self.k, self.b, self.ir, self.s = k, k.b, k.ir, k.s

    # -- loads -----------------------------------------------------------------------------

    def load_row(self, rowaddr: dict, c0: str, W: str, rowok: str, vector: bool) -> dict:
        """Issue this lane's loads of one input row (the vector or its elements, and the halo
        columns): {input: [(kind, raw register, predicate)] by column of the extended span}."""
        b, g, ir = self.b, self.g, self.ir
        out = {}
        for name, dtype in ir.inputs:
            es = ESIZE[dtype]
            cols = []
            # the halo on the left: columns c0 - left .. c0 - 1
            for k in range(g["width"]):
                e = k - g["left"]
                if vector and 0 <= e < g["e"]:
                    cols.append(None)  # filled from the vector below
                    continue
                col, ok = b.reg("b32"), b.reg("pred")
                b.op(f"add.u32 {col}, {c0}, {e}" if e >= 0 else f"sub.u32 {col}, {c0}, {-e}")
                b.op(f"setp.lt.u32 {ok}, {col}, {W}")  # a column before 0 wraps above W
                b.op(f"and.pred {ok}, {ok}, {rowok}")
                addr = b.reg("b64")
                b.op(f"cvt.u64.u32 {addr}, {col}")
                b.op(f"mad.lo.u64 {addr}, {addr}, {es}, {rowaddr[name]}")
                ty = "f32" if es == 4 else "b16"
                raw = b.reg(ty)
                b.op(f"mov.{ty} {raw}, {'0f00000000' if es == 4 else 0}")
                b.op(f"@{ok} ld.global.nc.{ty} {raw}, [{addr}]")
                cols.append(("s", raw, ok))
            if vector:
                addr = b.reg("b64")
                b.op(f"cvt.u64.u32 {addr}, {c0}")
                b.op(f"mad.lo.u64 {addr}, {addr}, {es}, {rowaddr[name]}")
                nbytes = g["e"] * es
                if nbytes == 2:
                    h = b.reg("b16")
                    b.op(f"mov.b16 {h}, 0")
                    b.op(f"@{rowok} ld.global.nc.b16 {h}, [{addr}]")
                    words = [("h", h)]
                else:
                    ws = [b.reg("b32") for _ in range(nbytes // 4)]
                    for w in ws:
                        b.op(f"mov.b32 {w}, 0")
                    if len(ws) == 1:
                        b.op(f"@{rowok} ld.global.nc.b32 {ws[0]}, [{addr}]")
                    else:
                        b.op(f"@{rowok} ld.global.nc.v{len(ws)}.b32 {{{', '.join(ws)}}}, [{addr}]")
                    words = [("w", w) for w in ws]
                cols[g["left"] : g["left"] + g["e"]] = [("v", words, rowok)] * g["e"]
            out[name] = cols
        return out

    def values(self, loaded: dict, vector: bool) -> list[str]:
        """The operand at each column of the extended span (f32), padding where invalid."""
        b, k, g, ir = self.b, self.k, self.g, self.ir
        unpacked = {}
        for name, dtype in ir.inputs:
            cols = loaded[name]
            if vector:
                kind, words, _ = cols[g["left"]]
                vals = []
                for tag, w in words:
                    if tag == "h":
                        vals.append(k.widen16(w, dtype))
                    elif ESIZE[dtype] == 4:
                        f = b.reg("f32")
                        b.op(f"mov.b32 {f}, {w}")
                        vals.append(f)
                    else:
                        vals += k.unpack16(w, dtype)
                unpacked[name] = vals
        out = []
        for c in range(g["width"]):
            ins, pred = {}, None
            for name, dtype in ir.inputs:
                kind, raw, ok = loaded[name][c]
                pred = ok
                if kind == "v":
                    ins[name] = unpacked[name][c - g["left"]]
                elif ESIZE[dtype] == 4:
                    ins[name] = raw
                else:
                    ins[name] = k.widen16(raw, dtype)
            v = k.evaluate(ins)[0]
            t = b.reg("f32")
            b.op(f"selp.f32 {t}, {v}, {self.pad}, {pred}")
            out.append(t)
        return out

    def across(self, vals: list[str]) -> list[str]:
        """Each of the lane's `vec` outputs reduced over the window's width in one row."""
        b = self.b
        kw, sw = self.ir.window[1], self.ir.stride[1]
        out = []
        for j in range(self.s.vec):
            acc = b.reg("f32")
            b.op(f"mov.f32 {acc}, {vals[j * sw]}")
            for d in range(1, kw):
                b.op(f"{self.combine} {acc}, {acc}, {vals[j * sw + d]}")
            out.append(acc)
        return out

    # -- the walk down a band ----------------------------------------------------------------

    def band(self, vector: bool, c0: str, ow0: str, ctx: dict) -> None:
        """Walk output rows oh_start .. oh_end - 1 of this lane's columns, `unroll` at a time."""
        b, g, ir, s = self.b, self.g, self.ir, self.s
        (kh, _), (sh, _), (ph, _) = ir.window, ir.stride, ir.padding
        U, V = s.unroll, s.vec
        H, W, OW = ctx["H"], ctx["W"], ctx["OW"]
        rowbytes = {}  # bytes between input rows, per input
        for name, dtype in ir.inputs:
            r = b.reg("b64")
            b.op(f"mul.wide.u32 {r}, {W}, {ESIZE[dtype]}")
            rowbytes[name] = r

        def row_at(ihk: str, r: int):
            ih, ok = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {ih}, {ihk}, {r}")
            b.op(f"setp.lt.u32 {ok}, {ih}, {H}")  # a row before 0 wraps above H
            at = b.reg("b32")
            b.op(f"mad.lo.u32 {at}, {ih}, {W}, {ctx['ibase']}")
            addrs = {}
            for name, dtype in ir.inputs:
                a = b.reg("b64")
                b.op(f"mul.wide.u32 {a}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {a}, {a}, {ctx['base'][name]}")
                addrs[name] = a
            return addrs, ok

        oh = b.reg("b32")
        b.op(f"mov.u32 {oh}, {ctx['oh_start']}")
        ihk = b.reg("b32")  # the first input row of output row oh's window (may wrap below 0)
        b.op(f"mul.lo.u32 {ihk}, {oh}, {sh}")
        b.op(f"sub.u32 {ihk}, {ihk}, {ph}")
        carried = [[b.reg("f32") for _ in range(V)] for _ in range(g["carry"])]
        if g["carry"]:
            b.comment("the rows the first window shares with the one before it")
            rows = []
            for r in range(g["carry"]):
                addrs, ok = row_at(ihk, r)
                rows.append(self.load_row(addrs, c0, W, ok, vector))
            for r, loaded in enumerate(rows):
                for dst, src in zip(carried[r], self.across(self.values(loaded, vector)),
                                    strict=True):  # fmt: skip
                    b.op(f"mov.f32 {dst}, {src}")
        top, end = b.new_label("band"), b.new_label("band_end")
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {oh}, {ctx['oh_end']}")
        b.op(f"@{pe} bra.uni {end}")
        loads = {}
        for r in g["new"]:
            addrs, ok = row_at(ihk, r)
            loads[r] = self.load_row(addrs, c0, W, ok, vector)
        hr = {r: carried[r] for r in range(g["carry"])}
        for r in g["new"]:
            hr[r] = self.across(self.values(loads[r], vector))
        # outputs: U rows of V
        OWmod = b.reg("b32")
        b.op(f"and.b32 {OWmod}, {OW}, {V - 1}")
        ovec = b.reg("pred")
        b.op(f"setp.eq.u32 {ovec}, {OWmod}, 0")
        oend = b.reg("b32")
        b.op(f"add.u32 {oend}, {ow0}, {V}")
        whole = b.reg("pred")
        b.op(f"setp.le.u32 {whole}, {oend}, {OW}")
        b.op(f"and.pred {ovec}, {ovec}, {whole}")
        colok = []
        for j in range(V):
            q, p = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {q}, {ow0}, {j}")
            b.op(f"setp.lt.u32 {p}, {q}, {OW}")
            colok.append(p)
        es = ESIZE[ir.out_dtype]
        for u in range(U):
            outs = []
            for j in range(V):
                acc = b.reg("f32")
                b.op(f"mov.f32 {acc}, {hr[u * sh][j]}")
                for d in range(1, kh):
                    b.op(f"{self.combine} {acc}, {acc}, {hr[u * sh + d][j]}")
                if ir.op == "avg":
                    b.op(f"div.rn.f32 {acc}, {acc}, {f32_literal(float(kh * ir.window[1]))}")
                outs.append(acc)
            ohu, live = b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {ohu}, {oh}, {u}")
            b.op(f"setp.lt.u32 {live}, {ohu}, {ctx['oh_end']}")
            oat = b.reg("b32")
            b.op(f"mad.lo.u32 {oat}, {ohu}, {OW}, {ctx['obase']}")
            b.op(f"add.u32 {oat}, {oat}, {ow0}")
            addr = b.reg("b64")
            b.op(f"mul.wide.u32 {addr}, {oat}, {es}")
            b.op(f"add.u64 {addr}, {addr}, {ctx['obase_ptr']}")
            self.store(addr, outs, live, ovec, colok)
        for r in range(g["carry"]):
            for dst, src in zip(carried[r], hr[U * sh + r], strict=True):
                b.op(f"mov.f32 {dst}, {src}")
        b.op(f"add.u32 {oh}, {oh}, {U}")
        b.op(f"add.u32 {ihk}, {ihk}, {U * sh}")
        b.op(f"bra.uni {top}")
        b.label(end)

    def store(self, addr: str, outs: list[str], live: str, ovec: str, colok: list[str]) -> None:
        """The lane's outputs of one row: one vector store where `ovec`, else each column
        under its own predicate; nothing where the row is not `live`."""
        b, ir = self.b, self.ir
        dt = ir.out_dtype
        es = ESIZE[dt]
        V = len(outs)
        if es == 4:
            words = outs
        else:
            cvt = "bf16" if dt == "bf16" else "f16"
            halves = []
            for v in outs:
                h = b.reg("b16")
                b.op(f"cvt.rn.{cvt}.f32 {h}, {v}")
                halves.append(h)
            words = []
            if V >= 2:
                for e in range(0, V, 2):
                    w = b.reg("b32")
                    b.op(f"mov.b32 {w}, {{{halves[e]}, {halves[e + 1]}}}")
                    words.append(w)
        pv, ps = b.reg("pred"), b.reg("pred")
        b.op(f"and.pred {pv}, {ovec}, {live}")
        if V * es in VECTOR_BYTES and V * es >= 4:
            ty = "f32" if es == 4 else "b32"
            if len(words) == 1:
                b.op(f"@{pv} st.global.{ty} [{addr}], {words[0]}")
            else:
                b.op(f"@{pv} st.global.v{len(words)}.{ty} [{addr}], {{{', '.join(words)}}}")
            nv = b.reg("pred")
            b.op(f"not.pred {nv}, {ovec}")
            b.op(f"and.pred {ps}, {live}, {nv}")  # the element path below
        else:
            b.op(f"mov.pred {ps}, {live}")
        for j in range(V):
            pj = b.reg("pred")
            b.op(f"and.pred {pj}, {ps}, {colok[j]}")
            if es == 4:
                b.op(f"@{pj} st.global.f32 [{addr}+{4 * j}], {outs[j]}")
            else:
                b.op(f"@{pj} st.global.b16 [{addr}+{2 * j}], {halves[j]}")

    # -- the kernel ------------------------------------------------------------------------

    def rows_as_planes(self, TR: int, U: int) -> dict:
        """A 1-D pool: its rows (every index of the leading axes) taken as the rows of planes
        of TR x U rows each (the last one shorter), so a block's thread rows each walk `unroll`
        rows at once; a 1-D window has one row and no carried rows."""
        b, k, ir, s = self.b, self.k, self.ir, self.s
        L = s.lanes
        rows = k.product(ir.shape[:-1])
        W = k.dim_reg(ir.shape[-1])
        OW = k.dim_reg(ir.out_shape[-1])
        base, tid, lane, trow = k.bases_and_lanes(L)
        oh_start = b.reg("b32")
        b.op(f"mul.lo.u32 {oh_start}, {trow}, {U}")
        e = self.g["e"]
        wmod = b.reg("b32")
        b.op(f"rem.u32 {wmod}, {W}, {e}" if e & (e - 1) else f"and.b32 {wmod}, {W}, {e - 1}")
        waligned = b.reg("pred")
        b.op(f"setp.eq.u32 {waligned}, {wmod}, 0")
        planes = b.reg("b32")
        b.op(f"add.u32 {planes}, {rows}, {TR * U - 1}")
        b.op(f"shr.u32 {planes}, {planes}, {int(math.log2(TR * U))}")
        plane, nplanes = k.u32("%ctaid.x"), k.u32("%nctaid.x")
        top_p, end_p = b.new_label("plane"), b.new_label("plane_end")
        b.label(top_p)
        pp = b.reg("pred")
        b.op(f"setp.ge.u32 {pp}, {plane}, {planes}")
        b.op(f"@{pp} bra.uni {end_p}")
        first, H = b.reg("b32"), b.reg("b32")
        b.op(f"mul.lo.u32 {first}, {plane}, {TR * U}")
        b.op(f"sub.u32 {H}, {rows}, {first}")
        b.op(f"min.u32 {H}, {H}, {TR * U}")
        oh_end = b.reg("b32")
        b.op(f"add.u32 {oh_end}, {oh_start}, {U}")
        b.op(f"min.u32 {oh_end}, {oh_end}, {H}")
        ibase, obase = b.reg("b32"), b.reg("b32")
        b.op(f"mul.lo.u32 {ibase}, {first}, {W}")
        b.op(f"mul.lo.u32 {obase}, {first}, {OW}")
        return {"H": H, "W": W, "OW": OW, "ibase": ibase, "obase": obase, "base": base,
                "obase_ptr": base[ir.out], "oh_start": oh_start, "oh_end": oh_end,
                "lane": lane, "waligned": waligned, "plane": plane, "nplanes": nplanes,
                "top_p": top_p, "end_p": end_p}  # fmt: skip

    def render(self) -> Emitted:  # noqa: C901 - one kernel, top to bottom
        ir, s, b, k = self.ir, self.s, self.b, self.k
        V, T, L = s.vec, s.threads, s.lanes
        TR = T // L
        U = s.unroll
        nd = ir.nd
        self.g = strip_geometry(ir, V, U)
        self.pad = f32_literal(-math.inf if ir.op == "max" else 0.0)
        self.combine = "max.f32" if ir.op == "max" else "add.f32"
        params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
        params += [KernelParam("tensor", "u64", ir.out)]
        params += [KernelParam("dim", "u32", d) for d in ir.dims]
        if nd == 1:
            ctx = self.rows_as_planes(TR, U)
        else:
            planes = k.product(ir.shape[:-nd])
            H = k.dim_reg(ir.shape[-2]) if nd == 2 else k.u32(1)
            W = k.dim_reg(ir.shape[-1])
            OH = k.dim_reg(ir.out_shape[-2]) if nd == 2 else k.u32(1)
            OW = k.dim_reg(ir.out_shape[-1])
            base, tid, lane, trow = k.bases_and_lanes(L)
            # the band of output rows this thread row walks: ceil(OH / TR) rounded up to unroll
            bh = b.reg("b32")
            b.op(f"add.u32 {bh}, {OH}, {TR * U - 1}")
            b.op(f"shr.u32 {bh}, {bh}, {int(math.log2(TR * U))}")
            b.op(f"mul.lo.u32 {bh}, {bh}, {U}")
            oh_start, oh_end = b.reg("b32"), b.reg("b32")
            b.op(f"mul.lo.u32 {oh_start}, {trow}, {bh}")
            b.op(f"add.u32 {oh_end}, {oh_start}, {bh}")
            b.op(f"min.u32 {oh_end}, {oh_end}, {OH}")
            # the vector path needs every row's spans aligned: W a multiple of vec * stride_w
            e = self.g["e"]
            wmod = b.reg("b32")
            b.op(f"rem.u32 {wmod}, {W}, {e}" if e & (e - 1) else f"and.b32 {wmod}, {W}, {e - 1}")
            waligned = b.reg("pred")
            b.op(f"setp.eq.u32 {waligned}, {wmod}, 0")
            plane, nplanes = k.u32("%ctaid.x"), k.u32("%nctaid.x")
            HW, OHW = b.reg("b32"), b.reg("b32")
            b.op(f"mul.lo.u32 {HW}, {H}, {W}")
            b.op(f"mul.lo.u32 {OHW}, {OH}, {OW}")
            top_p, end_p = b.new_label("plane"), b.new_label("plane_end")
            b.label(top_p)
            pp = b.reg("pred")
            b.op(f"setp.ge.u32 {pp}, {plane}, {planes}")
            b.op(f"@{pp} bra.uni {end_p}")
            ibase, obase = b.reg("b32"), b.reg("b32")
            b.op(f"mul.lo.u32 {ibase}, {plane}, {HW}")
            b.op(f"mul.lo.u32 {obase}, {plane}, {OHW}")
            ctx = {"H": H, "W": W, "OW": OW, "ibase": ibase, "obase": obase, "base": base,
                   "obase_ptr": base[ir.out], "oh_start": oh_start, "oh_end": oh_end,
                   "lane": lane, "waligned": waligned, "plane": plane, "nplanes": nplanes,
                   "top_p": top_p, "end_p": end_p}  # fmt: skip
        lane, W, OW, waligned = ctx["lane"], ctx["W"], ctx["OW"], ctx["waligned"]
        plane, nplanes, top_p, end_p = ctx["plane"], ctx["nplanes"], ctx["top_p"], ctx["end_p"]
        e = self.g["e"]
        ow0 = b.reg("b32")
        b.op(f"mul.lo.u32 {ow0}, {lane}, {V}")
        top_c, end_c = b.new_label("ocol"), b.new_label("ocol_end")
        b.label(top_c)
        pc = b.reg("pred")
        b.op(f"setp.ge.u32 {pc}, {ow0}, {OW}")
        b.op(f"@{pc} bra {end_c}")
        c0 = b.reg("b32")
        b.op(f"mul.lo.u32 {c0}, {ow0}, {ir.stride[1]}")
        cend, vok = b.reg("b32"), b.reg("pred")
        b.op(f"add.u32 {cend}, {c0}, {e}")
        b.op(f"setp.le.u32 {vok}, {cend}, {W}")
        b.op(f"and.pred {vok}, {vok}, {waligned}")
        elems, walked = b.new_label("elems"), b.new_label("walked")
        b.op(f"@!{vok} bra {elems}")
        self.band(True, c0, ow0, ctx)
        b.op(f"bra {walked}")
        b.label(elems)
        self.band(False, c0, ow0, ctx)
        b.label(walked)
        b.op(f"add.u32 {ow0}, {ow0}, {L * V}")
        b.op(f"bra {top_c}")
        b.label(end_c)
        b.op(f"add.u32 {plane}, {plane}, {nplanes}")
        b.op(f"bra.uni {top_p}")
        b.label(end_p)
        b.op("ret")
        entry = f"{ident(ir.name)}_{ir.op}pool_{s.tag()}"
        ptx = module_text(
            family="pool", workload=ir.name, schedule=s.header(), arch=k.arch,
            entry=entry, params=params, threads=T, body=b.declarations(), lines=b.lines,
        )  # fmt: skip
        if s.minblocks:  # blocks a SM for ptxas: after the entry's thread count
            at = ptx.index("\n", ptx.index(".maxntid"))
            ptx = ptx[:at] + f"\n.minnctapersm {s.minblocks}" + ptx[at:]
        planes = shape_product(ir.shape[:-nd])
        if nd == 1:
            planes = f"ceildiv({planes}, {TR * U})"
        grid = f"min({planes}, {ctx_max_blocks()})"
        return Emitted(ptx, entry, tuple(params), Launch((grid, 1, 1), (T, 1, 1)))


def ctx_max_blocks() -> int:
    from factory.families.pool import MAX_BLOCKS

    return MAX_BLOCKS
