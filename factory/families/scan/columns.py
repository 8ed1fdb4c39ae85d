"""The scan family's column kernel: a scan along a leading or middle axis, the tensor viewed as
(P, R, Q) with R scanned and Q contiguous, in one pass over HBM.

A block is `lanes` threads along Q (each owning `vec` adjacent columns: one 16-byte load a row
where Q allows) times G = threads / lanes thread rows; a cluster of `split` blocks shares one
strip of lanes x vec columns. The strip's rows go in rounds of split x G x `rows` rows: thread
row g of cluster rank c holds rows (c G + g) rows ... + rows - 1 of the round in registers
(all its loads issued before any is used) and scans them there, column by column. The thread
rows' totals meet in shared memory, where one pass folds them in order (each slot left holding
the exclusive fold of the thread rows before it, and the block's total beside them); the
cluster's blocks read each other's totals through distributed shared memory in rank order; each
thread then adds carry + ranks before + thread rows before to its rows and stores them, and
every thread of the cluster takes the same new carry (the same combinations in the same order).
So every element is read once and written once, every combination has a fixed order (the same
bits each run), and the only waits are two barriers a round (shared memory double-buffered by
the round's parity, so no third)."""

from __future__ import annotations

import math

from factory.emit import Emitted
from factory.emit.module import module_text
from factory.families.colreduce.kernel import COMBINE, ESIZE, MAX_CLUSTERS, ident, shape_product
from factory.spec.types import KernelParam, Launch


def smem_words(threads: int, lanes: int, vec: int) -> int:
    """Shared f32 words: two parities of (thread rows' totals, the block's totals, the
    columns' prefixes)."""
    return 2 * (threads + 2 * lanes) * vec


def raw_regs(k, dtype: str) -> list[str]:
    """Registers for k.V elements of dtype as loaded (one b16, or b32 words)."""
    b, V, es = k.b, k.V, ESIZE[dtype]
    if es == 2 and V == 1:
        return [b.reg("b16")]
    return [b.reg("b32") for _ in range(max(1, V * es // 4))]


def issue_raw(k, regs: list[str], ptr: str, dtype: str, pred: str) -> None:
    """The load into `regs` under pred (0 otherwise); nothing reads them yet."""
    b = k.b
    if len(regs) == 1 and regs[0].startswith("%h"):
        b.op(f"mov.b16 {regs[0]}, 0")
        b.op(f"@{pred} ld.global.nc.b16 {regs[0]}, [{ptr}]")
        return
    for w in regs:
        b.op(f"mov.b32 {w}, 0")
    if len(regs) == 1:
        b.op(f"@{pred} ld.global.nc.b32 {regs[0]}, [{ptr}]")
    else:
        b.op(f"@{pred} ld.global.nc.v{len(regs)}.b32 {{{', '.join(regs)}}}, [{ptr}]")


def unpack_raw(k, regs: list[str], dtype: str) -> list[str]:
    """f32 registers of the elements in `regs`."""
    b, es = k.b, ESIZE[dtype]
    if es == 2 and k.V == 1:
        return [k.widen16(regs[0], dtype)]
    out = []
    for w in regs:
        if es == 4:
            f = b.reg("f32")
            b.op(f"mov.b32 {f}, {w}")
            out.append(f)
        else:
            out += k.unpack16(w, dtype)
    return out


def store_vector_if(k, addr: str, dtype: str, vals: list[str], pred: str) -> None:
    """Adjacent f32 results stored at addr under pred (16-bit ones packed two a word)."""
    b, es = k.b, ESIZE[dtype]
    cvt1 = "bf16" if dtype == "bf16" else "f16"
    if es == 2 and len(vals) == 1:
        h = b.reg("b16")
        b.op(f"cvt.rn.{cvt1}.f32 {h}, {vals[0]}")
        b.op(f"@{pred} st.global.b16 [{addr}], {h}")
        return
    if es == 4:
        words, ty = vals, "f32"
    else:
        words, ty = [], "b32"
        for e in range(0, len(vals), 2):
            w = b.reg("b32")
            b.op(f"cvt.rn.{cvt1}x2.f32 {w}, {vals[e + 1]}, {vals[e]}")
            words.append(w)
    for g in range(0, len(words), 4):
        group = words[g : g + 4]
        where = f"[{addr}+{4 * g}]" if g else f"[{addr}]"
        if len(group) == 1:
            b.op(f"@{pred} st.global.{ty} {where}, {group[0]}")
        else:
            b.op(f"@{pred} st.global.v{len(group)}.{ty} {where}, {{{', '.join(group)}}}")


def render_rounds(k) -> Emitted:  # noqa: C901 - one kernel, top to bottom
    """The column scan of the module docstring, for a ScanKernel `k` (its builder, ir, schedule
    and the column family's load/evaluate helpers)."""
    ir, s, b = k.ir, k.s, k.b
    V, T, S, L, K = k.V, s.threads, s.split, s.lanes, s.rows
    ahead = bool(s.ahead)
    G, C = T // L, s.lanes * k.V
    o = ir.outputs[0]
    op, idn = k.op, k.ident
    comb = COMBINE[op]
    params = [KernelParam("tensor", "u64", name) for name, _ in ir.inputs]
    params += [KernelParam("tensor", "u64", o.name)]
    params += [KernelParam("dim", "u32", d) for d in ir.dims]
    P = k.product(ir.shape[: ir.axis])
    R = k.product(ir.shape[ir.axis : ir.axis + 1])
    Q = k.product(ir.shape[ir.axis + 1 :])
    base = {}
    for name, _ in [*ir.inputs, (o.name, o.dtype)]:
        r = b.reg("b64")
        b.op(f"ld.param.u64 {r}, [p_{ident(name)}]")
        b.op(f"cvta.to.global.u64 {r}, {r}")
        base[name] = r
    tid = k.u32("%tid.x")
    lane, grow = b.reg("b32"), b.reg("b32")  # this thread's lane along Q, thread row along R
    b.op(f"and.b32 {lane}, {tid}, {L - 1}")
    b.op(f"shr.u32 {grow}, {tid}, {int(math.log2(L))}")
    cl, ncl = k.u32("%ctaid.x"), k.u32("%nctaid.x")
    lg = int(math.log2(S))
    if S > 1:
        b.op(f"shr.u32 {cl}, {cl}, {lg}")
        b.op(f"shr.u32 {ncl}, {ncl}, {lg}")
    rank = k.u32("%cluster_ctarank") if S > 1 else k.u32(0)
    seg = b.reg("b32")  # the first of this thread's rows in a round
    b.op(f"mad.lo.u32 {seg}, {rank}, {G}, {grow}")
    b.op(f"mul.lo.u32 {seg}, {seg}, {K}")
    p, qb, carry_into_p = k.column_blocks(Q, C, cl)
    qmod = b.reg("b32")
    b.op(f"and.b32 {qmod}, {Q}, {V - 1}")
    qaligned = b.reg("pred")
    b.op(f"setp.eq.u32 {qaligned}, {qmod}, 0")
    RQ = b.reg("b32")
    b.op(f"mul.lo.u32 {RQ}, {R}, {Q}")
    smem = k.u32("red_smem")
    half = 4 * (T + 2 * L) * V  # bytes of one parity
    par = k.u32(0)  # this round's parity: 0 or `half`
    mytot = b.reg("b32")  # slot (j = 0, tid) of the thread rows' totals, laid out [j][tid]
    b.op(f"mad.lo.u32 {mytot}, {tid}, 4, {smem}")
    myblk = b.reg("b32")  # slot (j = 0, lane) of the block's totals, laid out [j][lane]
    b.op(f"mad.lo.u32 {myblk}, {lane}, 4, {smem}")
    b.op(f"add.u32 {myblk}, {myblk}, {4 * T * V}")  # the columns' prefixes: L*V words on
    item, done = b.new_label("item"), b.new_label("done")
    b.label(item)
    pd = b.reg("pred")
    b.op(f"setp.ge.u32 {pd}, {p}, {P}")
    b.op(f"@{pd} bra.uni {done}")
    q0 = b.reg("b32")
    b.op(f"mul.lo.u32 {q0}, {qb}, {C}")
    b.op(f"mad.lo.u32 {q0}, {lane}, {V}, {q0}")
    qend = b.reg("b32")
    b.op(f"add.u32 {qend}, {q0}, {V}")
    whole = b.reg("pred")
    b.op(f"setp.le.u32 {whole}, {qend}, {Q}")
    b.op(f"and.pred {whole}, {whole}, {qaligned}")

    def in_q(rp: str, j: int) -> str:
        """Predicate: column q0 + j is inside Q and the row under rp inside R (made where it
        is used: V predicates held through a round would take registers)."""
        qj, pj = b.reg("b32"), b.reg("pred")
        b.op(f"add.u32 {qj}, {q0}, {j}")
        b.op(f"setp.lt.u32 {pj}, {qj}, {Q}")
        b.op(f"and.pred {pj}, {pj}, {rp}")
        return pj

    pbase = b.reg("b32")  # element (p, 0, q0)
    b.op(f"mad.lo.u32 {pbase}, {p}, {RQ}, {q0}")
    ccarry = [b.reg("f32") for _ in range(math.ceil(C / T))]  # the fold columns' carries
    for c_ in ccarry:
        b.op(f"mov.f32 {c_}, {idn}")

    def row_info(r_first: str) -> list[tuple[str, str]]:
        """This thread's K rows of the round starting at r_first: (in-R predicate, element
        index of (p, row, q0))."""
        out = []
        for kk in range(K):
            lr, rp, at = b.reg("b32"), b.reg("pred"), b.reg("b32")
            b.op(f"add.u32 {lr}, {r_first}, {seg}")
            if kk:
                b.op(f"add.u32 {lr}, {lr}, {kk}")
            b.op(f"setp.lt.u32 {rp}, {lr}, {R}")
            if ir.reverse:
                b.op(f"sub.u32 {lr}, {R}, {lr}")
                b.op(f"sub.u32 {lr}, {lr}, 1")
            b.op(f"mad.lo.u32 {at}, {lr}, {Q}, {pbase}")
            out.append((rp, at))
        return out

    def issue_rows(regs, rows_) -> None:
        for kk, (rp, at) in enumerate(rows_):
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                issue_raw(k, regs[kk][name], addr, dtype, rp)

    def element_row(rp: str, at: str) -> list[str]:
        """The operand at one row's V columns, loaded element by element under their
        predicates (identity outside the tensor): the path of columns that are not one whole
        aligned vector. A row at a time, so that only V values are live."""
        vs = []
        for j in range(V):
            pj = in_q(rp, j)
            ins = {}
            for name, dtype in ir.inputs:
                addr = b.reg("b64")
                b.op(f"mul.wide.u32 {addr}, {at}, {ESIZE[dtype]}")
                b.op(f"add.u64 {addr}, {addr}, {base[name]}")
                ins[name] = k.load_scalar(k.plus(addr, j * ESIZE[dtype]), dtype, pj)
            ev, v = k.evaluate(ins)[0], b.reg("f32")
            b.op(f"selp.f32 {v}, {ev}, {idn}, {pj}")
            vs.append(v)
        return vs

    def vector_values(raw_, rows_, kk: int) -> list[str]:
        """The operand at row kk's V columns, from the words loaded into raw_ (identity past
        R); made again after the barriers instead of held, so that only the words stay."""
        per = {name: unpack_raw(k, raw_[kk][name], dtype) for name, dtype in ir.inputs}
        vs = []
        for j in range(V):
            ev, v = k.evaluate({name: per[name][j] for name, _ in ir.inputs})[0], b.reg("f32")
            b.op(f"selp.f32 {v}, {ev}, {idn}, {rows_[kk][0]}")
            vs.append(v)
        return vs

    r0 = k.u32(0)
    raw = [{name: raw_regs(k, dtype) for name, dtype in ir.inputs} for _ in range(K)]
    if ahead:  # round 0's whole vectors in flight before the loop
        nxt_raw = [{name: raw_regs(k, dtype) for name, dtype in ir.inputs} for _ in range(K)]
        nopre = b.new_label("no_prefetch")
        b.op(f"@!{whole} bra {nopre}")
        issue_rows(raw, row_info(r0))
        b.label(nopre)
    rnd, rnd_end = b.new_label("round"), b.new_label("round_end")
    b.label(rnd)
    pr = b.reg("pred")
    b.op(f"setp.ge.u32 {pr}, {r0}, {R}")
    b.op(f"@{pr} bra.uni {rnd_end}")
    rows = row_info(r0)
    # the thread's total of each column over its K rows, in row order
    tots = [b.reg("f32") for _ in range(V)]

    def add_to_totals(vs_by_row, first: bool = True) -> None:
        for kk, vs in enumerate(vs_by_row):
            for j in range(V):
                if kk or not first:
                    b.op(f"{comb} {tots[j]}, {tots[j]}, {vs[j]}")
                else:
                    b.op(f"mov.f32 {tots[j]}, {vs[j]}")

    el, ld = b.new_label("elems"), b.new_label("loaded")
    b.op(f"@!{whole} bra {el}")
    if not ahead:
        issue_rows(raw, rows)  # every row's loads first, then the arithmetic
    for kk in range(K):  # a row's values made and added before the next row's
        add_to_totals([vector_values(raw, rows, kk)], first=kk == 0)
    if ahead:  # the next round's vectors go out before this round's barriers
        nxt = b.reg("b32")
        b.op(f"add.u32 {nxt}, {r0}, {S * G * K}")
        issue_rows(nxt_raw, row_info(nxt))
    b.op(f"bra {ld}")
    b.label(el)
    for kk, (rp, at) in enumerate(rows):
        add_to_totals([element_row(rp, at)], first=kk == 0)
    b.label(ld)
    tot = b.reg("b32")
    b.op(f"add.u32 {tot}, {mytot}, {par}")
    for j in range(V):
        b.op(f"st.shared.f32 [{tot}+{4 * j * T}], {tots[j]}")
    b.op("bar.sync 0")
    # one pass over the thread rows' totals, a column (lane, j) a thread: each slot takes the
    # exclusive fold of the thread rows before it; the block's total goes to the cluster, or
    # (no cluster) straight into the column's carry
    cols = []  # (column's carry, its block total's slot, its prefix slot, skip predicate)
    for it in range(math.ceil(C / T)):
        c = b.reg("b32")
        b.op(f"add.u32 {c}, {tid}, {it * T}")
        skip, pc = b.new_label("folded"), None
        if C % T:
            pc = b.reg("pred")
            b.op(f"setp.ge.u32 {pc}, {c}, {C}")
            b.op(f"@{pc} bra {skip}")
        cl_, cj = b.reg("b32"), b.reg("b32")
        b.op(f"and.b32 {cl_}, {c}, {L - 1}")
        b.op(f"shr.u32 {cj}, {c}, {int(math.log2(L))}")
        a0 = b.reg("b32")  # slot (j, g = 0, lane) = j*T + lane
        b.op(f"mad.lo.u32 {a0}, {cj}, {T}, {cl_}")
        b.op(f"mad.lo.u32 {a0}, {a0}, 4, {smem}")
        b.op(f"add.u32 {a0}, {a0}, {par}")
        run = b.reg("f32")
        b.op(f"mov.f32 {run}, {idn}")
        for g0 in range(0, G, 8):  # eight loads in flight, then their folds
            ts = []
            for gg in range(g0, min(G, g0 + 8)):
                t = b.reg("f32")
                b.op(f"ld.shared.f32 {t}, [{a0}+{4 * gg * L}]")
                ts.append((gg, t))
            for gg, t in ts:
                b.op(f"st.shared.f32 [{a0}+{4 * gg * L}], {run}")
                b.op(f"{comb} {run}, {run}, {t}")
        bt = b.reg("b32")  # the column's slot (j, lane) in the block totals: (j*L + lane)*4
        b.op(f"mad.lo.u32 {bt}, {cj}, {L}, {cl_}")
        b.op(f"mad.lo.u32 {bt}, {bt}, 4, {smem}")
        b.op(f"add.u32 {bt}, {bt}, {par}")
        cc = ccarry[it]
        if S > 1:
            b.op(f"st.shared.f32 [{bt}+{4 * T * V}], {run}")
        else:  # the prefix of this round's rows: the carry; the carry takes the block's total
            b.op(f"st.shared.f32 [{bt}+{4 * (T + L) * V}], {cc}")
            b.op(f"{comb} {cc}, {cc}, {run}")
        cols.append((cc, bt, skip, pc))
        b.label(skip)
    if S > 1:
        b.op("barrier.cluster.arrive.release.aligned")
        b.op("barrier.cluster.wait.acquire.aligned")
        # a column a thread: the cluster's block totals in rank order (split remote loads a
        # column, not a thread: the thread rows share them through shared memory)
        for cc, bt, _, pc in cols:
            skip = b.new_label("ranked")
            if pc is not None:
                b.op(f"@{pc} bra {skip}")
            before = b.reg("f32")
            b.op(f"mov.f32 {before}, {cc}")
            ts = []
            for sr in range(S):  # every remote load first, then the folds in rank order
                remote, t = b.reg("b32"), b.reg("f32")
                b.op(f"mapa.shared::cluster.u32 {remote}, {bt}, {sr}")
                b.op(f"ld.shared::cluster.f32 {t}, [{remote}+{4 * T * V}]")
                ts.append(t)
            for sr, t in enumerate(ts):
                earlier = b.reg("pred")
                b.op(f"setp.gt.u32 {earlier}, {rank}, {sr}")
                t2 = b.reg("f32")
                b.op(f"{comb} {t2}, {before}, {t}")
                b.op(f"selp.f32 {before}, {t2}, {before}, {earlier}")
                b.op(f"{comb} {cc}, {cc}, {t}")
            b.op(f"st.shared.f32 [{bt}+{4 * (T + L) * V}], {before}")
            b.label(skip)
    b.op("bar.sync 0")
    # carry + the ranks before this one (the column's prefix slot), then the thread rows
    # before this one
    blk = b.reg("b32")
    b.op(f"add.u32 {blk}, {myblk}, {par}")
    before = []
    for j in range(V):
        t = b.reg("f32")
        b.op(f"ld.shared.f32 {t}, [{blk}+{4 * (j * L + L * V)}]")
        before.append(t)
    pre = []
    for j in range(V):
        ex = b.reg("f32")
        b.op(f"ld.shared.f32 {ex}, [{tot}+{4 * j * T}]")
        pj = b.reg("f32")
        b.op(f"{comb} {pj}, {before[j]}, {ex}")
        pre.append(pj)

    def out_row(run: list[str], vs: list[str]) -> list[str]:
        """A row's results, `run` (the prefix of the rows before it) taking the row's
        values: inclusive, the results after; exclusive, before."""
        outs = []
        for j in range(V):
            r = b.reg("f32")
            if ir.exclusive:
                b.op(f"mov.f32 {r}, {run[j]}")
                b.op(f"{comb} {run[j]}, {run[j]}, {vs[j]}")
            else:
                b.op(f"{comb} {run[j]}, {run[j]}, {vs[j]}")
                b.op(f"mov.f32 {r}, {run[j]}")
            outs.append(r)
        return outs

    es = ESIZE[o.dtype]
    sel, stored = b.new_label("st_elems"), b.new_label("stored")
    rows = row_info(r0)  # made again, not held across the barriers

    def out_addr(at: str) -> str:
        addr = b.reg("b64")
        b.op(f"mul.wide.u32 {addr}, {at}, {es}")
        b.op(f"add.u64 {addr}, {addr}, {base[o.name]}")
        return addr

    run = pre  # the prefix runs on through the thread's rows
    b.op(f"@!{whole} bra {sel}")
    for kk, (rp, _) in enumerate(rows):
        outs = out_row(run, vector_values(raw, rows, kk))
        store_vector_if(k, out_addr(rows[kk][1]), o.dtype, outs, rp)
    if ahead:  # the next round's words become this round's
        for kk in range(K):
            for name, _ in ir.inputs:
                for w_, n_ in zip(raw[kk][name], nxt_raw[kk][name], strict=True):
                    b.op(f"mov.b{16 if w_.startswith('%h') else 32} {w_}, {n_}")
    b.op(f"bra {stored}")
    b.label(sel)
    for rp, at in rows:  # loaded again (from cache), not held through the barriers
        outs = out_row(run, element_row(rp, at))
        for j in range(V):
            pj = in_q(rp, j)
            store_vector_if(k, k.plus(out_addr(at), j * es), o.dtype, [outs[j]], pj)
    b.label(stored)
    b.op(f"xor.b32 {par}, {par}, {half}")
    b.op(f"add.u32 {r0}, {r0}, {S * G * K}")
    b.op(f"bra.uni {rnd}")
    b.label(rnd_end)
    b.op(f"add.u32 {qb}, {qb}, {ncl}")
    carry_into_p()
    b.op(f"bra.uni {item}")
    b.label(done)
    if S > 1:  # no block leaves while the cluster may still read its shared memory
        b.op("barrier.cluster.arrive.release.aligned")
        b.op("barrier.cluster.wait.acquire.aligned")
    b.op("ret")
    entry = f"{ident(ir.name)}_scan_{s.tag()}"
    body = b.declarations() + [f"    .shared .align 16 .f32 red_smem[{smem_words(T, L, V)}];"]
    ptx = module_text(
        family="scan", workload=ir.name, schedule=s.to_dict(), arch=k.arch,
        entry=entry, params=params, threads=T, body=body, lines=b.lines, cluster=S,
    )  # fmt: skip
    if T < 512:  # at least 512 threads an SM: registers held to 128 a thread
        head = f".maxntid {T}, 1, 1"
        ptx = ptx.replace(head, f"{head}\n.minnctapersm {512 // T}", 1)
    outer = shape_product(ir.shape[: ir.axis])
    inner = shape_product(ir.shape[ir.axis + 1 :])
    clusters = f"min({outer}*ceildiv({inner}, {C}), {MAX_CLUSTERS})"
    grid = f"{S}*{clusters}" if S > 1 else clusters
    launch = Launch((grid, 1, 1), (T, 1, 1), cluster=(S, 1, 1) if S > 1 else None)
    return Emitted(ptx, entry, tuple(params), launch)
