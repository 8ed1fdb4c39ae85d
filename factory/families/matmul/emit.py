"""The Hopper (sm_90a) GEMM emitter: TMA loads, an mbarrier ring, wgmma, a fused epilogue.

One CTA = 1 producer warpgroup + `consumers` consumer warpgroups (see schedule.py for the plan,
the cooperative and the ping-pong split of the tiles between consumers, and `tiling.py` for the
index arithmetic and a model of the mbarrier ring in Python).

Tails: the TMA fills the parts of a box outside the tensor with zeros, so a k-block past K adds
nothing and rows/columns past M/N compute zeros that are never stored; a tile wholly inside the
output with N even stores column pairs without predicates, any other tile element by element
under row < M and column < N.

Split-K (schedule.split_k > 1): a cluster of split_k CTAs per output tile, each over its part of
the k-blocks; the fp32 partials are summed through distributed shared memory in rank order
(`split_k_epilogue`). fp8 e4m3 outputs are stored with cvt.rn.satfinite.e4m3x2; a group-scaled
one (ir.EpiOutput.group_scale) also writes a scale per row and 128 columns (`_group_scale`).

TMA-store epilogue (schedule.tma_store = T > 0 columns): each consumer warpgroup has a staging
buffer of T / 64 slots, each one box of 64 rows x 64 columns of the output (8 KB, 128-byte
swizzle: row r's 16-byte chunk c at r * 128 + (c ^ r % 8) * 16, the layout the TMA store reads).
The epilogue walks the tile's boxes in order, box q into slot q % (T / 64): the warpgroup's first
thread waits until at most T / 64 - 1 of its earlier box stores are still reading shared memory
(cp.async.bulk.wait_group.read), a named barrier, every thread writes its values of the box, a
fence.proxy.async (generic writes made visible to the TMA's async proxy), a named barrier, then
the first thread issues the box's store (cp.async.bulk.tensor ... bulk_group, one commit per
box). The TMA clips rows and columns past the output, so tail tiles store with no predicates.
The first thread waits for all its stores before the kernel exits (tiling.simulate_tma_store
models the protocol). With schedule.TMA_STORE_FALLBACK_VERIFIED the output map's rows are padded
to 16 bytes (it encodes at any N) and each tile's epilogue checks N: output rows that are not a
multiple of 16 bytes take the register-store epilogue instead (the map is not exact there).

Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats every 8 rows of 128
bytes, and the wgmma descriptors assume that period starts on a 1024-byte boundary):
  A ring:  stages x (tile_m rows x 128 bytes)          row r of a k-block of A at r*128
  B ring:  stages x (b_rows rows x 128 bytes)          B stored [N, K]: row n holds 64 k values
  staging: consumers x (tma_store / 64) x 8 KB         only with tma_store
  full[stages], empty[stages]: 8-byte mbarriers
Each 128-byte row holds 64 bf16 of K; the TMA writes its 16-byte chunk c at chunk c ^ (r % 8)
(CU_TENSOR_MAP_SWIZZLE_128B), which is the layout wgmma's 128-byte swizzle mode reads.

wgmma shared-memory descriptor (64 bits) of a K-major operand with 128-byte swizzle:
  bits  0-13  start address >> 4
  bits 16-29  leading byte offset >> 4 (unused for swizzled K-major layouts; 1 by convention)
  bits 32-45  stride byte offset >> 4: 1024 bytes between groups of 8 rows -> 64
  bits 62-63  swizzle mode: 1 = 128-byte
Stepping K by 16 elements inside the 64-wide k-block adds 32 bytes to the start address: the
hardware applies the XOR swizzle to the final address, so the chunks stay where the TMA put them.

Accumulator fragment of m64nNk16 (f32), thread t of a warpgroup (warp w = t / 32, lane l): register
4j + 2h + e holds row 16w + l/4 + 8h, column 8j + 2(l % 4) + e (j < N/8, h, e in {0, 1}).
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.emit import ops
from factory.emit.hopper import TMA_LOAD, WGMMA_TYPE, HopperKernel, ptx_head
from factory.emit.ptx import Builder, EmitError
from factory.families.matmul import schedule as sched_mod
from factory.families.matmul.ir import ACC, ACC2, SCALE_GROUP, GemmIR
from factory.families.matmul.schedule import (
    NUM_SMS,
    PRODUCER_REGS,
    GemmSchedule,
    is_valid,
    staged_bytes,
)
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8e4m3": 1}


@dataclass(frozen=True)
class Emitted:
    """Same shape as factory.emit.rowkernel.Emitted (ptx, entry, params, launch)."""

    ptx: str
    entry: str
    params: tuple[KernelParam, ...]
    launch: Launch


def tmap_param(
    name: str, tensor: str, box: tuple[int, int], dims: tuple[str, str], swizzle: int = 128
) -> KernelParam:
    """A CUtensorMap kernel parameter: a 2D tiled map over `tensor` (row-major), innermost dim
    first, box in elements, 128-byte swizzle."""
    del name  # binding is positional; the PTX parameter's name is the emitter's business
    return KernelParam(
        "tmap", "b8x128", tensor, 0.0, box=tuple(box), dims=tuple(dims), swizzle=swizzle
    )


def rows_expr(ir: GemmIR) -> str:
    """The output's row count as a dim expression: batch axes and M flattened (A, the output
    and "full" inputs are contiguous over them; B is shared by the batch)."""
    return " * ".join((*ir.batch, ir.m))


def launch_for(ir: GemmIR, s: GemmSchedule) -> Launch:
    if s.split_k > 1:
        # one cluster of split_k CTAs per output tile, CTA rank r computing the r-th part of K
        tiles = f"ceildiv({rows_expr(ir)}, {s.tile_m}) * ceildiv({ir.n}, {s.tile_n})"
        return Launch(
            grid=(f"{tiles} * {s.split_k}", 1, 1),
            block=(s.threads(), 1, 1),
            smem_bytes=s.smem_bytes(ir),
            cluster=(s.split_k, 1, 1),
        )
    if s.cluster_m == 2:
        # clusters of 2 CTAs stacked along M: the grid counts CTAs, a multiple of 2
        pairs = f"ceildiv(ceildiv({rows_expr(ir)}, {s.tile_m}), 2) * ceildiv({ir.n}, {s.tile_n})"
        units = f"min({pairs}, {NUM_SMS // 2})" if s.persistent else pairs
        return Launch(
            grid=(f"{units} * 2", 1, 1),
            block=(s.threads(), 1, 1),
            smem_bytes=s.smem_bytes(ir),
            cluster=(2, 1, 1),
        )
    tiles = f"ceildiv({rows_expr(ir)}, {s.tile_m}) * ceildiv({ir.n}, {s.tile_n})"
    grid = f"min({tiles}, {NUM_SMS})" if s.persistent else tiles
    return Launch(grid=(grid, 1, 1), block=(s.threads(), 1, 1), smem_bytes=s.smem_bytes(ir))


class _Epilogue:
    """Evaluates the outputs' expressions for one accumulator element."""

    def __init__(self, b: Builder, ir: GemmIR, fast: bool):
        self.b, self.ir, self.fast = b, ir, fast

    def value(self, node: E.Node, env: dict[str, str], memo: dict) -> str:
        if node in memo:
            return memo[node]
        b = self.b
        if isinstance(node, E.Input):
            r = env[node.name]
        elif isinstance(node, E.Const):
            r = b.const_f32(node.value)
        elif isinstance(node, E.Unary):
            r = ops.UNARY[node.op](b, self.value(node.x, env, memo), self.fast)
        elif isinstance(node, E.Binary):
            x = self.value(node.a, env, memo)
            if node.op == "pow":
                if not isinstance(node.b, E.Const):
                    raise EmitError("pow needs a constant exponent")
                r = ops.pow_const(b, x, node.b.value, self.fast)
            else:
                r = ops.BINARY[node.op](b, x, self.value(node.b, env, memo), self.fast)
        elif isinstance(node, E.Compare):
            r = ops.compare(
                b, node.op, self.value(node.a, env, memo), self.value(node.b, env, memo)
            )
        elif isinstance(node, E.Where):
            p = self.value(node.cond, env, memo)
            r = b.reg("f32")
            b.op(
                f"selp.f32 {r}, {self.value(node.a, env, memo)}, "
                f"{self.value(node.b, env, memo)}, {p}"
            )
        elif isinstance(node, E.Cast) and node.to == "fp8e4m3":
            r = _round_e4m3(b, self.value(node.x, env, memo))
        elif isinstance(node, E.Cast):
            r = ops.cast_round(b, self.value(node.x, env, memo), node.to)
        else:
            raise EmitError(f"{type(node).__name__} is not elementwise")
        memo[node] = r
        return r


def _round_e4m3(b: Builder, x: str) -> str:
    """x rounded to fp8 e4m3 (nearest even, saturating at 448) and widened back to f32."""
    pair, h0, h1 = b.reg("b16"), b.reg("b16"), b.reg("b16")
    zero = b.const_f32(0.0)
    b.op(f"cvt.rn.satfinite.e4m3x2.f32 {pair}, {zero}, {x}")
    half2 = b.reg("b32")
    b.op(f"cvt.rn.f16x2.e4m3x2 {half2}, {pair}")
    b.op(f"mov.b32 {{{h0}, {h1}}}, {half2}")
    r = b.reg("f32")
    b.op(f"cvt.f32.f16 {r}, {h0}")
    return r


def _cvt_in(b: Builder, dtype: str, word: str, pair: bool) -> list[str]:
    """f32 registers of a loaded 16-bit input: a b32 holding two values (pair, the lower column
    in the low half) or a b16 holding one. fp32 inputs are loaded straight into f32 registers."""
    if dtype not in ("bf16", "fp16"):
        raise EmitError(f"no 16-bit conversion for {dtype}")
    outs = []
    if dtype == "bf16":
        if pair:
            lo, hi = b.reg("b32"), b.reg("b32")
            b.op(f"shl.b32 {lo}, {word}, 16")
            b.op(f"and.b32 {hi}, {word}, -65536")
            for w in (lo, hi):
                f = b.reg("f32")
                b.op(f"mov.b32 {f}, {w}")
                outs.append(f)
        else:
            f = b.reg("f32")
            b.op(f"cvt.f32.bf16 {f}, {word}")
            outs.append(f)
    else:
        if pair:
            h0, h1 = b.reg("b16"), b.reg("b16")
            b.op(f"mov.b32 {{{h0}, {h1}}}, {word}")
            for h in (h0, h1):
                f = b.reg("f32")
                b.op(f"cvt.f32.f16 {f}, {h}")
                outs.append(f)
        else:
            f = b.reg("f32")
            b.op(f"cvt.f32.f16 {f}, {word}")
            outs.append(f)
    return outs


def emit(ir: GemmIR, s: GemmSchedule, arch: str = "sm_90a") -> Emitted:
    why = is_valid(ir, s)
    assert why is None, why
    if arch != "sm_90a":
        raise EmitError("the wgmma path needs sm_90a")
    return _Kernel(ir, s).render()


class _Kernel(HopperKernel):
    def __init__(self, ir: GemmIR, s: GemmSchedule):
        self.ir, self.s = ir, s
        self.b = Builder()
        self.entry = f"{ir.name}_wgmma_{s.tile_m}x{s.tile_n}_s{s.stages}"
        # split-K: a cluster of `sk` CTAs shares one output tile, rank r summing k-blocks
        # [r * nk / sk, (r + 1) * nk / sk); the partial tiles meet in shared memory (below)
        self.sk = s.split_k
        if self.sk > 1:
            self.entry += f"_sk{self.sk}"
        self.two = ir.b2 is not None
        # a stage holds tile_k / 64 sub-blocks of 64 k (one 128-byte swizzle row each): per
        # sub-block tile_m rows of A, and b_rows rows of B (B2's after B's)
        self.subs = s.tile_k // 64
        self.a_sub = s.tile_m * 128
        self.b_sub = s.b_rows(ir) * 128
        self.a_bytes = self.a_sub * self.subs  # one stage of A
        self.b_bytes = self.b_sub * self.subs  # one stage of B (and B2)
        self.pp = s.pingpong
        # 2x1 cluster: the two CTAs take vertically adjacent tiles of one tile column; each
        # loads its own A and half of the shared B tile, multicast into both CTAs
        self.cl = s.cluster_m == 2
        # registers per accumulator: a second accumulator holds A @ B2 (two) or, with pingpong,
        # the tile's rows 64-127
        self.n_acc = s.acc_regs(ir) // (2 if self.two or self.pp else 1)
        # TMA-store epilogue: staging slots per consumer warpgroup (0: stores from registers),
        # each one box of 64 rows x 128 bytes: 64 columns of a 16-bit output, 128 of an fp8 one
        self.ts_elem = staged_bytes(ir)
        self.ts_blocks = 128 // self.ts_elem // 8  # column blocks (8 columns) per box
        self.ts_slots = s.tma_store // (128 // self.ts_elem)
        if self.ts_slots:
            self.entry += f"_ts{s.tma_store}"
        # staged kernels with a register-store fallback for output rows that are not a multiple
        # of 16 bytes (schedule.TMA_STORE_FALLBACK_VERIFIED; read when the kernel is emitted)
        self.ts_fallback = bool(self.ts_slots) and sched_mod.TMA_STORE_FALLBACK_VERIFIED
        # cp.async loads by the whole producer warpgroup (see producer_cp_async)
        self.cpa = s.load == "cp_async"
        if self.cpa:
            self.entry += "_cpa"

    # ---- helpers (op, r32, r64, pred, wait, advance, ...: HopperKernel) -------------------
    def tile_coords(self, t: str) -> tuple[str, str]:
        """(tile row, tile column) of linear tile index t in the grouped order: tiles run down
        `group_m` tile rows, then across, so the CTAs of one wave share A rows and B columns."""
        g = self.s.group_m
        per_group = self.r32()
        self.op(f"mul.lo.u32 {per_group}, %tiles_n, {g}")
        grp = self.r32()
        self.op(f"div.u32 {grp}, {t}, {per_group}")
        first = self.r32()
        self.op(f"mul.lo.u32 {first}, {grp}, {g}")
        rows = self.r32()
        self.op(f"sub.u32 {rows}, %units_m, {first}")
        self.op(f"min.u32 {rows}, {rows}, {g}")
        within = self.r32()
        self.op(f"mul.lo.u32 {within}, {grp}, {per_group}")
        self.op(f"sub.u32 {within}, {t}, {within}")
        tm, tn = self.r32(), self.r32()
        self.op(f"rem.u32 {tm}, {within}, {rows}")
        self.op(f"add.u32 {tm}, {tm}, {first}")
        self.op(f"div.u32 {tn}, {within}, {rows}")
        if self.cl:
            # tile row of this CTA: the pair's row times 2 plus its rank in the cluster (a row
            # past the output computes zeros from the TMA's fill and stores nothing)
            self.op(f"mad.lo.u32 {tm}, {tm}, 2, %rank")
        return tm, tn

    # ---- the kernel ----------------------------------------------------------------------
    def render(self) -> Emitted:
        ir, s, b = self.ir, self.s, self.b
        params: list[KernelParam] = []
        plist: list[str] = []
        b_box = s.tile_n // 2 if self.cl else s.tile_n
        maps = [("a_map", ir.a.name, s.tile_m, rows_expr(ir)), ("b_map", ir.b.name, b_box, ir.n)]
        if self.two:
            maps.append(("b2_map", ir.b2.name, b_box, ir.n))
        if self.cpa:
            # cp.async loads: A, B (and B2) by their global addresses, no tensor maps
            for _, tensor, _, _ in maps:
                params.append(KernelParam("tensor", "u64", tensor))
                plist.append(f".param .u64 src_{tensor}")
        else:
            for pname, tensor, rows, outer in maps:
                params.append(tmap_param(pname, tensor, (64, rows), (ir.k, outer)))
                plist.append(f".param .align 64 .b8 {pname}[128]")
        if self.ts_slots:
            # the output's map: boxes of 64 x 64 16-bit elements (128 bytes x 64 rows), stored
            # from the staging slots; an fp8 output is mapped as its bytes in 16-bit pairs (N / 2
            # elements a row: one 128-byte box row = 128 fp8 columns), so its tensor map is
            # encoded with a 2-byte element type
            cols = ir.n if self.ts_elem == 2 else f"ceildiv({ir.n}, 2)"
            if self.ts_fallback:
                # rows padded to 16 bytes (ceildiv(N, 8) * 8 16-bit elements; fp8: ceildiv(N,
                # 16) * 8 pairs), so that the map encodes at any N: where N * element bytes is a
                # multiple of 16 that is N (N / 2 pairs) and the map is exact; elsewhere it is
                # not, and the kernel does not use it (register stores, `epilogue`)
                cols = (
                    f"ceildiv({ir.n}, 8) * 8" if self.ts_elem == 2 else f"ceildiv({ir.n}, 16) * 8"
                )
            params.append(tmap_param("c_map", ir.outputs[0].name, (64, 64), (cols, rows_expr(ir))))
            plist.append(".param .align 64 .b8 c_map[128]")
        for o in ir.outputs:
            params.append(KernelParam("tensor", "u64", o.name))
            plist.append(f".param .u64 out_{o.name}")
        for o in ir.outputs:
            if o.group_scale:
                params.append(KernelParam("tensor", "u64", o.group_scale))
                plist.append(f".param .u64 out_{o.group_scale}")
        for i in ir.inputs:
            params.append(KernelParam("tensor", "u64", i.name))
            plist.append(f".param .u64 in_{i.name}")
        for d in (*ir.batch, ir.m, ir.n, ir.k):
            params.append(KernelParam("dim", "u32", d))
        plist += [f".param .u32 dim_b{i}" for i in range(len(ir.batch))]
        plist += [".param .u32 dim_m", ".param .u32 dim_n", ".param .u32 dim_k"]

        maxnreg = min(248, 65536 // s.threads() // 8 * 8)
        creg = s.consumer_regs()

        b.comment("load dims, tile counts, shared-memory layout")
        # %Mb: rows of one batch entry (row-role inputs repeat per entry); %M: all rows
        self.op("ld.param.u32 %Mb, [dim_m]")
        self.op("mov.u32 %M, %Mb")
        for i in range(len(ir.batch)):
            bd = self.r32()
            self.op(f"ld.param.u32 {bd}, [dim_b{i}]")
            self.op(f"mul.lo.u32 %M, %M, {bd}")
        self.op("ld.param.u32 %N, [dim_n]")
        self.op("ld.param.u32 %K, [dim_k]")
        self.op(f"add.u32 %tiles_m, %M, {s.tile_m - 1}")
        self.op(f"div.u32 %tiles_m, %tiles_m, {s.tile_m}")
        self.op(f"add.u32 %tiles_n, %N, {s.tile_n - 1}")
        self.op(f"div.u32 %tiles_n, %tiles_n, {s.tile_n}")
        if self.cl:
            self.op("add.u32 %units_m, %tiles_m, 1")
            self.op("shr.u32 %units_m, %units_m, 1")
        else:
            self.op("mov.u32 %units_m, %tiles_m")
        # %tiles: work units (tiles, or tile pairs with a cluster) walked from %cta by %ncta
        self.op("mul.lo.u32 %tiles, %units_m, %tiles_n")
        self.op(f"add.u32 %nk, %K, {s.tile_k - 1}")
        self.op(f"shr.u32 %nk, %nk, {s.tile_k.bit_length() - 1}")
        if self.sk == 1:
            self.op("mov.u32 %kb0, 0")
            self.op("mov.u32 %kb1, %nk")
        self.op("mov.u32 %tx, %tid.x")
        self.op("shr.u32 %wg, %tx, 7")
        self.smem_base()
        self.op(f"add.u32 %sb, %base, {s.stages * self.a_bytes}")  # B ring
        self.op(f"add.u32 %epi, %sb, {s.stages * self.b_bytes}")  # staging (tma_store)
        self.op(f"add.u32 %full, %epi, {s.epi_bytes(ir)}")  # full barriers
        self.op(f"add.u32 %empty, %full, {8 * s.stages}")  # empty barriers
        self.op("mov.u32 %stage, 0")
        self.op("mov.u32 %phase, 0")
        if self.cl or self.sk > 1:
            self.op("mov.u32 %ncta, %nclusterid.x")
            self.op("mov.u32 %cta, %clusterid.x")
            self.op("mov.u32 %rank, %cluster_ctarank")
        if self.sk > 1:
            # this CTA's k-blocks: [rank * nk / sk, (rank + 1) * nk / sk), empty when nk < sk
            self.op("mul.lo.u32 %kb0, %rank, %nk")
            self.op(f"div.u32 %kb0, %kb0, {self.sk}")
            self.op("add.u32 %kb1, %rank, 1")
            self.op("mul.lo.u32 %kb1, %kb1, %nk")
            self.op(f"div.u32 %kb1, %kb1, {self.sk}")
        if not self.cl and self.sk == 1:
            self.op("mov.u32 %ncta, %nctaid.x")
            self.op("mov.u32 %cta, %ctaid.x")

        b.comment(
            "thread 0 initialises the barriers: full expects the 128 producer threads' "
            "cp.async arrivals; empty one arrival per consumer warp"
            if self.cpa
            else "thread 0 initialises the barriers: full expects the producer's one arrival "
            "plus the TMA bytes; empty one arrival per consumer warp"
        )
        releasers = 4 if self.pp else 4 * s.consumers  # warps that read each stage
        if self.cl:
            releasers *= 2  # a slot is refilled in both CTAs: both CTAs' readers release
        # cp.async: each of the producer warpgroup's 128 threads arrives once per stage (noinc)
        fills = 128 if self.cpa else 1
        inits = []
        for i in range(s.stages):
            inits += [(f"%full+{8 * i}", fills), (f"%empty+{8 * i}", releasers)]
        self.init_barriers(inits)
        if self.cl:
            # both CTAs' barriers initialised before any multicast or remote arrive
            self.op("barrier.cluster.arrive.release.aligned")
            self.op("barrier.cluster.wait.acquire.aligned")
        else:
            self.op("bar.sync 0")

        lab_cons = b.new_label("consumer")
        lab_exit = b.new_label("exit")
        lab_pexit = b.new_label("pexit") if self.sk > 1 else lab_exit
        pw = self.pred()
        self.op(f"setp.ne.u32 {pw}, %wg, 0")
        self.op(f"@{pw} bra {lab_cons}")
        if self.cpa:
            self.producer_cp_async(lab_pexit, maps)
        else:
            self.producer(lab_pexit, maps)
        if self.sk > 1:
            # producer threads pass the cluster barrier twice, as the consumers do (once when
            # the partial tiles are in shared memory, once when every CTA has read them)
            b.label(lab_pexit)
            self.op("barrier.cluster.arrive.release")
            self.op("barrier.cluster.wait.acquire")
            self.op(f"bra {lab_exit}")
        b.label(lab_cons)
        self.consumer(creg)
        b.label(lab_exit)
        if self.cl or self.sk > 1:
            # stay until the peer is done: its releases arrive on our barriers
            self.op("barrier.cluster.arrive.release")
            self.op("barrier.cluster.wait.acquire")
        self.op("ret")

        body = b.lines
        decls = b.declarations()
        n = self.n_acc
        decls.append(f"    .reg .f32 %ca<{n}>;")
        if self.two or self.pp:
            decls.append(f"    .reg .f32 %cb<{n}>;")
        named = (
            "M",
            "Mb",
            "N",
            "K",
            "tiles_m",
            "units_m",
            "tiles_n",
            "tiles",
            "nk",
            "tx",
            "wg",
            "ncta",
            "base",
            "sb",
            "full",
            "empty",
            "stage",
            "phase",
            "tile",
            "kb",
            "kb0",
            "kb1",
            "ci",
            "cta",
            "rank",
            "epi",
        )
        decls.append("    .reg .b32 " + ", ".join(f"%{x}" for x in named) + ";")
        head = [
            *ptx_head(
                self.entry,
                f"{s.label()} (generated by factory.families.matmul.emit)",
                plist,
                maxnreg,
                s.threads(),
            ),
            *([".reqnctapercluster 2, 1, 1"] if self.cl else []),
            *([f".reqnctapercluster {self.sk}, 1, 1"] if self.sk > 1 else []),
            "{",
        ]
        ptx = "\n".join(head + decls + [""] + body + ["}", ""])
        return Emitted(ptx=ptx, entry=self.entry, params=tuple(params), launch=launch_for(ir, s))

    # ---- producer ------------------------------------------------------------------------
    def producer_tile_loop(self, lab_tile: str, lab_out: str) -> tuple[str, str]:
        """The producer's tile loop head at `lab_tile`: %tile starts at %cta, and once past
        %tiles the loop leaves for `lab_out`. Returns the tile's (tm, tn)."""
        self.op("mov.u32 %tile, %cta")
        pt = self.pred()
        self.b.label(lab_tile)
        self.op(f"setp.ge.u32 {pt}, %tile, %tiles")
        self.op(f"@{pt} bra {lab_out}")
        return self.tile_coords("%tile")

    def producer_k_loop(self, lab_k: str, lab_kdone: str) -> None:
        """The producer's k-block loop head at `lab_k`: %kb from %kb0, to `lab_kdone` at %kb1."""
        self.op("mov.u32 %kb, %kb0")
        self.b.label(lab_k)
        pk = self.pred()
        self.op(f"setp.ge.u32 {pk}, %kb, %kb1")
        self.op(f"@{pk} bra {lab_kdone}")

    def producer_next(self, lab_tile: str, lab_k: str, lab_kdone: str) -> None:
        """The producer's loop tails: the next ring slot and k-block, then (at `lab_kdone`)
        the next tile of this CTA."""
        self.advance()
        self.op("add.u32 %kb, %kb, 1")
        self.op(f"bra {lab_k}")
        self.b.label(lab_kdone)
        self.op("add.u32 %tile, %tile, %ncta")
        self.op(f"bra {lab_tile}")

    def producer(self, lab_exit: str, maps) -> None:
        s, b = self.s, self.b
        b.comment("producer warpgroup: give registers back, one thread issues the TMA loads")
        self.op(f"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS}")
        p = self.pred()
        self.op(f"setp.ne.u32 {p}, %tx, 0")
        self.op(f"@{p} bra {lab_exit}")
        gm = self.prefetch_maps(m[0] for m in maps)
        lab_tile, lab_k, lab_kdone = b.new_label("ptile"), b.new_label("pk"), b.new_label("pkd")
        tm, tn = self.producer_tile_loop(lab_tile, lab_exit)
        row_a, row_b = self.r32(), self.r32()
        self.op(f"mul.lo.u32 {row_a}, {tm}, {s.tile_m}")
        self.op(f"mul.lo.u32 {row_b}, {tn}, {s.tile_n}")
        if self.cl:
            self.op(f"mad.lo.u32 {row_b}, %rank, {s.tile_n // 2}, {row_b}")
            mask = self.b.reg("b16")
            self.op(f"mov.b16 {mask}, 3")
        self.producer_k_loop(lab_k, lab_kdone)
        # wait until the consumers released this slot (the first pass through the ring finds
        # the "previous phase" of a fresh barrier complete)
        full = self.claim_slot(cluster=self.cl)
        self.op(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [{full}], {s.stage_bytes(self.ir)}")
        kc = self.r32()
        self.op(f"shl.b32 {kc}, %kb, {s.tile_k.bit_length() - 1}")
        da, db = self.r32(), self.r32()
        self.op(f"mad.lo.u32 {da}, %stage, {self.a_bytes}, %base")
        self.op(f"mad.lo.u32 {db}, %stage, {self.b_bytes}, %sb")
        cp = TMA_LOAD.format(2)
        if self.subs > 1:
            # sub-block by sub-block: A's and B's (and B2's) 64 k each, one box a load
            for sub in range(self.subs):
                kcs, das, dbs = self.r32(), self.r32(), self.r32()
                self.op(f"add.u32 {kcs}, {kc}, {64 * sub}")
                self.op(f"add.u32 {das}, {da}, {sub * self.a_sub}")
                self.op(f"add.u32 {dbs}, {db}, {sub * self.b_sub}")
                self.op(f"{cp} [{das}], [{gm['a_map']}, {{{kcs}, {row_a}}}], [{full}]")
                self.op(f"{cp} [{dbs}], [{gm['b_map']}, {{{kcs}, {row_b}}}], [{full}]")
                if self.two:
                    db2 = self.r32()
                    self.op(f"add.u32 {db2}, {dbs}, {s.tile_n * 128}")
                    self.op(f"{cp} [{db2}], [{gm['b2_map']}, {{{kcs}, {row_b}}}], [{full}]")
        elif self.cl:
            self.op(f"{cp} [{da}], [{gm['a_map']}, {{{kc}, {row_a}}}], [{full}]")
            # this CTA's half of the B rows lands at the same offsets in both CTAs and signals
            # both CTAs' full barriers (each expects the whole stage)
            self.op(f"mad.lo.u32 {db}, %rank, {s.tile_n // 2 * 128}, {db}")
            mc = f"{cp}.multicast::cluster"
            self.op(f"{mc} [{db}], [{gm['b_map']}, {{{kc}, {row_b}}}], [{full}], {mask}")
            if self.two:
                db2 = self.r32()
                self.op(f"add.u32 {db2}, {db}, {s.tile_n * 128}")
                self.op(f"{mc} [{db2}], [{gm['b2_map']}, {{{kc}, {row_b}}}], [{full}], {mask}")
        else:
            self.op(f"{cp} [{da}], [{gm['a_map']}, {{{kc}, {row_a}}}], [{full}]")
            self.op(f"{cp} [{db}], [{gm['b_map']}, {{{kc}, {row_b}}}], [{full}]")
            if self.two:
                db2 = self.r32()
                self.op(f"add.u32 {db2}, {db}, {s.tile_n * 128}")
                self.op(f"{cp} [{db2}], [{gm['b2_map']}, {{{kc}, {row_b}}}], [{full}]")
        self.producer_next(lab_tile, lab_k, lab_kdone)

    def producer_cp_async(self, lab_exit: str, maps) -> None:
        """The producer warpgroup's 128 threads copy each k-block in 16-byte chunks (cp.async.cg,
        L2 prefetch of 256 bytes) into the 128-byte swizzled layout the TMA would write. Thread t
        takes chunk c = t % 8 (k elements 8c..8c+7 of each 64-k sub-block) of rows r0 + 16 i,
        r0 = t / 8: its destination is swizzle128(r0, c) + 2048 i (rows r0 + 16 i share r0 % 8).
        A chunk past M / N (rows_left <= 16 i) or past K (K - k0 <= 8c) is zero filled
        (ignore-src; its address is not read). After its chunks of a stage, each thread arms the
        stage's full barrier with cp.async.mbarrier.arrive.noinc (the barrier completes when
        all 128 threads' copies have landed). tiling.cp_async_tile models the mapping."""
        s, b = self.s, self.b
        b.comment("producer warpgroup: give registers back, 128 threads issue cp.async chunks")
        self.op(f"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS}")
        # this thread's chunk, first row and swizzled destination offset in every tile
        c, r0, dst = self.r32(), self.r32(), self.r32()
        self.op(f"and.b32 {c}, %tx, 7")
        self.op(f"shr.u32 {r0}, %tx, 3")
        x = self.r32()
        self.op(f"and.b32 {x}, {r0}, 7")
        self.op(f"xor.b32 {x}, {x}, {c}")
        self.op(f"shl.b32 {x}, {x}, 4")
        self.op(f"mad.lo.u32 {dst}, {r0}, 128, {x}")
        c8 = self.r32()
        self.op(f"shl.b32 {c8}, {c}, 3")  # the chunk's first k element within a sub-block
        # row pitch (2 K bytes) and the 16-row step (32 K bytes), 64-bit
        pitch, step = self.r32(), self.r64()
        self.op(f"shl.b32 {pitch}, %K, 1")
        self.op(f"mul.wide.u32 {step}, {pitch}, 16")
        # each operand's address of this thread's chunk in row 0, k 0: base + 16 c
        c16 = self.r64()
        self.op(f"mul.wide.u32 {c16}, {c}, 16")
        bases = []
        for _, tensor, _, _ in maps:
            g = self._ptr(f"src_{tensor}")
            self.op(f"add.u64 {g}, {g}, {c16}")
            bases.append(g)
        lab_tile, lab_k, lab_kdone = b.new_label("ptile"), b.new_label("pk"), b.new_label("pkd")
        lab_pdone = b.new_label("pdone")
        tm, tn = self.producer_tile_loop(lab_tile, lab_pdone)
        # per operand: (address of row r0's chunk at k 0, rows left from row r0 (signed),
        # chunk rows per thread, byte offset of the operand in a stage's sub-block)
        ops_ = []
        b_off = 0
        for (pname, _, rows, _), g in zip(maps, bases, strict=True):
            first, left, ptr, w = self.r32(), self.r32(), self.r64(), self.r64()
            if pname == "a_map":
                self.op(f"mul.lo.u32 {first}, {tm}, {s.tile_m}")
                limit = "%M"
            else:
                self.op(f"mul.lo.u32 {first}, {tn}, {s.tile_n}")
                limit = "%N"
            self.op(f"add.u32 {first}, {first}, {r0}")
            self.op(f"sub.s32 {left}, {limit}, {first}")
            self.op(f"mul.wide.u32 {w}, {first}, {pitch}")
            self.op(f"add.u64 {ptr}, {g}, {w}")
            if pname == "a_map":
                ops_.append((ptr, left, rows // 16, "a", 0))
            else:
                ops_.append((ptr, left, rows // 16, "b", b_off))
                b_off += rows * 128
        self.producer_k_loop(lab_k, lab_kdone)
        full = self.claim_slot()
        kc, kl = self.r32(), self.r32()
        self.op(f"shl.b32 {kc}, %kb, {s.tile_k.bit_length() - 1}")
        self.op(f"sub.s32 {kl}, %K, {kc}")  # k elements left from the k-block's start
        kbytes = self.r64()
        self.op(f"mul.wide.u32 {kbytes}, {kc}, 2")
        da, db = self.r32(), self.r32()
        self.op(f"mad.lo.u32 {da}, %stage, {self.a_bytes}, %base")
        self.op(f"add.u32 {da}, {da}, {dst}")
        self.op(f"mad.lo.u32 {db}, %stage, {self.b_bytes}, %sb")
        self.op(f"add.u32 {db}, {db}, {dst}")
        cp = "cp.async.cg.shared.global.L2::256B"
        for sub in range(self.subs):
            # past K: this chunk of the sub-block (k0 + 64 sub + 8c >= K), for every row
            nok = self.pred()
            if sub:
                kls = self.r32()
                self.op(f"sub.s32 {kls}, {kl}, {64 * sub}")
            else:
                kls = kl
            self.op(f"setp.le.s32 {nok}, {kls}, {c8}")
            for ptr, left, n_i, which, off in ops_:
                dbase = da if which == "a" else db
                sub_bytes = self.a_sub if which == "a" else self.b_sub
                q = self.r64()
                self.op(f"add.u64 {q}, {ptr}, {kbytes}")
                if sub:
                    self.op(f"add.u64 {q}, {q}, {128 * sub}")
                for i in range(n_i):
                    if i:
                        self.op(f"add.u64 {q}, {q}, {step}")
                    ign = self.pred()
                    self.op(f"setp.le.or.s32 {ign}, {left}, {16 * i}, {nok}")
                    d_off = sub * sub_bytes + off + 2048 * i
                    self.op(f"{cp} [{dbase}+{d_off}], [{q}], 16, {ign}")
        self.op(f"cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{full}]")
        self.producer_next(lab_tile, lab_k, lab_kdone)
        b.label(lab_pdone)
        # no thread leaves with copies in flight
        self.op("cp.async.wait_all")
        self.op(f"bra {lab_exit}")

    # ---- consumers -----------------------------------------------------------------------
    def release(self, eaddr: str, pred: str) -> None:
        """Lane 0 of each consumer warp frees a ring slot: its empty barrier here and, with a
        cluster, the peer CTA's (the peer's producer multicasts into this CTA's slot too)."""
        self.op(f"@{pred} mbarrier.arrive.shared::cta.b64 _, [{eaddr}]")
        if self.cl:
            peer, remote = self.r32(), self.r32()
            self.op(f"xor.b32 {peer}, %rank, 1")
            self.op(f"mapa.shared::cluster.u32 {remote}, {eaddr}, {peer}")
            self.op(f"@{pred} mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{remote}]")

    def wgmma(self, acc: str, n: int, da: str, db: str, scale: str) -> None:
        regs = ", ".join(f"{acc}{i}" for i in range(self.n_acc))
        t = WGMMA_TYPE[self.ir.a.dtype]
        self.op(
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{regs}}}, {da}, {db}, "
            f"{scale}, 1, 1, 0, 0"
        )

    def consumer(self, creg: int) -> None:
        s, b = self.s, self.b
        b.comment("consumer warpgroups: take registers, wgmma over the ring, epilogue")
        self.op(f"setmaxnreg.inc.sync.aligned.u32 {creg}")
        cons, warp, lane, plane0 = self.consumer_lanes()
        # descriptor of this consumer's rows of A in stage 0, and of B in stage 0
        a0, b0 = self.r32(), self.r32()
        if self.pp:
            self.op(f"mov.u32 {a0}, %base")
        else:
            self.op(f"mad.lo.u32 {a0}, {cons}, {64 * 128}, %base")
        self.op(f"shr.u32 {a0}, {a0}, 4")
        self.op(f"shr.u32 {b0}, %sb, 4")
        desc_a0, desc_b0 = self.desc(a0), self.desc(b0)
        # this thread's place in the accumulator fragment
        frag_row, frag_col = self.r32(), self.r32()
        self.op(f"shr.u32 {frag_row}, {lane}, 2")
        self.op(f"mad.lo.u32 {frag_row}, {warp}, 16, {frag_row}")
        if not self.pp:
            self.op(f"mad.lo.u32 {frag_row}, {cons}, 64, {frag_row}")
        self.op(f"and.b32 {frag_col}, {lane}, 3")
        self.op(f"shl.b32 {frag_col}, {frag_col}, 1")

        lab_tile, lab_k, lab_kdone = b.new_label("ctile"), b.new_label("ck"), b.new_label("ckd")
        lab_done = b.new_label("cdone")
        if self.pp:
            # named barriers 1 and 2: "consumer 0 / 1 may start its main loop"
            bar_self, bar_other = self.r32(), self.r32()
            self.op(f"add.u32 {bar_self}, {cons}, 1")
            self.op(f"sub.u32 {bar_other}, 2, {cons}")
            # consumer c takes the CTA's tiles c, c + 2, ...: tile ctaid + ci * nctaid
            self.op(f"mov.u32 %ci, {cons}")
            self.op("mad.lo.u32 %tile, %ci, %ncta, %cta")
        else:
            self.op("mov.u32 %tile, %cta")
        pt = self.pred()
        b.label(lab_tile)
        self.op(f"setp.ge.u32 {pt}, %tile, %tiles")
        self.op(f"@{pt} bra {lab_done}")
        tm, tn = self.tile_coords("%tile")
        if self.pp:
            # the ring position of this tile's first k-block: ci * nk (the other consumer's
            # tiles fill the positions in between)
            it, ph = self.r32(), self.r32()
            self.op(f"mul.lo.u32 {it}, %ci, %nk")
            self.op(f"rem.u32 %stage, {it}, {s.stages}")
            self.op(f"div.u32 {ph}, {it}, {s.stages}")
            self.op(f"and.b32 %phase, {ph}, 1")
            # Main loops take turns: wait until the other consumer has waited on its tile's last
            # k-block. A parity wait only tells the last two phases of a barrier apart, so a
            # consumer must not wait on a slot more than one ring pass ahead of its fills;
            # after the other's main loop every earlier position has been filled once.
            pfirst_tile = self.pred()
            self.op(f"setp.ne.u32 {pfirst_tile}, %ci, 0")
            self.op(f"@{pfirst_tile} bar.sync {bar_self}, 256")
        self.op("mov.u32 %kb, %kb0")
        prev = self.r32()  # byte offset of the previous k-block's empty barrier
        b.label(lab_k)
        pk = self.pred()
        self.op(f"setp.ge.u32 {pk}, %kb, %kb1")
        self.op(f"@{pk} bra {lab_kdone}")
        off, full = self.r32(), self.r32()
        self.op(f"shl.b32 {off}, %stage, 3")
        self.op(f"add.u32 {full}, %full, {off}")
        self.wait(full, "%phase")
        if self.cpa:
            # the cp.async chunks are generic-proxy writes, acquired through the full barrier;
            # wgmma reads shared memory through the async proxy
            self.op("fence.proxy.async.shared::cta")
        # descriptors of this stage: stage * bytes / 16 added to the start address field
        sa, sbb = self.r64(), self.r64()
        t32 = self.r32()
        self.op(f"mul.lo.u32 {t32}, %stage, {self.a_bytes // 16}")
        self.op(f"cvt.u64.u32 {sa}, {t32}")
        self.op(f"add.u64 {sa}, {sa}, {desc_a0}")
        t32b = self.r32()
        self.op(f"mul.lo.u32 {t32b}, %stage, {self.b_bytes // 16}")
        self.op(f"cvt.u64.u32 {sbb}, {t32b}")
        self.op(f"add.u64 {sbb}, {sbb}, {desc_b0}")
        pacc, pone = self.pred(), self.pred()
        self.op(f"setp.ne.u32 {pacc}, %kb, %kb0")
        self.op(f"setp.eq.u32 {pone}, %kb, %kb")
        self.op("wgmma.fence.sync.aligned")
        for kk in range(4 * self.subs):
            # k16 step kk: sub-block kk / 4, 32 bytes per step inside its swizzle row
            sub, k4 = divmod(kk, 4)
            da, db = self.r64(), self.r64()
            self.op(f"add.u64 {da}, {sa}, {sub * self.a_sub // 16 + 2 * k4}")
            self.op(f"add.u64 {db}, {sbb}, {sub * self.b_sub // 16 + 2 * k4}")
            scale = pacc if kk == 0 else pone
            self.wgmma("%ca", s.tile_n, da, db, scale)
            if self.pp:
                # rows 64-127 of the tile: 64 rows x 128 bytes further into the A stage
                da2 = self.r64()
                self.op(f"add.u64 {da2}, {da}, {64 * 128 // 16}")
                self.wgmma("%cb", s.tile_n, da2, db, scale)
            if self.two:
                db2 = self.r64()
                self.op(f"add.u64 {db2}, {db}, {s.tile_n * 128 // 16}")
                self.wgmma("%cb", s.tile_n, da, db2, scale)
        self.op("wgmma.commit_group.sync.aligned")
        # at most one group in flight: the previous k-block's wgmmas are done, free its slot
        self.op("wgmma.wait_group.sync.aligned 1")
        pfirst = self.pred()
        self.op(f"setp.ne.u32 {pfirst}, %kb, %kb0")
        pr = self.pred()
        self.op(f"and.pred {pr}, {pfirst}, {plane0}")
        eaddr = self.r32()
        self.op(f"add.u32 {eaddr}, %empty, {prev}")
        self.release(eaddr, pr)
        self.op(f"mov.u32 {prev}, {off}")
        self.advance()
        self.op("add.u32 %kb, %kb, 1")
        self.op(f"bra {lab_k}")
        b.label(lab_kdone)
        if self.pp:
            # 128 threads arrive, the other consumer's 128 wait: its main loop may start
            self.op(f"bar.arrive {bar_other}, 256")
        if self.sk > 1:
            self.split_k_epilogue(tm, tn, frag_row, frag_col, prev, plane0)
        else:
            self.op("wgmma.wait_group.sync.aligned 0")
            eaddr2 = self.r32()
            self.op(f"add.u32 {eaddr2}, %empty, {prev}")
            self.release(eaddr2, plane0)
            self.epilogue(tm, tn, frag_row, frag_col)
        if self.pp:
            self.op("add.u32 %ci, %ci, 2")
            self.op("mad.lo.u32 %tile, %ci, %ncta, %cta")
        elif self.sk > 1:
            # split-K: one tile per cluster (the grid has one cluster per tile), so no loop back.
            # Without the back edge ptxas sees no wgmma after the reduction writes the
            # accumulators; with it, it serialises every wgmma of the main loop (C7515).
            self.op(f"bra {lab_done}")
        else:
            self.op("add.u32 %tile, %tile, %ncta")
        if self.sk == 1:
            self.op(f"bra {lab_tile}")
        b.label(lab_done)
        if self.ts_slots:
            # the staging buffers stay allocated until the last box stores are done
            self.op(f"@{self._issuer()} cp.async.bulk.wait_group 0")

    # ---- split-K -------------------------------------------------------------------------
    def split_k_epilogue(
        self, tm: str, tn: str, frag_row: str, frag_col: str, prev: str, plane0: str
    ) -> None:
        """The end of a split-K tile. Each CTA of the cluster holds the fp32 partial of its part
        of K; the partials go to shared memory (the ring, idle now: one tile per CTA, every load
        consumed), a cluster barrier, then rank r reads the r-th share of the tile's column
        blocks from every CTA (distributed shared memory), sums them in rank order 0, 1, ...
        (the same order whichever CTA finishes first: the result is deterministic), and runs
        the epilogue on that share. A second cluster barrier keeps every CTA's shared memory
        alive until all have read it. Layout of a partial, per accumulator register group g of
        4 registers (column block j = g) and consumer thread t: 16 bytes at
        ((acc * J + g) * T + t) * 16, J = tile_n / 8 blocks, T = consumer threads (tiling.
        splitk_partial_offset)."""
        s, b = self.s, self.b
        sk = self.sk
        nthreads = 128 * s.consumers
        accs = ["%ca"] + (["%cb"] if self.two else [])
        J = s.tile_n // 8
        b.comment(f"split-K: {sk} partial tiles summed through distributed shared memory")
        pe = self.pred()
        lab_zero, lab_red = b.new_label("skzero"), b.new_label("skred")
        # every wgmma done before any branch: on a path where the accumulators are written by
        # other instructions while wgmmas may be in flight, ptxas serialises every wgmma (C7515)
        self.op("wgmma.wait_group.sync.aligned 0")
        self.op(f"setp.eq.u32 {pe}, %kb0, %kb1")
        self.op(f"@{pe} bra {lab_zero}")
        eaddr2 = self.r32()
        self.op(f"add.u32 {eaddr2}, %empty, {prev}")
        self.release(eaddr2, plane0)
        self.op(f"bra {lab_red}")
        b.label(lab_zero)
        # no k-block in this part (nk < split_k): a zero partial
        for acc in accs:
            for i in range(self.n_acc):
                self.op(f"mov.f32 {acc}{i}, 0f00000000")
        b.label(lab_red)
        # every consumer warpgroup of this CTA is done with the ring (its wgmma reads, by the
        # async proxy, ordered before these generic writes) before it is overwritten
        self.op("fence.proxy.async.shared::cta")
        self.op(f"bar.sync 1, {nthreads}")
        ctid, mine = self.r32(), self.r32()
        self.op("sub.u32 " + ctid + ", %tx, 128")
        self.op(f"mad.lo.u32 {mine}, {ctid}, 16, %base")
        for a, acc in enumerate(accs):
            for g in range(J):
                off = (a * J + g) * nthreads * 16
                regs = ", ".join(f"{acc}{4 * g + e}" for e in range(4))
                self.op(f"st.shared.v4.f32 [{mine}+{off}], {{{regs}}}")
        self.op("barrier.cluster.arrive.release")
        self.op("barrier.cluster.wait.acquire")
        lab_after = b.new_label("skdone")
        for q in range(sk):
            js = range(q * J // sk, (q + 1) * J // sk)
            lab_next = b.new_label("sknext")
            pq = self.pred()
            self.op(f"setp.ne.u32 {pq}, %rank, {q}")
            self.op(f"@{pq} bra {lab_next}")
            # the share's partials of CTA r at its address of this thread's first group
            remote = []
            for r in range(sk):
                ra = self.r32()
                self.op(f"mapa.shared::cluster.u32 {ra}, {mine}, {r}")
                remote.append(ra)
            for a, acc in enumerate(accs):
                for g in js:
                    off = (a * J + g) * nthreads * 16
                    tot = [f"{acc}{4 * g + e}" for e in range(4)]
                    self.op(f"ld.shared::cluster.v4.f32 {{{', '.join(tot)}}}, [{remote[0]}+{off}]")
                    for r in range(1, sk):
                        part = [b.reg("f32") for _ in range(4)]
                        self.op(
                            f"ld.shared::cluster.v4.f32 {{{', '.join(part)}}}, [{remote[r]}+{off}]"
                        )
                        for e in range(4):
                            self.op(f"add.rn.f32 {tot[e]}, {tot[e]}, {part[e]}")
            self.epilogue(tm, tn, frag_row, frag_col, js)
            self.op(f"bra {lab_after}")
            b.label(lab_next)
        b.label(lab_after)

    # ---- epilogue ------------------------------------------------------------------------
    def epilogue(self, tm: str, tn: str, frag_row: str, frag_col: str, js=None) -> None:
        """The fused epilogue of the accumulators' column blocks `js` (8 columns each; all of
        the tile's when None). Staged (tma_store) with the fallback (self.ts_fallback): through
        shared memory and the output's tensor map where the output's rows are a multiple of 16
        bytes (N % 8 == 0 for a 16-bit output, N % 16 == 0 for fp8), else from registers as
        without staging (the map, padded to encode at any N, is not exact there)."""
        if not self.ts_fallback:
            self._epilogue(tm, tn, frag_row, frag_col, js)
            return
        b = self.b
        lab_reg, lab_done = b.new_label("ereg"), b.new_label("edone")
        nmod, pok = self.r32(), self.pred()
        self.op(f"and.b32 {nmod}, %N, {16 // self.ts_elem - 1}")
        self.op(f"setp.ne.u32 {pok}, {nmod}, 0")
        self.op(f"@{pok} bra {lab_reg}")
        self._epilogue(tm, tn, frag_row, frag_col, js)
        self.op(f"bra {lab_done}")
        b.label(lab_reg)
        b.comment("output rows not a multiple of 16 bytes: the epilogue stores from registers")
        slots, self.ts_slots = self.ts_slots, 0
        try:
            self._epilogue(tm, tn, frag_row, frag_col, js)
        finally:
            self.ts_slots = slots
        b.label(lab_done)

    def _epilogue(self, tm: str, tn: str, frag_row: str, frag_col: str, js=None) -> None:
        s, b = self.s, self.b
        b.comment("epilogue: rows row0 (+8), columns col0 + 8j (+1) of the accumulators")
        if self.ts_slots:
            self._staging_setup(tm, tn)
        row0, col0 = self.r32(), self.r32()
        self.op(f"mad.lo.u32 {row0}, {tm}, {s.tile_m}, {frag_row}")
        self.op(f"mad.lo.u32 {col0}, {tn}, {s.tile_n}, {frag_col}")
        # whole tile inside and N even: pair accesses without predicates
        end_m, end_n = self.r32(), self.r32()
        self.op(f"add.u32 {end_m}, {tm}, 1")
        self.op(f"mul.lo.u32 {end_m}, {end_m}, {s.tile_m}")
        self.op(f"add.u32 {end_n}, {tn}, 1")
        self.op(f"mul.lo.u32 {end_n}, {end_n}, {s.tile_n}")
        nodd = self.r32()
        self.op(f"and.b32 {nodd}, %N, 1")
        pin = self.pred()
        self.op(f"setp.le.u32 {pin}, {end_m}, %M")
        self.op(f"setp.le.and.u32 {pin}, {end_n}, %N, {pin}")
        self.op(f"setp.eq.and.u32 {pin}, {nodd}, 0, {pin}")
        lab_slow, lab_end = b.new_label("eslow"), b.new_label("eend")
        # (first row, accumulator of A @ B, accumulator of A @ B2) of each 64-row block
        if self.pp:
            r64 = self.r32()
            self.op(f"add.u32 {r64}, {row0}, 64")
            blocks = [(row0, "%ca", None), (r64, "%cb", None)]
        else:
            blocks = [(row0, "%ca", "%cb" if self.two else None)]
        self.op(f"@!{pin} bra {lab_slow}")
        for r, ca, cb in blocks:
            self.epilogue_body(r, col0, True, ca, cb, js)
        self.op(f"bra {lab_end}")
        b.label(lab_slow)
        for r, ca, cb in blocks:
            self.epilogue_body(r, col0, False, ca, cb, js)
        b.label(lab_end)

    def _elem_addr(self, base: str, row: str, col: str, size: int) -> str:
        """base + (row * N + col) * size (64-bit)."""
        idx = self.r64()
        self.op(f"mul.wide.u32 {idx}, {row}, %N")
        c = self.r64()
        self.op(f"cvt.u64.u32 {c}, {col}")
        self.op(f"add.u64 {idx}, {idx}, {c}")
        a = self.r64()
        self.op(f"mad.lo.u64 {a}, {idx}, {size}, {base}")
        return a

    def epilogue_body(
        self,
        row0: str,
        col0: str,
        fast: bool,
        acc_a: str = "%ca",
        acc_b: str | None = None,
        js=None,
    ) -> None:
        s, b, ir = self.s, self.b, self.ir
        ev = _Epilogue(b, ir, s.fast_math and all(o.dtype != "fp32" for o in ir.outputs))
        out_ptr = {o.name: self._ptr(f"out_{o.name}") for o in ir.outputs if not self.ts_slots}
        in_ptr = {i.name: self._ptr(f"in_{i.name}") for i in ir.inputs}
        rows = [row0]
        r8 = self.r32()
        self.op(f"add.u32 {r8}, {row0}, 8")
        rows.append(r8)
        prow = []
        if not fast:
            for r in rows:
                p = self.pred()
                self.op(f"setp.lt.u32 {p}, {r}, %M")
                prow.append(p)
        # per-tile values: scalars and per-row inputs (2 rows per thread)
        scal: dict[str, list[str]] = {}
        for i in ir.inputs:
            if i.role == "scalar":
                scal[i.name] = [self._load1(i.dtype, in_ptr[i.name], None)] * 2
            elif i.role == "row":
                vals = []
                for h, r in enumerate(rows):
                    if ir.batch:
                        rb = self.r32()
                        self.op(f"rem.u32 {rb}, {r}, %Mb")
                        r = rb
                    r64 = self.r64()
                    self.op(f"cvt.u64.u32 {r64}, {r}")
                    a = self.r64()
                    self.op(f"mad.lo.u64 {a}, {r64}, {DTYPE_BYTES[i.dtype]}, {in_ptr[i.name]}")
                    vals.append(self._load1(i.dtype, a, None if fast else prow[h]))
                scal[i.name] = vals
        # row base addresses of the outputs and "full" inputs
        full_in = [i for i in ir.inputs if i.role == "full"]
        rowaddr: dict[tuple[str, int], str] = {}
        for h, r in enumerate(rows):
            for o in ir.outputs if not self.ts_slots else ():  # staged: stored by the TMA
                rowaddr[(o.name, h)] = self._elem_addr(
                    out_ptr[o.name], r, col0, DTYPE_BYTES[o.dtype]
                )
            for i in full_in:
                rowaddr[(i.name, h)] = self._elem_addr(
                    in_ptr[i.name], r, col0, DTYPE_BYTES[i.dtype]
                )
        grouped = [o for o in ir.outputs if o.group_scale]
        colbase = {}
        for i in ir.inputs:
            if i.role == "col":
                c = self.r64()
                self.op(f"cvt.u64.u32 {c}, {col0}")
                a = self.r64()
                self.op(f"mad.lo.u64 {a}, {c}, {DTYPE_BYTES[i.dtype]}, {in_ptr[i.name]}")
                colbase[i.name] = a

        last_pcol: list[str] = []  # the column predicates of the last compute (tails)
        left_n = self.r32()
        if not fast:
            self.op(f"sub.u32 {left_n}, %N, {col0}")

        def compute(j: int):
            """The outputs' values at column block j: {(name, h): [v0, v1]} and the store
            predicates of each h (None for a whole tile)."""
            pcol = []
            if not fast:
                # column col0 + 8j + e < N as N - col0 > 8j + e (signed: a tile's column may
                # lie past N), one register for the whole tile
                for e in range(2):
                    p = self.pred()
                    self.op(f"setp.gt.s32 {p}, {left_n}, {8 * j + e}")
                    pcol.append(p)
            colv = {}
            for i in ir.inputs:
                if i.role == "col":
                    colv[i.name] = self._load_pair(
                        i.dtype, colbase[i.name], 8 * j * DTYPE_BYTES[i.dtype], fast, pcol
                    )
            results: dict[tuple[str, int], list[str]] = {}
            hpreds = []
            for h in range(2):
                preds = None
                if not fast:
                    preds = []
                    for e in range(2):
                        p = self.pred()
                        # row < M evaluated again here rather than kept live in a predicate
                        self.op(f"setp.lt.and.u32 {p}, {rows[h]}, %M, {pcol[e]}")
                        preds.append(p)
                hpreds.append(preds)
                fullv = {}
                for i in full_in:
                    fullv[i.name] = self._load_pair(
                        i.dtype, rowaddr[(i.name, h)], 8 * j * DTYPE_BYTES[i.dtype], fast, preds
                    )
                for o in ir.outputs:
                    results[(o.name, h)] = []
                for e in range(2):
                    idx = 4 * j + 2 * h + e
                    env = {ACC: f"{acc_a}{idx}"}
                    if acc_b:
                        env[ACC2] = f"{acc_b}{idx}"
                    for name, v in scal.items():
                        env[name] = v[h]
                    for name, v in colv.items():
                        env[name] = v[e]
                    for name, v in fullv.items():
                        env[name] = v[e]
                    memo: dict = {}
                    for o in ir.outputs:
                        results[(o.name, h)].append(ev.value(o.expr, env, memo))
            last_pcol[:] = pcol
            return results, hpreds

        def store(j: int, results, hpreds, inv=None) -> None:
            for h in range(2):
                for o in ir.outputs:
                    vals = results[(o.name, h)]
                    if o.group_scale:
                        q = []
                        for v in vals:
                            r = b.reg("f32")
                            self.op(f"mul.rn.f32 {r}, {v}, {inv[(o.name, h)]}")
                            q.append(r)
                        vals = q
                    self._store_pair(
                        o.dtype,
                        rowaddr[(o.name, h)],
                        8 * j * DTYPE_BYTES[o.dtype],
                        vals,
                        fast,
                        hpreds[h],
                    )

        blocks = list(range(s.tile_n // 8) if js is None else js)
        bpb = self.ts_blocks
        if self.ts_slots and not grouped:
            # boxes of 128 bytes a row (bpb column blocks) through the staging slots
            for j in blocks:
                if j % bpb == 0:
                    self._box_begin(j // bpb)
                self._stage_store(j, compute(j)[0])
                if j % bpb == bpb - 1:
                    self._box_end(j // bpb)
            return
        if not grouped:
            for j in blocks:
                store(j, *compute(j))
            return
        # group-scaled outputs, one 128-column group at a time: the values once for the group's
        # amax (kept in no register: only the running maximum), the scale, then the values
        # again, quantised and stored (recomputing is cheaper than 64 more live registers)
        per = SCALE_GROUP // 8
        for g0 in range(0, len(blocks), per):
            group = blocks[g0 : g0 + per]
            amax = {}
            for o in grouped:
                for h in (0, 1):
                    amax[(o.name, h)] = b.reg("f32")
                    self.op(f"mov.f32 {amax[(o.name, h)]}, 0f00000000")
            for j in group:
                results, hpreds = compute(j)
                for o in grouped:
                    for h in (0, 1):
                        for e, v in enumerate(results[(o.name, h)]):
                            a = b.reg("f32")
                            self.op(f"abs.f32 {a}, {v}")
                            if last_pcol:  # columns past N (a row past M stores nothing)
                                self.op(f"selp.f32 {a}, {a}, 0f00000000, {last_pcol[e]}")
                            self.op(f"max.f32 {amax[(o.name, h)]}, {amax[(o.name, h)]}, {a}")
            inv = {}
            for o in grouped:
                for h in (0, 1):
                    inv[(o.name, h)] = self._group_scale(
                        amax[(o.name, h)],
                        o.group_scale,
                        rows[h],
                        group[0],
                        not fast,
                        col0,
                    )
            if self.ts_slots:
                # staged: the group's 128 fp8 columns are one box
                self._box_begin(group[0] // bpb)
                for j in group:
                    results = compute(j)[0]
                    for o in grouped:
                        for h in (0, 1):
                            q = []
                            for v in results[(o.name, h)]:
                                r = b.reg("f32")
                                self.op(f"mul.rn.f32 {r}, {v}, {inv[(o.name, h)]}")
                                q.append(r)
                            results[(o.name, h)] = q
                    self._stage_store(j, results)
                self._box_end(group[0] // bpb)
                continue
            for j in group:
                store(j, *compute(j), inv)

    # ---- TMA-store epilogue ------------------------------------------------------------------
    def _issuer(self) -> str:
        """A predicate: this thread is the first of its consumer warpgroup (it waits on and
        issues the warpgroup's box stores; bulk async-groups belong to the issuing thread)."""
        t, p = self.r32(), self.pred()
        self.op(f"and.b32 {t}, %tx, 127")
        self.op(f"setp.eq.u32 {p}, {t}, 0")
        return p

    def _staging_setup(self, tm: str, tn: str) -> None:
        """Registers of one tile's staged epilogue: this thread's byte address of its first row
        in slot 0 (rows 16 warp + lane / 4 and + 8 of its warpgroup's 64, bytes 4 (lane % 4)),
        the swizzle's XOR term (lane / 4 = row % 8, times 16), the warpgroup's staging base, its
        named barrier (3 + consumer) and the box coordinates (tile column, first row)."""
        s = self.s
        ct, cons, lt, warp, lane = self.r32(), self.r32(), self.r32(), self.r32(), self.r32()
        self.op(f"sub.u32 {ct}, %tx, 128")
        self.op(f"shr.u32 {cons}, {ct}, 7")
        self.op(f"and.b32 {lt}, {ct}, 127")
        self.op(f"shr.u32 {warp}, {lt}, 5")
        self.op(f"and.b32 {lane}, {lt}, 31")
        buf = self.r32()
        self.op(f"mad.lo.u32 {buf}, {cons}, {self.ts_slots * 8192}, %epi")
        quad, x16, base = self.r32(), self.r32(), self.r32()
        self.op(f"shr.u32 {quad}, {lane}, 2")
        self.op(f"shl.b32 {x16}, {quad}, 4")
        self.op(f"mad.lo.u32 {quad}, {warp}, 16, {quad}")  # row within the warpgroup's 64
        self.op(f"mad.lo.u32 {base}, {quad}, 128, {buf}")
        q4 = self.r32()
        self.op(f"and.b32 {q4}, {lane}, 3")
        self.op(f"mad.lo.u32 {base}, {q4}, {2 * self.ts_elem}, {base}")
        barid = self.r32()
        self.op(f"add.u32 {barid}, {cons}, 3")
        col, row = self.r32(), self.r32()
        # the tile's first column in the map's 16-bit elements (an fp8 output: bytes / 2)
        self.op(f"mul.lo.u32 {col}, {tn}, {s.tile_n * self.ts_elem // 2}")
        self.op(f"mul.lo.u32 {row}, {tm}, {s.tile_m}")
        self.op(f"mad.lo.u32 {row}, {cons}, 64, {row}")
        cm0, cm1 = self.r64(), self.r64()
        self.op(f"mov.u64 {cm0}, c_map")
        self.op(f"cvta.param.u64 {cm1}, {cm0}")
        self._st = {"base": base, "x16": x16, "buf": buf, "bar": barid, "col": col, "row": row,
                    "map": cm1}  # fmt: skip

    def _box_begin(self, q: int) -> None:
        """Before writing box q: its slot's previous box store has read it (at most slots - 1
        of this thread's stores still pending), and the warpgroup knows it."""
        st = self._st
        self.op(f"@{self._issuer()} cp.async.bulk.wait_group.read {self.ts_slots - 1}")
        self.op(f"bar.sync {st['bar']}, 128")

    def _stage_store(self, j: int, results) -> None:
        """This thread's two column pairs of column block j (rows h = 0, 1) into the staging
        slot of its box, at the swizzled offset (tiling.staged_offset): 16-bit pairs (4 bytes,
        chunk j % 8 of the box row) or e4m3 pairs (2 bytes, chunk (j % 16) / 2, bytes 8 (j % 2)
        on)."""
        st, o = self._st, self.ir.outputs[0]
        bpb = self.ts_blocks
        slot = (j // bpb) % self.ts_slots
        jj = j % bpb
        chunk, within = (jj, 0) if self.ts_elem == 2 else (jj // 2, 8 * (jj % 2))
        t, a = self.r32(), self.r32()
        self.op(f"xor.b32 {t}, {st['x16']}, {chunk * 16}")
        self.op(f"add.u32 {a}, {st['base']}, {t}")
        for h in range(2):
            vals = results[(o.name, h)]
            off = slot * 8192 + h * 1024 + within
            if self.ts_elem == 1:
                pair = self.b.reg("b16")
                # e4m3x2: the first source goes to the upper byte, so column col+1 is high
                self.op(f"cvt.rn.satfinite.e4m3x2.f32 {pair}, {vals[1]}, {vals[0]}")
                self.op(f"st.shared.b16 [{a}+{off}], {pair}")
                continue
            cvt = "bf16x2" if o.dtype == "bf16" else "f16x2"
            w = self.r32()
            # the upper half takes the first operand: column col+1 goes high (little endian)
            self.op(f"cvt.rn.{cvt}.f32 {w}, {vals[1]}, {vals[0]}")
            self.op(f"st.shared.b32 [{a}+{off}], {w}")

    def _box_end(self, q: int) -> None:
        """After writing box q: every thread's writes made visible to the async proxy, a named
        barrier, then the first thread stores the box (clipped to the output by the TMA)."""
        st = self._st
        slot = q % self.ts_slots
        self.op("fence.proxy.async.shared::cta")
        self.op(f"bar.sync {st['bar']}, 128")
        c, src = self.r32(), self.r32()
        self.op(f"add.u32 {c}, {st['col']}, {64 * q}")
        self.op(f"add.u32 {src}, {st['buf']}, {slot * 8192}")
        p = self._issuer()
        self.op(
            f"@{p} cp.async.bulk.tensor.2d.global.shared::cta.bulk_group "
            f"[{st['map']}, {{{c}, {st['row']}}}], [{src}]"
        )
        self.op(f"@{p} cp.async.bulk.commit_group")

    def _group_scale(self, amax, scales, row, j0, tail, col0) -> str:
        """The scale amax / 448 of one row's 128-column group, from this thread's maximum
        and the 3 other lanes of its quad (they hold the row's other columns); lane % 4 == 0
        stores it in `scales` [rows, ceil(N / 128)] at (row, (col0 >> 7) + j0 / 16) (tiling.
        scale_group). Returns 448 / amax (0 for an all-zero group) to quantise with."""
        b = self.b
        ngrp, grp = self.r32(), self.r32()
        self.op(f"add.u32 {ngrp}, %N, {SCALE_GROUP - 1}")
        self.op(f"shr.u32 {ngrp}, {ngrp}, 7")
        self.op(f"shr.u32 {grp}, {col0}, 7")
        self.op(f"add.u32 {grp}, {grp}, {j0 // (SCALE_GROUP // 8)}")
        idx, g64 = self.r64(), self.r64()
        self.op(f"mul.wide.u32 {idx}, {row}, {ngrp}")
        self.op(f"cvt.u64.u32 {g64}, {grp}")
        self.op(f"add.u64 {idx}, {idx}, {g64}")
        scale_addr = self.r64()
        self.op(f"mad.lo.u64 {scale_addr}, {idx}, 4, {self._ptr(f'out_{scales}')}")
        for lanes in (1, 2):
            other = b.reg("f32")
            self.op(f"shfl.sync.bfly.b32 {other}, {amax}, {lanes}, 31, -1")
            self.op(f"max.f32 {amax}, {amax}, {other}")
        scale, inv = b.reg("f32"), b.reg("f32")
        # amax times 1/448 rounded, and 448 times rcp.approx (1 ulp): div.rn is a call to a
        # subroutine, and any call in the kernel makes ptxas serialise every wgmma of the main
        # loop (C7509)
        self.op(f"mul.rn.f32 {scale}, {amax}, {b.const_f32(1.0 / 448.0)}")
        self.op(f"rcp.approx.f32 {inv}, {amax}")
        self.op(f"mul.rn.f32 {inv}, {inv}, {b.const_f32(448.0)}")
        pz = self.pred()
        self.op(f"setp.gt.f32 {pz}, {amax}, 0f00000000")
        self.op(f"selp.f32 {inv}, {inv}, 0f00000000, {pz}")
        # the quad's lead lane (col0 % 8 == 0) stores; predicates evaluated here rather than
        # kept live through the group's values (the tail path is short of registers)
        fc, pst = self.r32(), self.pred()
        self.op(f"and.b32 {fc}, {col0}, 7")
        self.op(f"setp.eq.u32 {pst}, {fc}, 0")
        if tail:
            # a tail tile: the row below M and the group's first column (col0 + 8 j0 in the
            # quad's lead lane) below N
            self.op(f"setp.lt.and.u32 {pst}, {row}, %M, {pst}")
            gc = self.r32()
            self.op(f"add.u32 {gc}, {col0}, {8 * j0}")
            self.op(f"setp.lt.and.u32 {pst}, {gc}, %N, {pst}")
        self.op(f"@{pst} st.global.f32 [{scale_addr}], {scale}")
        return inv

    def _load1(self, dtype: str, addr: str, pred: str | None) -> str:
        b = self.b
        if dtype == "fp32":
            f = b.reg("f32")
            if pred:
                self.op(f"mov.f32 {f}, 0f00000000")
            self.op(f"{'@' + pred + ' ' if pred else ''}ld.global.nc.f32 {f}, [{addr}]")
            return f
        h = b.reg("b16")
        if pred:
            self.op(f"mov.b16 {h}, 0")
        self.op(f"{'@' + pred + ' ' if pred else ''}ld.global.nc.b16 {h}, [{addr}]")
        return _cvt_in(b, dtype, h, pair=False)[0]

    def _load_pair(self, dtype: str, base: str, off: int, fast: bool, preds) -> list[str]:
        b = self.b
        if fast:
            if dtype == "fp32":
                f0, f1 = b.reg("f32"), b.reg("f32")
                self.op(f"ld.global.nc.v2.f32 {{{f0}, {f1}}}, [{base}+{off}]")
                return [f0, f1]
            w = self.r32()
            self.op(f"ld.global.nc.b32 {w}, [{base}+{off}]")
            return _cvt_in(b, dtype, w, pair=True)
        size = DTYPE_BYTES[dtype]
        out = []
        for e in range(2):
            a = self.r64()
            self.op(f"add.u64 {a}, {base}, {off + e * size}")
            out.append(self._load1(dtype, a, preds[e]))
        return out

    def _store_pair(
        self, dtype: str, base: str, off: int, vals: list[str], fast: bool, preds
    ) -> None:
        b = self.b
        if dtype == "fp8e4m3":
            # e4m3x2: the first source goes to the upper byte, so column col+1 is high
            pair = b.reg("b16")
            if fast:
                self.op(f"cvt.rn.satfinite.e4m3x2.f32 {pair}, {vals[1]}, {vals[0]}")
                self.op(f"st.global.b16 [{base}+{off}], {pair}")
                return
            for e in range(2):
                one, w = b.reg("b16"), b.reg("b32")
                self.op(f"cvt.rn.satfinite.e4m3x2.f32 {one}, {b.const_f32(0.0)}, {vals[e]}")
                self.op(f"cvt.u32.u16 {w}, {one}")
                self.op(f"@{preds[e]} st.global.b8 [{base}+{off + e}], {w}")
            return
        if fast:
            if dtype == "fp32":
                self.op(f"st.global.v2.f32 [{base}+{off}], {{{vals[0]}, {vals[1]}}}")
                return
            w = self.r32()
            cvt = "bf16x2" if dtype == "bf16" else "f16x2"
            # the upper half takes the first operand: column col+1 goes high (little endian)
            self.op(f"cvt.rn.{cvt}.f32 {w}, {vals[1]}, {vals[0]}")
            self.op(f"st.global.b32 [{base}+{off}], {w}")
            return
        size = DTYPE_BYTES[dtype]
        for e in range(2):
            if dtype == "fp32":
                self.op(f"@{preds[e]} st.global.f32 [{base}+{off + e * size}], {vals[e]}")
            else:
                h = b.reg("b16")
                cvt = "bf16" if dtype == "bf16" else "f16"
                self.op(f"cvt.rn.{cvt}.f32 {h}, {vals[e]}")
                self.op(f"@{preds[e]} st.global.b16 [{base}+{off + e * size}], {h}")
