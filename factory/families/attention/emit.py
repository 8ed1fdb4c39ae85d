"""The Hopper (sm_90a) attention forward emitter: TMA loads, an mbarrier ring, wgmma for both
products, online softmax in registers (see schedule.py for the CTA's plan, tiling.py for the
tile arithmetic and a numpy model of this loop).

One CTA = (query tile qt of block_m rows, query head h, batch entry b): ctaid.x walks the query
tiles (last first with a causal-like band: the longest rows of a head start first), ctaid.y is
h, ctaid.z is b, so the CTAs that run together share K and V in L2.
Key/value head: h / (Hq / Hkv).

Shared memory from a 1024-byte aligned base; every tile is stored as D / 64 column chunks of
128-byte rows (64 bf16), the TMA writing 16-byte chunk c of row r at chunk c ^ (r % 8) (128-byte
swizzle):
  Q:      D/64 chunks x (block_m rows x 128 B)                      loaded once
  K ring: stages x D/64 chunks x (block_n rows x 128 B)
  V ring: stages x D/64 chunks x (block_n rows x 128 B)
  qfull, full[stages] (K), fullv[stages], empty[stages] (K), emptyv[stages]: 8-byte mbarriers
The tensor maps are 3D (D, sequence, B * heads) so a tile past the sequence's end is filled with
zeros by the TMA instead of reading the next head's rows.

S = Q K^T: wgmma m64n{block_n}k16, A = the consumer's 64 rows of Q and B = K, both K-major with
the 128-byte swizzle (the matmul family's descriptors: start >> 4, LBO 1, SBO 1024 B). k16 steps
add 32 bytes inside a chunk; the next chunk starts rows x 128 bytes further.

O += P V: A = P from registers (the S accumulator's fragment is the A fragment's layout: register
pair (4j + 2h, 4j + 2h + 1) of the accumulator holds the two k values of A register (2j' + h)
for k16 slice j // 2), converted to bf16 pairs; B = V as stored, [keys, D] with D contiguous:
an MN-major operand (imm-trans-b = 1), whose descriptor's stride byte offset is the distance
between groups of 8 keys (1024 B) and leading byte offset the distance between 64-column atoms
(block_n x 128 B, one chunk). k16 steps add 16 rows = 2048 bytes.

Softmax in base 2: x = score(s) * log2(e); per row m (running max, reduced over the 4 lanes
that share the row), l (this thread's partial sum, reduced at the end), O scaled by
2^(m_old - m_new). A row with no key left keeps m = -inf and l = 0: its output is 0, its
log-sum-exp -inf. Masked tiles (partial band, the sequence's tail, or any elementwise mask term)
set x = -inf where a term is false or j >= Skv; the others apply no mask.

An id match x[i] == x[j] (a document mask) narrows [first, end) before the loop (id_scan,
id_narrow: every thread scans the ids of the band's keys against the [min, max] of the query
tile's ids, the warps' results meet in the K ring's first bytes before any TMA writes there), so
tiles that cannot hold a key of the tile's documents are never loaded.
"""

from __future__ import annotations

from factory.emit.hopper import TMA_LOAD, WGMMA_TYPE, HopperKernel, ptx_head
from factory.emit.ptx import LOG2E, Builder, EmitError, f32_literal
from factory.emit.types import Emitted
from factory.families.attention.ir import AttentionIR, alibi_of, linear_in_s
from factory.families.attention.schedule import (
    PRODUCER_REGS,
    AttentionSchedule,
    entry_regs,
    is_valid,
)
from factory.families.attention.tiling import WARP_ROWS, flag_rows, id_pure_path
from factory.families.matmul.emit import _Epilogue
from factory.spec import expr as E
from factory.spec.attention import PLACEHOLDERS
from factory.spec.types import KernelParam, Launch

CVT_PAIR = {"bf16": "bf16x2", "fp16": "f16x2"}
ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int32": 4}
LN2 = 0.6931471805599453
# Diagnostic switch for a GPU run (lab/attention/bench.py --swap-v-offsets): swaps the V
# descriptor's two byte offsets, in case the hardware reads them the other way round.
SWAP_V_OFFSETS = False
# CTAs of a persistent launch: the SMs of an H100 / H200 SXM (one CTA an SM at these tiles)
PERSISTENT_CTAS = 132


def v_desc_const(block_n: int) -> int:
    """The address-independent bits of V's descriptor: MN-major, 128-byte swizzle, LBO = one
    64-column chunk (block_n rows x 128 B), SBO = 8 rows x 128 B."""
    lbo, sbo = block_n * 128 >> 4, 1024 >> 4
    if SWAP_V_OFFSETS:
        lbo, sbo = sbo, lbo
    return (lbo << 16) | (sbo << 32) | (1 << 62)


def _dim(d) -> str:
    return str(d)


# tanh(x) = x * P(x^2) for |x| < TANH_FAST_T: P of degree 6, fitted to the relative error
# (reweighted least squares at Chebyshev nodes, coefficients rounded to fp32); evaluated in fp32
# by Horner it is within 1.1e-7 of tanh there (tests/factory/test_attention_family.py). On the
# FMA pipe: the soft cap's two MUFU operations a score (ex2, rcp) move off the MUFU.
TANH_FAST_T = 0.75
TANH_POLY = (
    1.0,
    -0.3333330750465393,
    0.13332578539848328,
    -0.053885627537965775,
    0.021430864930152893,
    -0.00762701453641057,
    0.0017203452298417687,
)


def tanh_poly(x):
    """The fast path's tanh in numpy float32 (the PTX's Horner order), for the tests."""
    import numpy as np

    x = np.asarray(x, np.float32)
    u = (x * x).astype(np.float32)
    p = np.float32(TANH_POLY[-1])
    for c in reversed(TANH_POLY[:-1]):
        p = (p * u + np.float32(c)).astype(np.float32)
    return (p * x).astype(np.float32)


class _Score(_Epilogue):
    """The matmul epilogue's evaluator of elementwise expressions (fast forms: no subroutine
    calls, which would make ptxas serialise the wgmmas), with a tanh accurate to a few ulp:
    tanh.approx's 2^-11 relative error, times a soft cap of 30, moves the log-sum-exp by more
    than its fp32 tolerance. 1 - 2 / (2^(2|x| log2 e) + 1) with rcp.approx, the sign put back;
    an odd Taylor polynomial below |x| = 0.3, where that form cancels."""

    fast_tanh = False  # the tile's tanh arguments all lie within +-TANH_FAST_T

    def value(self, node, env, memo):
        if isinstance(node, E.Unary) and node.op == "tanh" and node not in memo:
            x = self.value(node.x, env, memo)
            memo[node] = self._tanh_fast(x) if self.fast_tanh else self._tanh(x)
            return memo[node]
        return super().value(node, env, memo)

    def _tanh_fast(self, x: str) -> str:
        b = self.b
        u, p = b.reg("f32"), b.reg("f32")
        b.op(f"mul.f32 {u}, {x}, {x}")
        b.op(f"mov.f32 {p}, {f32_literal(TANH_POLY[-1])}")
        for c in reversed(TANH_POLY[:-1]):
            b.op(f"fma.rn.f32 {p}, {p}, {u}, {f32_literal(c)}")
        r = b.reg("f32")
        b.op(f"mul.f32 {r}, {p}, {x}")
        return r

    def _tanh(self, x: str) -> str:
        b = self.b
        a, t, e, d, q, big, r = (b.reg("f32") for _ in range(7))
        b.op(f"abs.f32 {a}, {x}")
        b.op(f"mul.f32 {t}, {a}, {f32_literal(2 * LOG2E)}")
        b.op(f"ex2.approx.ftz.f32 {e}, {t}")
        b.op(f"add.f32 {d}, {e}, 0f3F800000")
        b.op(f"rcp.approx.ftz.f32 {q}, {d}")
        b.op(f"fma.rn.f32 {big}, {q}, 0fC0000000, 0f3F800000")  # 1 - 2q
        b.op(f"copysign.f32 {big}, {x}, {big}")
        x2, p = b.reg("f32"), b.reg("f32")
        b.op(f"mul.f32 {x2}, {x}, {x}")
        b.op(f"mov.f32 {p}, {f32_literal(62.0 / 2835.0)}")
        for c in (-17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0):
            b.op(f"fma.rn.f32 {p}, {p}, {x2}, {f32_literal(c)}")
        b.op(f"mul.f32 {p}, {p}, {x}")
        small = b.reg("pred")
        b.op(f"setp.lt.f32 {small}, {a}, 0f3E99999A")
        b.op(f"selp.f32 {r}, {p}, {big}, {small}")
        return r


def launch_for(ir: AttentionIR, s: AttentionSchedule) -> Launch:
    # query tiles fastest, then heads, batch entries slowest: the hardware starts CTAs in
    # linear order, so the CTAs running together are the query tiles of one or a few (batch,
    # head) pairs, whose K and V then come from L2 instead of memory; the query heads of one
    # kv head are adjacent (GQA shares K and V across them too). Under a causal band each
    # head's tiles start longest first (tile_range reverses the index).
    if s.persistent:
        # one CTA an SM (the H100's and H200's 132), each walking the work tiles in that order
        tiles = f"ceildiv({_dim(ir.s)}, {s.block_m}) * {_dim(ir.hq)} * {_dim(ir.b)}"
        grid = (f"min({tiles}, {PERSISTENT_CTAS})", 1, 1)
    else:
        grid = (f"ceildiv({_dim(ir.s)}, {s.block_m})", _dim(ir.hq), _dim(ir.b))
    return Launch(
        grid=grid,
        block=(s.threads(), 1, 1),
        smem_bytes=s.smem_bytes(ir.head_dim),
    )


def emit(ir: AttentionIR, s: AttentionSchedule, arch: str = "sm_90a") -> Emitted:
    why = is_valid(ir, s)
    if why is not None:
        raise EmitError(why)
    if arch not in ("sm_90", "sm_90a"):
        raise EmitError("the attention emitter renders sm_90a (wgmma, setmaxnreg)")
    return _Kernel(ir, s).render()


class _Kernel(HopperKernel):
    def __init__(self, ir: AttentionIR, s: AttentionSchedule):
        self.ir, self.s = ir, s
        self.b = Builder()
        self.d = ir.head_dim
        self.chunks = ir.head_dim // 64
        self.entry = (
            f"{ir.name}_fa_{s.block_m}x{s.block_n}_s{s.stages}"
            + ("_pv64" if s.pv_split else "")
            + ("_ov" if s.overlap else "")
            + ("_pp" if s.pingpong else "")
            + ("_persist" if s.persistent else "")
            + ("_ptanh" if s.poly_tanh else "")
        )
        self.q_bytes = s.block_m * self.d * 2
        self.kv_bytes = s.block_n * self.d * 2  # one K (or V) tile
        self.n_s = s.block_n // 2  # S accumulator registers a thread
        self.n_o = self.d // 2  # O accumulator registers a thread
        self.n_p = s.block_n // 4  # packed P registers a thread
        self.t = WGMMA_TYPE[ir.dtype]
        self.reads = self._reads()
        self.elementwise_reads_j = any(
            isinstance(n, E.Input) and n.name == "j" for t in ir.elementwise for n in E.walk(t)
        )
        score_nodes = list(E.walk(ir.score)) if ir.score is not None else []
        self.in_score = set(n for n in score_nodes if isinstance(n, E.Gather))
        self.score_reads = {
            n.name for n in score_nodes if isinstance(n, E.Input) and n.name in PLACEHOLDERS
        }
        # with only id matches as elementwise terms, tiles flagged by id_scan skip the compare
        self.id_pure = id_pure_path(ir)
        # k * s - coef * abs(i - j): one-sided tiles build the bias from one value a row
        self.alibi = alibi_of(ir.score)
        self.masked_always = bool(ir.elementwise) and not self.id_pure

    def _reads(self) -> set[str]:
        """Placeholders and gathers the score and mask expressions read."""
        names = set()
        for t in ([self.ir.score] if self.ir.score is not None else []) + list(self.ir.mask):
            for n in E.walk(t):
                if isinstance(n, E.Input) and n.name in PLACEHOLDERS and n.shape == ():
                    names.add(n.name)
        return names

    # ---- helpers (op, r32, r64, pred, wait, advance, ...: HopperKernel) -------------------
    def f32(self) -> str:
        return self.b.reg("f32")

    def load_dim(self, reg: str, d, pname: str) -> None:
        if isinstance(d, str):
            self.op(f"ld.param.u32 {reg}, [{pname}]")
        else:
            self.op(f"mov.u32 {reg}, {int(d)}")

    def tile_coords(self) -> None:
        """%head, %bb, %hk, %bhq, %bhk and (tile_range) %qt, %i0, %first, %end of the work
        tile: the CTA's (ctaid.x the query tile, y the head, z the batch entry) or, persistent,
        work tile %tile of the same order (query tile fastest, then head, then batch entry)."""
        qraw = self.r32()
        if self.s.persistent:
            r = self.r32()
            self.op(f"rem.u32 {qraw}, %tile, %ntq")
            self.op(f"div.u32 {r}, %tile, %ntq")
            self.op(f"rem.u32 %head, {r}, %Hq")
            self.op(f"div.u32 %bb, {r}, %Hq")
        else:
            self.op(f"mov.u32 {qraw}, %ctaid.x")
            self.op("mov.u32 %head, %ctaid.y")
            self.op("mov.u32 %bb, %ctaid.z")
        g = self.r32()
        self.op(f"div.u32 {g}, %Hq, %Hkv")
        self.op(f"div.u32 %hk, %head, {g}")
        self.op("mad.lo.u32 %bhq, %bb, %Hq, %head")  # q/o head row: b * Hq + h
        self.op("mad.lo.u32 %bhk, %bb, %Hkv, %hk")
        self.tile_range(qraw)

    def tile_range(self, qraw: str) -> None:
        """%qt (the query tile of launch-order index `qraw`), %i0, %first, %end (KV tiles
        [first, end)): the formulas of tiling.kv_tiles and tiling.query_tile_order."""
        ir, s = self.ir, self.s
        self.op(f"mov.u32 %qt, {qraw}")
        if ir.band_hi is not None:
            n = self.r32()
            self.op(f"add.u32 {n}, %S, {s.block_m - 1}")
            self.op(f"div.u32 {n}, {n}, {s.block_m}")
            self.op(f"sub.u32 {n}, {n}, 1")
            self.op(f"sub.u32 %qt, {n}, %qt")
        self.op(f"mul.lo.u32 %i0, %qt, {s.block_m}")
        self.op(f"add.u32 %nkv, %Skv, {s.block_n - 1}")
        self.op(f"div.u32 %nkv, %nkv, {s.block_n}")
        if ir.band_lo is None:
            self.op("mov.u32 %first, 0")
        else:
            t = self.r32()
            self.op(f"add.s32 {t}, %i0, {ir.band_lo}")
            self.op(f"max.s32 {t}, {t}, 0")
            self.op(f"div.u32 %first, {t}, {s.block_n}")
        if ir.band_hi is None:
            self.op("mov.u32 %end, %nkv")
        else:
            last = self.r32()
            self.op(f"add.s32 {last}, %i0, {s.block_m - 1 + ir.band_hi}")
            p = self.pred()
            self.op(f"setp.lt.s32 {p}, {last}, 0")
            self.op(f"div.s32 %end, {last}, {s.block_n}")
            self.op("add.s32 %end, %end, 1")
            self.op("min.s32 %end, %end, %nkv")
            self.op(f"@{p} mov.u32 %end, 0")
        if ir.band_lo is not None:
            t = self.r32()
            p = self.pred()
            self.op(f"add.s32 {t}, %i0, {ir.band_lo}")
            self.op(f"setp.ge.s32 {p}, {t}, %Skv")
            self.op(f"@{p} mov.u32 %end, %first")
        if ir.band_lo is not None and ir.band_hi is not None and ir.band_lo > ir.band_hi:
            self.op("mov.u32 %end, %first")  # an empty band: no key anywhere

    def id_scan(self, name: str, k: int) -> None:
        """Every thread: for a mask term x[i] == x[j], the [min, max] of x over this query
        tile's rows i < S (each warp reduces it on its own), then the first key and one past
        the last key in [first * block_n, min(end * block_n, Skv)) whose x lies within it
        (keys strided over the CTA's threads, four loads in flight a thread); lane 0 of each
        warp stores its (first, last + 1) at the K ring's base + 8 * (k * warps + warp).
        tiling.id_tiles is the same arithmetic."""
        ir, s, b = self.ir, self.s, self.b
        x = next(e for e in ir.extra if e.name == name)
        nthr, unroll = s.threads(), 4
        b.comment(f"the KV tiles that can hold a key with {name}[j] == {name}[i] of this tile")
        tx, lane, warp = self.r32(), self.r32(), self.r32()
        self.op(f"mov.u32 {tx}, %tid.x")
        self.op(f"and.b32 {lane}, {tx}, 31")
        self.op(f"shr.u32 {warp}, {tx}, 5")
        ptr = self._ptr(f"in_{name}")
        lo, hi = self.f32(), self.f32()
        self.op(f"mov.f32 {lo}, 0f7F800000")
        self.op(f"mov.f32 {hi}, 0fFF800000")
        anynan = None
        if self.id_pure:
            anynan = self.pred()
            self.op(f"setp.ne.u32 {anynan}, {tx}, {tx}")
        for r in range(s.block_m // 32):
            row, pr = self.r32(), self.pred()
            self.op(f"add.u32 {row}, %i0, {lane}")
            self.op(f"add.u32 {row}, {row}, {32 * r}")
            self.op(f"setp.lt.u32 {pr}, {row}, %S")
            idx = row
            if x.batched:
                idx = self.r32()
                self.op(f"mad.lo.u32 {idx}, %bb, %S, {row}")
            v = self._load_extra(x, ptr, idx, pr)
            vl, vh = self.f32(), self.f32()
            self.op(f"selp.f32 {vl}, {v}, 0f7F800000, {pr}")
            self.op(f"selp.f32 {vh}, {v}, 0fFF800000, {pr}")
            self.op(f"min.f32 {lo}, {lo}, {vl}")  # a NaN id gives way to the other operand
            self.op(f"max.f32 {hi}, {hi}, {vh}")
            if anynan is not None:
                pn = self.pred()
                self.op(f"setp.nan.f32 {pn}, {v}, {v}")
                self.op(f"and.pred {pn}, {pn}, {pr}")
                self.op(f"or.pred {anynan}, {anynan}, {pn}")
        for off in (16, 8, 4, 2, 1):
            t = self.f32()
            self.op(f"shfl.sync.bfly.b32 {t}, {lo}, {off}, 31, -1")
            self.op(f"min.f32 {lo}, {lo}, {t}")
            t = self.f32()
            self.op(f"shfl.sync.bfly.b32 {t}, {hi}, {off}, 31, -1")
            self.op(f"max.f32 {hi}, {hi}, {t}")
        js, je, j, jmin, jend = (self.r32() for _ in range(5))
        self.op(f"mul.lo.u32 {js}, %first, {s.block_n}")
        self.op(f"mul.lo.u32 {je}, %end, {s.block_n}")
        self.op(f"min.u32 {je}, {je}, %Skv")
        self.op(f"add.u32 {j}, {js}, {tx}")
        self.op(f"mov.u32 {jmin}, -1")
        self.op(f"mov.u32 {jend}, 0")
        if self.id_pure:
            # the keys whose id is not the tile's (lo; NaN too): pa = 1 + the last below i0,
            # pb = the first at or above it (tiling.id_pure_tiles)
            pa, pb = self.r32(), self.r32()
            self.op(f"mov.u32 {pa}, 0")
            self.op(f"mov.u32 {pb}, -1")
        lab, done = b.new_label("idscan"), b.new_label("idscand")
        b.label(lab)
        pl = self.pred()
        self.op(f"setp.ge.u32 {pl}, {j}, {je}")
        self.op(f"@{pl} bra {done}")
        loads = []
        for u in range(unroll):
            ju, pu = self.r32(), self.pred()
            self.op(f"add.u32 {ju}, {j}, {u * nthr}")
            self.op(f"setp.lt.u32 {pu}, {ju}, {je}")
            idx = ju
            if x.batched:
                idx = self.r32()
                self.op(f"mad.lo.u32 {idx}, %bb, %Skv, {ju}")
            loads.append((ju, pu, self._load_extra(x, ptr, idx, pu)))
        for ju, pu, v in loads:
            hit, nxt = self.pred(), self.r32()
            self.op(f"setp.ge.and.f32 {hit}, {v}, {lo}, {pu}")
            self.op(f"setp.le.and.f32 {hit}, {v}, {hi}, {hit}")
            self.op(f"add.u32 {nxt}, {ju}, 1")
            self.op(f"@{hit} min.u32 {jmin}, {jmin}, {ju}")
            self.op(f"@{hit} max.u32 {jend}, {jend}, {nxt}")
            if self.id_pure:
                mis, mb, ma = self.pred(), self.pred(), self.pred()
                self.op(f"setp.neu.and.f32 {mis}, {v}, {lo}, {pu}")
                self.op(f"setp.lt.and.u32 {mb}, {ju}, %i0, {mis}")
                self.op(f"setp.ge.and.u32 {ma}, {ju}, %i0, {mis}")
                self.op(f"@{mb} max.u32 {pa}, {pa}, {nxt}")
                self.op(f"@{ma} min.u32 {pb}, {pb}, {ju}")
        self.op(f"add.u32 {j}, {j}, {unroll * nthr}")
        self.op(f"bra {lab}")
        b.label(done)
        self.op(f"redux.sync.min.u32 {jmin}, {jmin}, -1")
        self.op(f"redux.sync.max.u32 {jend}, {jend}, -1")
        addr, p0 = self.r32(), self.pred()
        self.op(f"mad.lo.u32 {addr}, {warp}, 8, %kb")
        self.op(f"add.u32 {addr}, {addr}, {8 * k * (nthr // 32)}")
        self.op(f"setp.eq.u32 {p0}, {lane}, 0")
        self.op(f"@{p0} st.shared.v2.u32 [{addr}], {{{jmin}, {jend}}}")
        if self.id_pure:
            self.op(f"redux.sync.max.u32 {pa}, {pa}, -1")
            self.op(f"redux.sync.min.u32 {pb}, {pb}, -1")
            # one id over the tile's rows (min == max, none NaN), else no tile is pure
            self.op(f"vote.sync.any.pred {anynan}, {anynan}, -1")
            one = self.pred()
            self.op(f"setp.eq.f32 {one}, {lo}, {hi}")
            self.op(f"@{anynan} mov.u32 {pb}, 0")
            self.op(f"@!{one} mov.u32 {pb}, 0")
            a2 = self.r32()
            n_ids = len(ir.id_matches)
            self.op(f"add.u32 {a2}, {addr}, {8 * n_ids * (nthr // 32)}")
            self.op(f"@{p0} st.shared.v2.u32 [{a2}], {{{pa}, {pb}}}")

    def id_narrow(self, k: int) -> None:
        """Every thread, after the barrier: the warps' (first key, last key + 1) of id_scan
        number k combined, and [%first, %end) narrowed to their tiles (no key: end = first)."""
        s = self.s
        jmin, jend = self.r32(), self.r32()
        self.op(f"mov.u32 {jmin}, -1")
        self.op(f"mov.u32 {jend}, 0")
        for w in range(s.threads() // 32):
            a, c = self.r32(), self.r32()
            self.op(f"ld.shared.v2.u32 {{{a}, {c}}}, [%kb+{8 * (k * (s.threads() // 32) + w)}]")
            self.op(f"min.u32 {jmin}, {jmin}, {a}")
            self.op(f"max.u32 {jend}, {jend}, {c}")
        found, nf, ne = self.pred(), self.r32(), self.r32()
        self.op(f"setp.ne.u32 {found}, {jend}, 0")
        self.op(f"div.u32 {nf}, {jmin}, {s.block_n}")
        self.op(f"max.u32 {nf}, {nf}, %first")
        self.op(f"sub.u32 {ne}, {jend}, 1")
        self.op(f"div.u32 {ne}, {ne}, {s.block_n}")
        self.op(f"add.u32 {ne}, {ne}, 1")
        self.op(f"min.u32 {ne}, {ne}, %end")
        self.op(f"@{found} mov.u32 %first, {nf}")
        self.op(f"@{found} mov.u32 %end, {ne}")
        self.op(f"@!{found} mov.u32 %end, %first")
        if self.id_pure:
            # the pure tiles [ceil(pa / bn), floor(pb / bn)), intersected over the id matches
            warps, base = s.threads() // 32, len(self.ir.id_matches) + k
            pa, pb = self.r32(), self.r32()
            self.op(f"mov.u32 {pa}, 0")
            self.op(f"mov.u32 {pb}, -1")
            for w in range(warps):
                a, c = self.r32(), self.r32()
                self.op(f"ld.shared.v2.u32 {{{a}, {c}}}, [%kb+{8 * (base * warps + w)}]")
                self.op(f"max.u32 {pa}, {pa}, {a}")
                self.op(f"min.u32 {pb}, {pb}, {c}")
            self.op(f"add.u32 {pa}, {pa}, {s.block_n - 1}")
            self.op(f"div.u32 {pa}, {pa}, {s.block_n}")
            self.op(f"div.u32 {pb}, {pb}, {s.block_n}")
            if k == 0:
                self.op(f"mov.u32 %tpa, {pa}")
                self.op(f"mov.u32 %tpb, {pb}")
            else:
                self.op(f"max.u32 %tpa, %tpa, {pa}")
                self.op(f"min.u32 %tpb, %tpb, {pb}")
            if k == len(self.ir.id_matches) - 1:
                # kept in shared memory (the slot after the barriers), not in two registers
                # live through the loop: thread 0 stores it, the barrier after id_narrow
                # publishes it, the loop reads it once a tile
                p0 = self.pred()
                self.op(f"setp.eq.u32 {p0}, %tx, 0")
                self.op(f"@{p0} st.shared.v2.u32 [{self.pure_slot()}], {{%tpa, %tpb}}")

    # ---- the kernel ----------------------------------------------------------------------
    def render(self) -> Emitted:
        ir, s, b = self.ir, self.s, self.b
        params: list[KernelParam] = []
        plist: list[str] = []
        bh_q = f"{_dim(ir.b)} * {_dim(ir.hq)}"
        bh_kv = f"{_dim(ir.b)} * {_dim(ir.hkv)}"
        maps = (
            ("q_map", ir.q, s.block_m, (str(self.d), _dim(ir.s), bh_q)),
            ("k_map", ir.k, s.block_n, (str(self.d), _dim(ir.skv), bh_kv)),
            ("v_map", ir.v, s.block_n, (str(self.d), _dim(ir.skv), bh_kv)),
        )
        for pname, tensor, rows, dims in maps:
            params.append(
                KernelParam(
                    "tmap", "b8x128", tensor, 0.0, box=(64, rows, 1), dims=dims, swizzle=128
                )
            )
            plist.append(f".param .align 64 .b8 {pname}[128]")
        params.append(KernelParam("tensor", "u64", ir.out))
        plist.append(".param .u64 out_o")
        if ir.lse:
            params.append(KernelParam("tensor", "u64", ir.lse))
            plist.append(".param .u64 out_lse")
        for x in ir.extra:
            params.append(KernelParam("tensor", "u64", x.name))
            plist.append(f".param .u64 in_{x.name}")
        for key in ("s", "skv", "hq", "hkv") + (("b",) if s.persistent else ()):
            d = getattr(ir, key)
            if isinstance(d, str):
                params.append(KernelParam("dim", "u32", d))
                plist.append(f".param .u32 dim_{key}")

        b.comment("dims, this CTA's tile, the shared-memory layout")
        self.load_dim("%S", ir.s, "dim_s")
        self.load_dim("%Skv", ir.skv, "dim_skv")
        self.load_dim("%Hq", ir.hq, "dim_hq")
        self.load_dim("%Hkv", ir.hkv, "dim_hkv")
        if s.persistent:
            self.load_dim("%B", ir.b, "dim_b")
            self.op(f"add.u32 %ntq, %S, {s.block_m - 1}")
            self.op(f"div.u32 %ntq, %ntq, {s.block_m}")
            self.op("mul.lo.u32 %ntiles, %ntq, %Hq")
            self.op("mul.lo.u32 %ntiles, %ntiles, %B")
        else:
            self.tile_coords()
        self.op("mov.u32 %tx, %tid.x")
        self.op("shr.u32 %wg, %tx, 7")
        self.smem_base()
        self.op(f"add.u32 %kb, %base, {self.q_bytes}")
        self.op(f"add.u32 %vb, %kb, {s.stages * self.kv_bytes}")
        self.op(f"add.u32 %qfull, %vb, {s.stages * self.kv_bytes}")
        self.op("add.u32 %full, %qfull, 8")
        self.op(f"add.u32 %fullv, %full, {8 * s.stages}")
        self.op(f"add.u32 %empty, %fullv, {8 * s.stages}")
        self.op(f"add.u32 %emptyv, %empty, {8 * s.stages}")
        self.op(f"add.u32 %qempty, %emptyv, {8 * s.stages}")
        self.op("mov.u32 %stage, 0")
        self.op("mov.u32 %phase, 0")
        for k, name in enumerate(ir.id_matches):
            self.id_scan(name, k)

        b.comment("thread 0 initialises the barriers")
        inits = [("%qfull", 1)] + ([("%qempty", 4 * s.consumers)] if s.persistent else [])
        for i in range(s.stages):
            inits += [(f"%full+{8 * i}", 1), (f"%fullv+{8 * i}", 1)]
            inits += [(f"%empty+{8 * i}", 4 * s.consumers), (f"%emptyv+{8 * i}", 4 * s.consumers)]
        self.init_barriers(inits)
        self.op("bar.sync 0")
        if ir.id_matches:
            for k in range(len(ir.id_matches)):
                self.id_narrow(k)
            # the scratch is the K ring's first bytes: the TMA may overwrite it only after every
            # thread has read it (and the async proxy sees these generic accesses first)
            self.op("fence.proxy.async.shared::cta")
            self.op("bar.sync 0")

        lab_cons, lab_exit = b.new_label("consumer"), b.new_label("exit")
        pw = self.pred()
        self.op(f"setp.ne.u32 {pw}, %wg, 0")
        self.op(f"@{pw} bra {lab_cons}")
        self.producer(lab_exit, [m[0] for m in maps])
        b.label(lab_cons)
        self.consumer()
        b.label(lab_exit)
        self.op("ret")

        decls = b.declarations()
        decls.append(f"    .reg .f32 %sa<{self.n_s}>;")
        decls.append(f"    .reg .f32 %oa<{self.n_o}>;")
        decls.append(f"    .reg .b32 %pp<{self.n_p}>;")
        decls.append("    .reg .f32 %m<2>, %l<2>, %al<2>;")
        if s.overlap:
            decls.append("    .reg .b32 %poff, %pphase;")
            decls.append("    .reg .b64 %pdv;")
        if self.id_pure:
            decls.append("    .reg .b32 %tpa, %tpb;")
        if s.pingpong:
            decls.append("    .reg .b32 %bmine, %bother;")
            decls.append("    .reg .pred %pcons0;")
        named = (
            "S Skv Hq Hkv head bb hk bhq bhk qt i0 nkv first end tx wg base kb vb qfull full "
            "fullv empty emptyv qempty stage phase t j0 B ntq ntiles tile qit"
        ).split()
        decls.append("    .reg .b32 " + ", ".join(f"%{x}" for x in named) + ";")
        # at launch every thread may hold this many; setmaxnreg then moves registers from the
        # producer to the consumers (never below the launch count: .inc only grows)
        maxnreg = entry_regs(s)
        head = [
            *ptx_head(
                self.entry,
                f"{s.label()} (generated by factory.families.attention.emit)",
                plist,
                maxnreg,
                s.threads(),
            ),
            "{",
        ]
        ptx = "\n".join(head + decls + [""] + b.lines + ["}", ""])
        return Emitted(ptx=ptx, entry=self.entry, params=tuple(params), launch=launch_for(ir, s))

    # ---- producer ------------------------------------------------------------------------
    def producer(self, lab_exit: str, maps: list[str]) -> None:
        s, b = self.s, self.b
        b.comment("producer warpgroup: one thread loads Q once, then K and V into the ring")
        self.op(f"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS}")
        p = self.pred()
        self.op(f"setp.ne.u32 {p}, %tx, 0")
        self.op(f"@{p} bra {lab_exit}")
        gm = self.prefetch_maps(maps)
        cp = TMA_LOAD.format(3)
        lab_tile, lab_done = b.new_label("ptile"), b.new_label("ptiled")
        if s.persistent:
            self.op("mov.u32 %tile, %ctaid.x")
            self.op("mov.u32 %qit, 0")
            b.label(lab_tile)
            pt = self.pred()
            self.op(f"setp.ge.u32 {pt}, %tile, %ntiles")
            self.op(f"@{pt} bra {lab_done}")
            self.tile_coords()
            qpar = self.r32()
            self.op(f"xor.b32 {qpar}, %qit, 1")
            self.wait("%qempty", qpar)  # the consumers are done with the last tile's Q
        self.op(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%qfull], {self.q_bytes}")
        for c in range(self.chunks):
            dst = self.r32()
            self.op(f"add.u32 {dst}, %base, {c * s.block_m * 128}")
            self.op(f"{cp} [{dst}], [{gm['q_map']}, {{{64 * c}, %i0, %bhq}}], [%qfull]")
        lab_k, lab_kdone = b.new_label("pk"), b.new_label("pkd")
        self.op("mov.u32 %t, %first")
        b.label(lab_k)
        pk = self.pred()
        self.op(f"setp.ge.s32 {pk}, %t, %end")
        self.op(f"@{pk} bra {lab_kdone}")
        # K and V of a slot have their own full and empty barriers: the consumers free K once
        # S = Q K^T is done and V after P V, so the next K may land while V is still read
        row, par, off = self.r32(), self.r32(), self.r32()
        self.op(f"mul.lo.u32 {row}, %t, {s.block_n}")
        self.op(f"xor.b32 {par}, %phase, 1")
        self.op(f"shl.b32 {off}, %stage, 3")
        for which, base, fbar, ebar in (
            ("k", "%kb", "%full", "%empty"),
            ("v", "%vb", "%fullv", "%emptyv"),
        ):
            full, empty, dst = self.r32(), self.r32(), self.r32()
            self.op(f"add.u32 {full}, {fbar}, {off}")
            self.op(f"add.u32 {empty}, {ebar}, {off}")
            self.wait(empty, par)  # a fresh barrier's "previous phase" counts as complete
            self.op(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [{full}], {self.kv_bytes}")
            self.op(f"mad.lo.u32 {dst}, %stage, {self.kv_bytes}, {base}")
            for c in range(self.chunks):
                cd = self.r32()
                self.op(f"add.u32 {cd}, {dst}, {c * s.block_n * 128}")
                tmap = gm[f"{which}_map"]
                self.op(f"{cp} [{cd}], [{tmap}, {{{64 * c}, {row}, %bhk}}], [{full}]")
        self.advance()
        self.op("add.u32 %t, %t, 1")
        self.op(f"bra {lab_k}")
        b.label(lab_kdone)
        if s.persistent:
            self.op("xor.b32 %qit, %qit, 1")
            step = self.r32()
            self.op(f"mov.u32 {step}, %nctaid.x")
            self.op(f"add.u32 %tile, %tile, {step}")
            self.op(f"bra {lab_tile}")
            b.label(lab_done)
        self.op(f"bra {lab_exit}")

    # ---- consumers -----------------------------------------------------------------------
    def consumer(self) -> None:
        ir, s, b = self.ir, self.s, self.b
        b.comment("consumer warpgroups: 64 query rows each")
        if s.consumer_regs() > entry_regs(s):  # one consumer launches with its full count
            self.op(f"setmaxnreg.inc.sync.aligned.u32 {s.consumer_regs()}")
        cons, warp, lane, plane0 = self.consumer_lanes()
        self.p_true, self.p_false = self.pred(), self.pred()
        self.op(f"setp.eq.u32 {self.p_true}, %tx, %tx")
        self.op(f"setp.ne.u32 {self.p_false}, %tx, %tx")
        # this thread's first row within the tile (and that + 8); columns 8jj + colb (+1)
        rowt, colb = self.r32(), self.r32()
        self.op(f"shr.u32 {rowt}, {lane}, 2")
        self.op(f"mad.lo.u32 {rowt}, {warp}, 16, {rowt}")
        self.op(f"mad.lo.u32 {rowt}, {cons}, 64, {rowt}")
        self.op(f"and.b32 {colb}, {lane}, 3")
        self.op(f"shl.b32 {colb}, {colb}, 1")
        # descriptors: Q rows of this consumer, K and V of stage 0
        qa, ka, va = self.r32(), self.r32(), self.r32()
        self.op(f"mad.lo.u32 {qa}, {cons}, {64 * 128}, %base")
        self.op(f"shr.u32 {qa}, {qa}, 4")
        self.op(f"shr.u32 {ka}, %kb, 4")
        self.op(f"shr.u32 {va}, %vb, 4")
        dq, dk0, dv0 = self.desc(qa), self.desc(ka), self.desc(va, v_desc_const(s.block_n))
        self.dq, self.dk0, self.dv0, self.plane0 = dq, dk0, dv0, plane0
        if s.pingpong:
            b.comment("ping-pong: named barrier 1 + c is consumer c's turn; consumer 1 gives")
            b.comment("consumer 0 the first turn (once: the turns run on across tiles)")
            self.op(f"add.u32 %bmine, {cons}, 1")
            self.op(f"sub.u32 %bother, 2, {cons}")
            self.op(f"setp.eq.u32 %pcons0, {cons}, 0")
            self.op("@!%pcons0 bar.arrive 1, 256")
        lab_tile, lab_done = b.new_label("ctile"), b.new_label("ctiled")
        if s.persistent:
            self.op("mov.u32 %tile, %ctaid.x")
            self.op("mov.u32 %qit, 0")
            b.label(lab_tile)
            pt = self.pred()
            self.op(f"setp.ge.u32 {pt}, %tile, %ntiles")
            self.op(f"@{pt} bra {lab_done}")
            self.tile_coords()
        row0, row1 = self.r32(), self.r32()
        self.op(f"add.u32 {row0}, {rowt}, %i0")
        self.op(f"add.u32 {row1}, {row0}, 8")
        rows = (row0, row1)

        # per-head and per-row values the score and mask read
        self.row_vals: list[dict] = [{}, {}]
        self.col_inputs = []
        fi = {r: self.f32() for r in ("i0", "i1")}
        if "i" in self.reads:
            self.op(f"cvt.rn.f32.u32 {fi['i0']}, {row0}")
            self.op(f"cvt.rn.f32.u32 {fi['i1']}, {row1}")
        fh = self.f32()
        if "h" in self.reads:
            self.op(f"cvt.rn.f32.u32 {fh}, %head")
        self.fi, self.fh = fi, fh
        for x in ir.extra:
            ptr = self._ptr(f"in_{x.name}")
            for node in self._gather_nodes(x):
                where = node.idx.name
                if where == "h":
                    idx = self.r32()
                    self.op(f"mov.u32 {idx}, {'%bhq' if x.batched else '%head'}")
                    v = self._load_extra(x, ptr, idx, None)
                    for h2 in range(2):
                        self.row_vals[h2][node] = v
                elif where == "i":
                    for h2, r in enumerate(rows):
                        idx = self.r32()
                        if x.batched:
                            self.op(f"mad.lo.u32 {idx}, %bb, %S, {r}")
                        else:
                            self.op(f"mov.u32 {idx}, {r}")
                        pr = self.pred()
                        self.op(f"setp.lt.u32 {pr}, {r}, %S")
                        self.row_vals[h2][node] = self._load_extra(x, ptr, idx, pr)
                else:
                    self.col_inputs.append((x, ptr, node))

        self.op("mov.f32 %m0, 0fFF800000")
        self.op("mov.f32 %m1, 0fFF800000")
        self.op("mov.f32 %l0, 0f00000000")
        self.op("mov.f32 %l1, 0f00000000")
        for i in range(self.n_o):
            self.op(f"mov.f32 %oa{i}, 0f00000000")
        self.wait("%qfull", "%qit" if s.persistent else "0")
        if s.overlap:
            self.overlapped_loop(rows, colb)
        else:
            self.simple_loop(rows, colb)
        if s.persistent:
            # every S of this tile is done: the producer may load the next tile's Q while
            # this one's output is stored
            self.op(f"@{plane0} mbarrier.arrive.shared::cta.b64 _, [%qempty]")
        self.epilogue(rows, colb, lane)
        if s.persistent:
            self.op("xor.b32 %qit, %qit, 1")
            step = self.r32()
            self.op(f"mov.u32 {step}, %nctaid.x")
            self.op(f"add.u32 %tile, %tile, {step}")
            self.op(f"bra {lab_tile}")
            b.label(lab_done)
        if s.pingpong:
            # consumer 0 takes back the turn consumer 1 passed last (or gave first), so every
            # arrival on a named barrier meets its wait before the CTA ends
            self.op("@%pcons0 bar.sync 1, 256")

    # ---- the main loop ---------------------------------------------------------------------
    def stage_descs(self) -> tuple[str, str, str]:
        """(byte offset of this stage's barriers, K descriptor, V descriptor) of %stage."""
        off = self.r32()
        self.op(f"shl.b32 {off}, %stage, 3")
        stage_off = self.r32()
        self.op(f"mul.lo.u32 {stage_off}, %stage, {self.kv_bytes >> 4}")
        so64 = self.r64()
        self.op(f"cvt.u64.u32 {so64}, {stage_off}")
        dk, dv = self.r64(), self.r64()
        self.op(f"add.u64 {dk}, {self.dk0}, {so64}")
        self.op(f"add.u64 {dv}, {self.dv0}, {so64}")
        return off, dk, dv

    def wait_full(self, off: str, which: str = "k", parity: str = "%phase") -> None:
        """Wait until K (`which` "k") or V ("v") of the ring slot at barrier offset `off` has
        landed (the slot's phase `parity`)."""
        full = self.r32()
        self.op(f"add.u32 {full}, {'%full' if which == 'k' else '%fullv'}, {off}")
        self.wait(full, parity)

    def release(self, off: str, which: str = "k") -> None:
        """Lane 0 of each consumer warp frees K or V of the ring slot at barrier offset `off`
        (K as soon as S = Q K^T is done, V after P V)."""
        eaddr = self.r32()
        self.op(f"add.u32 {eaddr}, {'%empty' if which == 'k' else '%emptyv'}, {off}")
        self.op(f"@{self.plane0} mbarrier.arrive.shared::cta.b64 _, [{eaddr}]")

    def issue_s(self, dk: str) -> None:
        """S = Q K^T into %sa (committed, not waited)."""
        s = self.s
        self.b.comment("S = Q K^T")
        self.op("wgmma.fence.sync.aligned")
        first = True
        sregs = ", ".join(f"%sa{i}" for i in range(self.n_s))
        for c in range(self.chunks):
            for kk in range(4):
                da, db = self.r64(), self.r64()
                self.op(f"add.u64 {da}, {self.dq}, {(c * s.block_m * 128 + kk * 32) >> 4}")
                self.op(f"add.u64 {db}, {dk}, {(c * s.block_n * 128 + kk * 32) >> 4}")
                scale = self.p_false if first else self.p_true
                first = False
                self.op(
                    f"wgmma.mma_async.sync.aligned.m64n{s.block_n}k16.f32.{self.t}.{self.t} "
                    f"{{{sregs}}}, {da}, {db}, {scale}, 1, 1, 0, 0"
                )
        self.op("wgmma.commit_group.sync.aligned")

    def issue_pv(self, dv: str) -> None:
        """O += P V from %pp (committed, not waited)."""
        s = self.s
        self.b.comment("O += P V")
        self.op("wgmma.fence.sync.aligned")
        pv_n = 64 if s.pv_split else self.d
        for kk in range(s.block_n // 16):
            a = ", ".join(f"%pp{2 * (2 * kk) + h}" for h in range(2))
            a += ", " + ", ".join(f"%pp{2 * (2 * kk + 1) + h}" for h in range(2))
            for nc in range(self.d // pv_n):
                dvb = self.r64()
                self.op(f"add.u64 {dvb}, {dv}, {(kk * 16 * 128 + nc * s.block_n * 128) >> 4}")
                oregs = ", ".join(f"%oa{nc * pv_n // 2 + i}" for i in range(pv_n // 2))
                self.op(
                    f"wgmma.mma_async.sync.aligned.m64n{pv_n}k16.f32.{self.t}.{self.t} "
                    f"{{{oregs}}}, {{{a}}}, {dvb}, {self.p_true}, 1, 1, 1"
                )
        self.op("wgmma.commit_group.sync.aligned")

    def softmax_tile(self, rows, colb: str, defer: bool) -> None:
        """The score, masks and online softmax of tile %t (masked or not, as the tile needs),
        P into %pp (with `defer` the probabilities stay in %sa for pack_p, and the O rescale
        is left to rescale_o)."""
        b = self.b
        self.op(f"mul.lo.u32 %j0, %t, {self.s.block_n}")
        bound = self.fast_tanh_bound()
        lab_fast, lab_end = b.new_label("ftanh"), b.new_label("ftanhd")
        if bound is not None:
            # a warp whose S values all keep every tanh argument within +-TANH_FAST_T takes
            # the polynomial tanh (its branch is uniform: the warp votes)
            m = self.f32()
            self.op(f"mov.f32 {m}, 0f00000000")
            for i in range(self.n_s):
                self.op(f"max.xorsign.abs.f32 {m}, {m}, %sa{i}")
            self.op(f"abs.f32 {m}, {m}")
            pf, pa = self.pred(), self.pred()
            self.op(f"setp.lt.f32 {pf}, {m}, {f32_literal(bound)}")
            self.op(f"vote.sync.all.pred {pa}, {pf}, -1")
            self.op(f"@{pa} bra {lab_fast}")
        for fast in (False, True) if bound is not None else (False,):
            if fast:
                self.op(f"bra {lab_end}")
                b.label(lab_fast)
            lab_masked, lab_join = b.new_label("masked"), b.new_label("join")
            if not self.masked_always:
                wb = self.warp_rows() if self.flag_rows() == WARP_ROWS else "%i0"
                pfull = self.tile_full_pred(wb)
                if self.id_pure:  # every key of the tile has the query tile's one id
                    ta, tb = self.r32(), self.r32()
                    self.op(f"ld.shared.v2.u32 {{{ta}, {tb}}}, [{self.pure_slot()}]")
                    self.op(f"setp.ge.and.u32 {pfull}, %t, {ta}, {pfull}")
                    self.op(f"setp.lt.and.u32 {pfull}, %t, {tb}, {pfull}")
                self.op(f"@!{pfull} bra {lab_masked}")
                sides = []
                for side in self.alibi_sides():
                    lab_side, ps = b.new_label("alibi"), self.pred()
                    if side > 0:  # j0 + bn - 1 <= wb: every key at or before the warp's rows
                        u = self.r32()
                        self.op(f"add.u32 {u}, %j0, {self.s.block_n - 1}")
                        self.op(f"setp.le.u32 {ps}, {u}, {wb}")
                    else:  # j0 >= wb + 15: every key at or after the warp's rows
                        u = self.r32()
                        self.op(f"add.u32 {u}, {wb}, {self.flag_rows() - 1}")
                        self.op(f"setp.ge.u32 {ps}, %j0, {u}")
                    self.op(f"@{ps} bra {lab_side}")
                    sides.append((side, lab_side))
                self.softmax(rows, colb, masked=False, defer=defer, fast_tanh=fast)
                self.op(f"bra {lab_join}")
                for side, lab_side in sides:
                    b.label(lab_side)
                    self.softmax(rows, colb, masked=False, defer=defer, side=side)
                    self.op(f"bra {lab_join}")
            b.label(lab_masked)
            self.softmax(rows, colb, masked=True, defer=defer, fast_tanh=fast)
            b.label(lab_join)
        if bound is not None:
            b.label(lab_end)

    def alibi_sides(self) -> list[int]:
        """The one-sided ALiBi paths an unmasked tile can take under the band: 1 (keys before
        the rows) unless the band's lower edge forbids a full tile there, -1 likewise (a causal
        band has no full tile after the diagonal)."""
        if self.alibi is None:
            return []
        ir, reach = self.ir, self.flag_rows() + self.s.block_n - 2
        out = []
        if ir.band_lo is None or ir.band_lo <= -reach:
            out.append(1)
        if ir.band_hi is None or ir.band_hi >= reach:
            out.append(-1)
        return out

    def fast_tanh_bound(self) -> float | None:
        """With `poly_tanh`, the bound on |S| (the raw products) under which every tanh of the
        score expression has its argument within +-TANH_FAST_T: each argument must be k * s;
        None otherwise (no tanh, one of another argument, or no poly_tanh). The polynomial
        keeps more values live than ex2 + rcp: under nvJitLink's 168 registers the overlapped
        128 x 128 tiles spill with it, so it is a schedule choice, off in the search's space."""
        ir = self.ir
        if ir.score is None or not self.s.poly_tanh:
            return None
        tanhs = [n for n in E.walk(ir.score) if isinstance(n, E.Unary) and n.op == "tanh"]
        ks = [linear_in_s(n.x) for n in tanhs]
        if not ks or any(k is None or k == 0 for k in ks):
            return None
        return TANH_FAST_T / (max(abs(k) for k in ks) * ir.scale)

    def rescale_o(self) -> None:
        for h in range(2):
            for jd in range(self.d // 8):
                for e in range(2):
                    r = f"%oa{4 * jd + 2 * h + e}"
                    self.op(f"mul.f32 {r}, {r}, %al{h}")

    def simple_loop(self, rows, colb: str) -> None:
        """Per KV tile: wait for K, S, free K, softmax, wait for V, P V, free V; nothing
        overlapped within the warpgroup (the ring still loads ahead)."""
        b = self.b
        lab_k, lab_kdone = b.new_label("ck"), b.new_label("ckd")
        self.op("mov.u32 %t, %first")
        b.label(lab_k)
        pk = self.pred()
        self.op(f"setp.ge.s32 {pk}, %t, %end")
        self.op(f"@{pk} bra {lab_kdone}")
        off, dk, dv = self.stage_descs()
        self.wait_full(off)
        self.issue_s(dk)
        self.op("wgmma.wait_group.sync.aligned 0")
        self.release(off, "k")
        self.softmax_tile(rows, colb, defer=False)
        self.wait_full(off, "v")
        self.issue_pv(dv)
        self.op("wgmma.wait_group.sync.aligned 0")
        self.release(off, "v")
        self.advance()
        self.op("add.u32 %t, %t, 1")
        self.op(f"bra {lab_k}")
        b.label(lab_kdone)

    def turn_wait(self) -> None:
        """Ping-pong: wait for this warpgroup's turn to issue wgmmas (named barrier 1 + cons
        completes when the other consumer warpgroup has passed the turn)."""
        if self.s.pingpong:
            self.op("bar.sync %bmine, 256")

    def turn_pass(self) -> None:
        """Ping-pong: this warpgroup's wgmmas are issued; the other one's turn."""
        if self.s.pingpong:
            self.op("bar.arrive %bother, 256")

    def pack_p(self) -> None:
        """P = the probabilities left in %sa by a deferred softmax, packed to 16-bit pairs."""
        cvt = CVT_PAIR[self.ir.dtype]
        for h in range(2):
            for jj in range(self.s.block_n // 8):
                lo, hi = f"%sa{4 * jj + 2 * h}", f"%sa{4 * jj + 2 * h + 1}"
                self.op(f"cvt.rn.{cvt}.f32 %pp{2 * jj + h}, {hi}, {lo}")

    def overlapped_loop(self, rows, colb: str) -> None:
        """S of tile t issued, then P V of tile t - 1 issued behind it; the softmax of tile t
        runs while that P V is on the tensor cores. The probabilities of tile t stay in %sa
        (fp32; P V of t - 1 still reads %pp); once that P V is done O is rescaled and they are
        packed into %pp. With `pingpong` each group of issues waits for this warpgroup's
        turn and passes it on (both warpgroups issue the same number of groups; consumer 1
        gives the first turn to consumer 0, which takes the last one back after its loop)."""
        b = self.b
        lab_k, lab_kdone, lab_none = b.new_label("ok"), b.new_label("okd"), b.new_label("onone")
        pk = self.pred()
        self.op(f"setp.ge.s32 {pk}, %first, %end")
        self.op(f"@{pk} bra {lab_none}")
        b.comment("first tile: S, softmax (no P V yet)")
        self.op("mov.u32 %t, %first")
        off, dk, dv = self.stage_descs()
        self.wait_full(off)
        self.turn_wait()
        self.issue_s(dk)
        self.turn_pass()
        self.op("wgmma.wait_group.sync.aligned 0")
        self.release(off, "k")
        self.softmax_tile(rows, colb, defer=False)
        self.op(f"mov.u32 %poff, {off}")
        self.op("mov.u32 %pphase, %phase")
        self.op(f"mov.u64 %pdv, {dv}")
        self.advance()
        self.op("add.u32 %t, %t, 1")
        b.label(lab_k)
        pk2 = self.pred()
        self.op(f"setp.ge.s32 {pk2}, %t, %end")
        self.op(f"@{pk2} bra {lab_kdone}")
        off, dk, dv = self.stage_descs()
        self.wait_full(off)
        self.wait_full("%poff", "v", "%pphase")
        self.turn_wait()
        self.issue_s(dk)
        self.issue_pv("%pdv")
        self.turn_pass()
        self.op("wgmma.wait_group.sync.aligned 1")  # S of tile t is done; P V may run on
        self.release(off, "k")
        self.softmax_tile(rows, colb, defer=True)
        self.op("wgmma.wait_group.sync.aligned 0")
        self.release("%poff", "v")
        self.rescale_o()
        self.pack_p()
        self.op(f"mov.u32 %poff, {off}")
        self.op("mov.u32 %pphase, %phase")
        self.op(f"mov.u64 %pdv, {dv}")
        self.advance()
        self.op("add.u32 %t, %t, 1")
        self.op(f"bra {lab_k}")
        b.label(lab_kdone)
        b.comment("the last tile's P V")
        self.wait_full("%poff", "v", "%pphase")
        self.turn_wait()
        self.issue_pv("%pdv")
        self.turn_pass()
        self.op("wgmma.wait_group.sync.aligned 0")
        self.release("%poff", "v")
        b.label(lab_none)

    def pure_slot(self) -> str:
        """The shared-memory slot after the barriers (%qempty + 8), addressed from %full."""
        return f"%full+{32 * self.s.stages + 8}"

    def warp_rows(self) -> str:
        """The first of this warp's WARP_ROWS rows: i0 + 16 * (the warp's index among the
        consumer warps), from %tid.x (no register kept live for it)."""
        wb, t = self.r32(), self.r32()
        self.op(f"mov.u32 {t}, %tid.x")
        self.op(f"sub.u32 {t}, {t}, 128")
        self.op(f"shr.u32 {t}, {t}, 1")
        self.op(f"and.b32 {t}, {t}, {-WARP_ROWS}")
        self.op(f"add.u32 {wb}, %i0, {t}")
        return wb

    def flag_rows(self) -> int:
        """Rows one band flag covers (tiling.flag_rows): a warp's WARP_ROWS (64-key tiles
        under 128-row ones), else the whole tile's block_m."""
        return flag_rows(self.ir, self.s.block_m, self.s.block_n)

    def tile_full_pred(self, wb: str) -> str:
        """Whether tile %t needs no band mask for the rows [wb, wb + flag_rows()) (this warp's,
        or the tile's): tiling.tile_is_full on them (warp-uniform: the softmax's branch
        diverges only between warps)."""
        ir, s = self.ir, self.s
        p = self.pred()
        end = self.r32()
        self.op(f"add.u32 {end}, %j0, {s.block_n}")
        self.op(f"setp.le.u32 {p}, {end}, %Skv")
        if ir.band_lo is not None:
            t = self.r32()
            self.op(f"add.s32 {t}, {wb}, {self.flag_rows() - 1 + ir.band_lo}")
            self.op(f"setp.ge.and.s32 {p}, %j0, {t}, {p}")
        if ir.band_hi is not None:
            t, u = self.r32(), self.r32()
            self.op(f"add.s32 {t}, {wb}, {ir.band_hi}")
            self.op(f"add.s32 {u}, %j0, {s.block_n - 1}")
            self.op(f"setp.le.and.s32 {p}, {u}, {t}, {p}")
        return p

    def _gather_nodes(self, x) -> list[E.Node]:
        """The subscripts of x in the score and mask (x[h], x[i], x[j]), each once."""
        out: dict = {}
        for t in ([self.ir.score] if self.ir.score is not None else []) + list(self.ir.mask):
            for n in E.walk(t):
                if isinstance(n, E.Gather) and n.x.name == x.name:
                    out.setdefault(n, None)
        if not out:
            raise EmitError(f"{x.name} is not read")
        return list(out)

    def _load_extra(self, x, ptr: str, idx: str, pred: str | None) -> str:
        """f32 value of x at element idx (0 where pred is false)."""
        size = ELEM_BYTES[x.dtype]
        a = self.r64()
        self.op(f"mul.wide.u32 {a}, {idx}, {size}")
        self.op(f"add.u64 {a}, {a}, {ptr}")
        f = self.f32()
        g = f"@{pred} " if pred else ""
        if x.dtype == "fp32":
            self.op(f"mov.f32 {f}, 0f00000000")
            self.op(f"{g}ld.global.nc.f32 {f}, [{a}]")
        elif x.dtype == "int32":
            r = self.r32()
            self.op(f"mov.u32 {r}, 0")
            self.op(f"{g}ld.global.nc.s32 {r}, [{a}]")
            self.op(f"cvt.rn.f32.s32 {f}, {r}")
        else:
            h = self.b.reg("b16")
            self.op(f"mov.b16 {h}, 0")
            self.op(f"{g}ld.global.nc.b16 {h}, [{a}]")
            self.op(f"cvt.f32.{'bf16' if x.dtype == 'bf16' else 'f16'} {f}, {h}")
        return f

    def band_bounds(self, rows, colb: str) -> list[tuple[str | None, str]]:
        """Per row h of this thread: (lo_h, hi_h), the band's keys [i + lo, min(i + hi, Skv -
        1)] less this thread's first column j0 + colb (s32; lo_h None without a lower
        bound): the key at column offset n is kept when lo_h <= n <= hi_h."""
        ir = self.ir
        jb, last = self.r32(), self.r32()
        self.op(f"add.u32 {jb}, %j0, {colb}")
        self.op(f"add.s32 {last}, %Skv, -1")
        out = []
        for r in rows:
            hi_h = self.r32()
            if ir.band_hi is None:
                self.op(f"sub.s32 {hi_h}, {last}, {jb}")
            else:
                self.op(f"add.s32 {hi_h}, {r}, {ir.band_hi}")
                self.op(f"min.s32 {hi_h}, {hi_h}, {last}")
                self.op(f"sub.s32 {hi_h}, {hi_h}, {jb}")
            lo_h = None
            if ir.band_lo is not None:
                lo_h = self.r32()
                self.op(f"add.s32 {lo_h}, {r}, {ir.band_lo}")
                self.op(f"sub.s32 {lo_h}, {lo_h}, {jb}")
            out.append((lo_h, hi_h))
        return out

    def band_keep(self, bounds, h: int, n: int) -> str:
        """Whether the key at column offset n of row h is inside the band and below Skv."""
        lo_h, hi_h = bounds[h]
        p = self.pred()
        self.op(f"setp.ge.s32 {p}, {hi_h}, {n}")
        if lo_h is not None:
            self.op(f"setp.le.and.s32 {p}, {lo_h}, {n}, {p}")
        return p

    def mask_reads_s(self) -> bool:
        """Whether a mask term reads the score s (then the mask needs the scaled score)."""
        return any(
            isinstance(n, E.Input) and n.name == "s" for t in self.ir.mask for n in E.walk(t)
        )

    def alibi_biases(self, rows, colb: str, side: int) -> dict[int, str]:
        """The base-2 ALiBi bias of every score of a one-sided tile (tiling.alibi_bias, the
        same arithmetic): c = side * coef * log2 e, per row b0 = c * (j0 + colb - i), then at
        column j0 + colb + n (n = 8 jj + e) fma(c, n, b0). Keyed by the S register index."""
        ev = _Score(self.b, None, True)
        out: dict[int, str] = {}
        for h, r in enumerate(rows):
            env = {"h": self.fh, "i": self.fi[f"i{h}"]}
            c = self.f32()
            if isinstance(self.alibi[1], E.Const):
                self.op(f"mov.f32 {c}, {f32_literal(side * self.alibi[1].value * LOG2E)}")
            else:
                coef = ev.value(self.alibi[1], env, dict(self.row_vals[h]))
                lit = f32_literal(LOG2E if side > 0 else -LOG2E)
                self.op(f"mul.f32 {c}, {coef}, {lit}")
            d, fd, b0 = self.r32(), self.f32(), self.f32()
            self.op(f"add.u32 {d}, %j0, {colb}")
            self.op(f"sub.u32 {d}, {d}, {r}")
            self.op(f"cvt.rn.f32.s32 {fd}, {d}")
            self.op(f"mul.f32 {b0}, {c}, {fd}")
            for jj in range(self.s.block_n // 8):
                for e in range(2):
                    n = 8 * jj + e
                    if n == 0:
                        out[4 * jj + 2 * h + e] = b0
                        continue
                    bv = self.f32()
                    self.op(f"fma.rn.f32 {bv}, {c}, {f32_literal(float(n))}, {b0}")
                    out[4 * jj + 2 * h + e] = bv
        return out

    def softmax(
        self,
        rows,
        colb: str,
        masked: bool,
        defer: bool = False,
        fast_tanh: bool = False,
        side: int = 0,
    ) -> None:
        """x = score * log2(e) (masked: -inf where a term fails or j >= Skv), the row max over
        the 4 lanes, rescale O and l, P = 2^(x - m) packed to 16-bit pairs. Without a score
        expression (or mask terms on a masked tile) and with a positive scale, x is never
        formed: the max is taken over the raw products and scaled once a row (a positive
        factor keeps the order), and 2^(x - m) is ex2(fma(s, scale log2 e, -m)): one
        operation a score fewer."""
        ir, s, b = self.ir, self.s, self.b
        b.comment(
            "softmax"
            + (" (masked tile)" if masked else "")
            + (f" (ALiBi, keys {'before' if side > 0 else 'after'} the rows)" if side else "")
        )
        ev = _Score(b, None, True)
        ev.fast_tanh = fast_tanh
        scale_l2 = ir.scale * LOG2E
        # an unmasked tile loads only the per-key inputs the score reads (a document id
        # read by the mask alone is not loaded there)
        cols = self.col_inputs if masked else [c for c in self.col_inputs if c[2] in self.in_score]
        # a masked tile tests the band (and j < Skv) on integers: per row the columns
        # [lo, hi] relative to this thread's first column (band_bounds); only the other
        # (elementwise) terms are evaluated as expressions
        # (without a band, only the tail's j < Skv, per column; with other elementwise terms,
        # such as a document's ids, every term as an expression as before: the integer
        # bounds' registers made the overlapped 128 x 128 document kernels spill at 168)
        # a score reading j (ALiBi) forms j per column anyway: there the band terms stay
        # float compares on it (as many operations, fewer live registers)
        int_band = (
            (ir.band_lo is not None or ir.band_hi is not None)
            and not ir.elementwise
            and "j" not in self.score_reads
        )
        terms = ir.elementwise if int_band else ir.mask
        reads_j = self.elementwise_reads_j if int_band else "j" in self.reads
        fj_needed = "j" in self.score_reads or (masked and reads_j)
        need_j = (fj_needed or cols or (masked and not int_band)) and not side
        bounds = self.band_bounds(rows, colb) if masked and int_band else None
        ninf = self.f32()
        self.op(f"mov.f32 {ninf}, 0fFF800000")
        colv: dict[int, tuple[str, str | None, dict]] = {}
        for jj in range(s.block_n // 8):
            for e in range(2):
                fj, gath, pin = None, {}, None
                if need_j:
                    j = self.r32()
                    self.op(f"add.u32 {j}, %j0, {colb}")
                    self.op(f"add.u32 {j}, {j}, {8 * jj + e}")
                    if masked and not int_band:
                        pin = self.pred()
                        self.op(f"setp.lt.u32 {pin}, {j}, %Skv")
                    if fj_needed:
                        fj = self.f32()
                        self.op(f"cvt.rn.f32.u32 {fj}, {j}")
                    for x, ptr, node in cols:
                        idx = j
                        if x.batched:
                            idx = self.r32()
                            self.op(f"mad.lo.u32 {idx}, %bb, %Skv, {j}")
                        pj = self.pred()
                        self.op(f"setp.lt.u32 {pj}, {j}, %Skv")
                        gath[node] = self._load_extra(x, ptr, idx, pj)
                colv[2 * jj + e] = (fj, gath, pin)
        xs: dict[int, str] = {}
        raw = ir.score is None and ir.scale > 0 and not self.mask_reads_s()
        if side:
            bias = self.alibi_biases(rows, colb, side)
            kl2 = f32_literal(self.alibi[0] * ir.scale * LOG2E)
        for h in range(2):
            for jj in range(s.block_n // 8):
                for e in range(2):
                    idx = 4 * jj + 2 * h + e
                    fj, gath, pin = colv[2 * jj + e]
                    if bounds is not None:
                        pin = self.band_keep(bounds, h, 8 * jj + e)
                    acc = f"%sa{idx}"
                    if side:
                        x = self.f32()
                        self.op(f"fma.rn.f32 {x}, {acc}, {kl2}, {bias[idx]}")
                    elif raw:
                        x = acc
                        if masked:
                            keep = pin
                            env = {"h": self.fh, "i": self.fi[f"i{h}"]}
                            if fj is not None:
                                env["j"] = fj
                            memo = {**self.row_vals[h], **gath}
                            for term in terms:
                                pt = ev.value(term, env, memo)
                                k2 = self.pred()
                                self.op(f"and.pred {k2}, {keep}, {pt}")
                                keep = k2
                            x = self.f32()
                            self.op(f"selp.f32 {x}, {acc}, {ninf}, {keep}")
                    elif ir.score is None and (not masked or not terms):
                        x = self.f32()
                        self.op(f"mul.f32 {x}, {acc}, {f32_literal(scale_l2)}")
                        if masked:
                            self.op(f"selp.f32 {x}, {x}, {ninf}, {pin}")
                    else:
                        sv = self.f32()
                        self.op(f"mul.f32 {sv}, {acc}, {f32_literal(ir.scale)}")
                        env = {"s": sv, "h": self.fh, "i": self.fi[f"i{h}"]}
                        if fj is not None:
                            env["j"] = fj
                        memo = {**self.row_vals[h], **gath}
                        score = sv if ir.score is None else ev.value(ir.score, env, memo)
                        x = self.f32()
                        self.op(f"mul.f32 {x}, {score}, {f32_literal(LOG2E)}")
                        if masked:
                            keep = pin
                            for term in terms:
                                pt = ev.value(term, env, memo)
                                k2 = self.pred()
                                self.op(f"and.pred {k2}, {keep}, {pt}")
                                keep = k2
                            self.op(f"selp.f32 {x}, {x}, {ninf}, {keep}")
                    xs[idx] = x
        for h in range(2):
            idxs = [4 * jj + 2 * h + e for jj in range(s.block_n // 8) for e in range(2)]
            mx = self.f32()
            self.op(f"max.f32 {mx}, {xs[idxs[0]]}, {xs[idxs[1]]}")
            for i in idxs[2:]:
                self.op(f"max.f32 {mx}, {mx}, {xs[i]}")
            for lanes in (1, 2):
                o = self.f32()
                self.op(f"shfl.sync.bfly.b32 {o}, {mx}, {lanes}, 31, -1")
                self.op(f"max.f32 {mx}, {mx}, {o}")
            if raw:
                self.op(f"mul.f32 {mx}, {mx}, {f32_literal(scale_l2)}")
            mnew, muse = self.f32(), self.f32()
            self.op(f"max.f32 {mnew}, %m{h}, {mx}")
            pinf = self.pred()
            self.op(f"setp.eq.f32 {pinf}, {mnew}, 0fFF800000")
            self.op(f"selp.f32 {muse}, 0f00000000, {mnew}, {pinf}")
            alpha, t = self.f32(), self.f32()
            self.op(f"sub.f32 {t}, %m{h}, {muse}")
            self.op(f"ex2.approx.ftz.f32 {alpha}, {t}")
            self.op(f"mov.f32 %m{h}, {mnew}")
            total = self.f32()
            self.op(f"mov.f32 {total}, 0f00000000")
            ps = {}
            if raw:
                nm = self.f32()
                self.op(f"neg.f32 {nm}, {muse}")
            for i in idxs:
                d = self.f32()
                p = f"%sa{i}" if defer else self.f32()
                if raw:
                    self.op(f"fma.rn.f32 {d}, {xs[i]}, {f32_literal(scale_l2)}, {nm}")
                else:
                    self.op(f"sub.f32 {d}, {xs[i]}, {muse}")
                self.op(f"ex2.approx.ftz.f32 {p}, {d}")
                self.op(f"add.f32 {total}, {total}, {p}")
                ps[i] = p
            self.op(f"fma.rn.f32 %l{h}, %l{h}, {alpha}, {total}")
            if defer:
                self.op(f"mov.f32 %al{h}, {alpha}")
            else:
                for jd in range(self.d // 8):
                    for e in range(2):
                        r = f"%oa{4 * jd + 2 * h + e}"
                        self.op(f"mul.f32 {r}, {r}, {alpha}")
            if defer:
                continue  # the probabilities wait in %sa for pack_p
            for jj in range(s.block_n // 8):
                lo, hi = ps[4 * jj + 2 * h], ps[4 * jj + 2 * h + 1]
                # the upper half takes the first operand: the odd column goes high
                self.op(f"cvt.rn.{CVT_PAIR[ir.dtype]}.f32 %pp{2 * jj + h}, {hi}, {lo}")

    def epilogue(self, rows, colb: str, lane: str) -> None:
        ir, b = self.ir, self.b
        b.comment("epilogue: O / l, stored as 16-bit pairs; the log-sum-exp")
        out = self._ptr("out_o")
        lse = self._ptr("out_lse") if ir.lse else None
        cvt = CVT_PAIR["bf16" if ir.out_dtype == "bf16" else "fp16"]
        for h, r in enumerate(rows):
            for lanes in (1, 2):
                o = self.f32()
                self.op(f"shfl.sync.bfly.b32 {o}, %l{h}, {lanes}, 31, -1")
                self.op(f"add.f32 %l{h}, %l{h}, {o}")
            pz = self.pred()
            self.op(f"setp.gt.f32 {pz}, %l{h}, 0f00000000")
            inv = self.f32()
            # rcp.rn would be a subroutine call, and any call makes ptxas serialise every wgmma
            self.op(f"rcp.approx.ftz.f32 {inv}, %l{h}")
            self.op(f"selp.f32 {inv}, {inv}, 0f00000000, {pz}")
            prow = self.pred()
            self.op(f"setp.lt.u32 {prow}, {r}, %S")
            grow = self.r32()
            self.op(f"mad.lo.u32 {grow}, %bhq, %S, {r}")
            a = self.r64()
            self.op(f"mul.wide.u32 {a}, {grow}, {self.d * 2}")
            self.op(f"add.u64 {a}, {a}, {out}")
            cb = self.r64()
            self.op(f"mul.wide.u32 {cb}, {colb}, 2")
            self.op(f"add.u64 {a}, {a}, {cb}")
            for jd in range(self.d // 8):
                v0, v1 = self.f32(), self.f32()
                self.op(f"mul.f32 {v0}, %oa{4 * jd + 2 * h}, {inv}")
                self.op(f"mul.f32 {v1}, %oa{4 * jd + 2 * h + 1}, {inv}")
                w = self.r32()
                self.op(f"cvt.rn.{cvt}.f32 {w}, {v1}, {v0}")
                self.op(f"@{prow} st.global.b32 [{a}+{16 * jd}], {w}")
            if lse is not None:
                lg = self.f32()
                self.op(f"lg2.approx.f32 {lg}, %l{h}")
                self.op(f"add.f32 {lg}, {lg}, %m{h}")
                self.op(f"mul.f32 {lg}, {lg}, {f32_literal(LN2)}")
                self.op(f"selp.f32 {lg}, {lg}, 0fFF800000, {pz}")
                pl = self.pred()
                q = self.r32()
                self.op(f"and.b32 {q}, {lane}, 3")
                self.op(f"setp.eq.and.u32 {pl}, {q}, 0, {prow}")
                la = self.r64()
                self.op(f"mul.wide.u32 {la}, {grow}, 4")
                self.op(f"add.u64 {la}, {la}, {lse}")
                self.op(f"@{pl} st.global.f32 [{la}], {lg}")
