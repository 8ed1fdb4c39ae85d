"""GemmSchedule: how the matmul emitter tiles and pipelines one GemmIR, and the one validity check.

The "wgmma" kind (Hopper, sm_90a): a CTA of (1 + consumers) warpgroups. Warpgroup 0 is the
producer: one thread issues the tensor-memory-accelerator (TMA) loads of A and B tiles into a ring
of `stages` shared-memory buffers, each completing on a "full" mbarrier. Each consumer warpgroup
owns tile_m / consumers rows of the CTA's output tile, runs `wgmma.mma_async` m64nNk16 on the
shared-memory tiles (128-byte swizzle), releases each buffer on its "empty" mbarrier and applies
the epilogue from registers. With `persistent`, the grid is at most one CTA per SM and each CTA
walks output tiles blockIdx.x, blockIdx.x + gridDim.x, ... in a grouped order (`group_m` tile
rows at a time) so that the CTAs running together share A and B panels in L2.

tile_n counts output columns. With a second right operand (IR.b2) each k-block loads tile_n rows
of B and tile_n rows of B2, and each consumer holds two accumulators of 64 x tile_n.

With `pingpong`, the two consumer warpgroups take turns instead of sharing a tile: the CTA's
tiles i = 0, 1, 2, ... go to consumer i % 2, each consumer holding the whole tile_m = 128 rows
(two m64 accumulators, so tile_n <= 128). The producer fills the ring in tile order, so consumer 1
finds its first k-block only when consumer 0's last ones are loaded: the main loops follow each
other and one consumer's epilogue runs while the other's main loop keeps the tensor cores busy.

With `split_k` > 1 (for few output tiles over a long K), each output tile is computed by a
cluster of split_k CTAs, one per contiguous part of the k-blocks; the fp32 partial tiles are
summed through distributed shared memory in a fixed rank order (deterministic) and each CTA
applies the epilogue to its share of the tile's columns. One tile per CTA (not persistent): the
ring, idle at the tile's end, holds the partial.

Loads (`load`): "tma" (above: one producer thread issues a TMA box per operand and k-block) or
"cp_async": the whole producer warpgroup (128 threads) copies each k-block in 16-byte chunks with
`cp.async.cg` straight into the same 128-byte swizzled layout (zero fill past M, N and K), and
each thread signals the stage's full mbarrier with `cp.async.mbarrier.arrive.noinc` (the barrier
counts 128 arrivals, no transaction bytes). The consumers read the same layout with the same
descriptors, after a proxy fence (the copies are generic-proxy writes, wgmma reads through the
async proxy). Measured on an H100 (bench/results/2026-12-07-h100-matmul-3): correct everywhere
it was checked, and slower than TMA at every K timed: the 128x256 staged kernel 0.838x cuBLAS
against TMA's 0.961x at K = 2048, 0.561x against 0.604x at K = 2056. Where the row pitch 2 K is
not a multiple of 32 bytes (K % 16 != 0) both load paths run at about 0.6x cuBLAS; a pitch that
is a multiple of 32 but not of 128 (K = 2080, 2096) is as fast as K = 2048.

The "mma_sync" kind is reserved for the fallback (mma.sync + cp.async); it is not emitted yet and
`is_valid` refuses it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from factory.families.matmul.ir import GemmIR

SMEM_LIMIT = 227 * 1024  # dynamic shared memory one CTA may ask for on sm_90
NUM_SMS = 132
REGS_PER_SM = 65536
PRODUCER_REGS = 40  # setmaxnreg of the producer warpgroup (it holds a few indices)
BK_BYTES = 128  # one swizzled row of a k-block: 64 bf16 = the 128-byte swizzle span
KINDS = ("wgmma", "mma_sync")
# Verified on an H100 80GB HBM3 (2026-12-07): batches and 2x1 clusters in
# bench/results/2026-12-07-h100-matmul-verify (54 checks passed), split-K in
# bench/results/2026-12-07-h100-matmul-splitk (25 checks passed). Each flag still gates its
# kind in is_valid: set False, the kind is refused as unverified.
# Batch axes flatten into the rows (emit.rows_expr).
BATCH_VERIFIED = True
# 2x1 clusters with B multicast (slower than the same tile alone on that run: kept for the search).
CLUSTER_VERIFIED = True
# split-K through distributed shared memory.
SPLITK_VERIFIED = True
# The epilogue staged through shared memory and stored by TMA (GemmSchedule.tma_store), verified
# on the same H100 in bench/results/2026-12-07-h100-issue48 (tmastore/: 54 checks passed, with M, N
# and K tails and many tiles a CTA; issue48/: every staged kernel checked at each shape it ran).
TMA_STORE_VERIFIED = True
# The same epilogue staging an fp8 e4m3 output (boxes of 128 columns), verified on an H100 in
# bench/results/2026-12-07-h100-matmul-2 (verify/: per-row and group-scaled fp8 staged at M, N
# and K tails and one row; fused/: every staged kernel checked at 4096^3 and 8192^3).
TMA_STORE_FP8_VERIFIED = True
# The staged kernels' fallback for an N whose output rows are not a multiple of 16 bytes: with
# this flag set the emitter pads the output map's rows to 16 bytes (so the GPU worker can encode
# it at any N) and adds a register-store epilogue the kernel takes at such N (emit.py,
# epilogue), and is_valid lets tma_store schedules serve such shapes. Compiled here (no spill,
# no serialised wgmma), not yet run on a GPU: until then it is off, and the staged kernels are
# emitted exactly as verified (gemm_bench --allow-tma-store-fallback turns it on).
TMA_STORE_FALLBACK_VERIFIED = False
# tile_k 128: a stage of two 64-k sub-blocks (256 contiguous bytes of each row of A and B per
# stage), verified in the same run (verify/, skinny/, maxnreg/); no faster than tile_k 64 there,
# so not among space.OPTIONS.
WIDE_K_VERIFIED = True
SPLIT_KS = (1, 2, 4)
LOADS = ("tma", "cp_async")
# The cp.async load path (GemmSchedule.load = "cp_async"), verified on an H100 in
# bench/results/2026-12-07-h100-matmul-3 (unaligned/: 46 checks passed, M / N / K tails,
# 3000x5000x2056, 130x304x8, 1x4096x4104, bias+GELU, SwiGLU; the worker's launch path too). In
# the space for the search to measure; never the default (slower than TMA at every K timed).
CP_ASYNC_VERIFIED = True


@dataclass(frozen=True)
class GemmSchedule:
    kind: str = "wgmma"
    tile_m: int = 128  # output rows per CTA tile: 64 per consumer warpgroup
    tile_n: int = 256  # output columns per CTA tile (the wgmma N)
    tile_k: int = 64  # k per pipeline stage (64 bf16 = one 128-byte swizzle row)
    stages: int = 4  # shared-memory buffers in the ring
    consumers: int = 2  # consumer warpgroups
    cluster_m: int = 1  # CTAs per cluster along M (2: B tiles multicast to both)
    cluster_n: int = 1
    group_m: int = 8  # rasterisation: tile rows per group of the persistent tile order
    persistent: bool = True
    split_k: int = 1  # CTAs (a cluster) sharing one output tile's K; 1 = no split
    fast_math: bool = True  # approximate tanh/rcp in the epilogue (bf16/fp16 outputs only)
    pingpong: bool = False  # consumers alternate whole tiles (see the module docstring)
    # epilogue staging: 0 = registers straight to global memory; else the columns of each
    # consumer warpgroup's staging buffer in shared memory (a multiple of 64): the epilogue writes
    # its rows there in boxes of 64 x 64 and one thread stores each box by TMA (see emit.py)
    tma_store: int = 0
    # how the k-blocks of A and B reach shared memory: "tma" (one thread, TMA boxes) or
    # "cp_async" (the producer warpgroup's 16-byte cp.async chunks; slower than TMA where timed)
    load: str = "tma"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GemmSchedule:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})

    def label(self) -> str:
        parts = [
            self.kind,
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}",
            f"s{self.stages}",
            f"c{self.consumers}",
        ]
        if self.cluster_m * self.cluster_n > 1:
            parts.append(f"cl{self.cluster_m}x{self.cluster_n}")
        if self.pingpong:
            parts.append("pp")
        if self.persistent:
            parts.append(f"pers g{self.group_m}")
        if self.split_k > 1:
            parts.append(f"sk{self.split_k}")
        if self.tma_store:
            parts.append(f"ts{self.tma_store}")
        if self.load != "tma":
            parts.append("cpa")
        return " ".join(parts)

    # Derived quantities the emitter uses.
    def rows_per_consumer(self) -> int:
        return self.tile_m if self.pingpong else self.tile_m // self.consumers

    def b_rows(self, ir: GemmIR) -> int:
        """Rows of B (and B2) loaded per k-block: the wgmma N of each accumulator times their
        number."""
        return self.tile_n * (2 if ir.b2 is not None else 1)

    def stage_bytes(self, ir: GemmIR) -> int:
        return (self.tile_m + self.b_rows(ir)) * self.tile_k * 2

    def epi_bytes(self, ir: GemmIR | None = None) -> int:
        """The epilogue's staging buffers (tma_store): tma_store columns of the output (16-bit,
        or 1 byte for an fp8 output) of every row of the tile (each consumer warpgroup its own
        rows)."""
        return self.tile_m * self.tma_store * (staged_bytes(ir) if ir is not None else 2)

    def smem_bytes(self, ir: GemmIR) -> int:
        # stages of A and B tiles, the epilogue's staging buffers, 16 bytes of mbarriers per
        # stage, 1024 bytes of slack to align the ring to the 1024-byte period of the 128-byte
        # swizzle.
        return self.stages * self.stage_bytes(ir) + self.epi_bytes(ir) + 16 * self.stages + 1024

    def ring_bytes(self, ir: GemmIR) -> int:
        return self.stages * self.stage_bytes(ir)

    def partial_bytes(self, ir: GemmIR) -> int:
        """Shared memory a split-K CTA's fp32 partial tile takes (both accumulators with b2)."""
        return self.tile_m * self.tile_n * 4 * (2 if ir.b2 is not None else 1)

    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    def acc_regs(self, ir: GemmIR) -> int:
        """fp32 accumulator registers per consumer thread."""
        per = self.rows_per_consumer() * self.tile_n // 128
        return per * (2 if ir.b2 is not None else 1)

    def consumer_regs(self) -> int:
        """setmaxnreg of the consumer warpgroups: what the register file leaves after the
        producer, rounded down to a multiple of 8, at most 240."""
        left = REGS_PER_SM // 128 - PRODUCER_REGS  # registers per thread-slot of 128 threads
        return min(240, (left // self.consumers) // 8 * 8)


def staged_bytes(ir: GemmIR) -> int:
    """Bytes per element of the output the TMA-store epilogue stages: 1 for fp8 e4m3 (boxes of
    128 columns), else 2 (boxes of 64 columns); a box row is 128 bytes either way."""
    return 1 if ir.outputs and ir.outputs[0].dtype == "fp8e4m3" else 2


_PROBLEMS: dict[int, tuple[GemmIR, list[str]]] = {}


def _problems(ir: GemmIR) -> list[str]:
    """ir.problems(), remembered per IR object (the space asks it for every candidate; walking
    the epilogue's expressions was most of the space's time)."""
    hit = _PROBLEMS.get(id(ir))
    if hit is not None and hit[0] is ir:
        return hit[1]
    if len(_PROBLEMS) > 64:
        _PROBLEMS.clear()
    probs = ir.problems()
    _PROBLEMS[id(ir)] = (ir, probs)  # the IR is kept, so its id is not reused while cached
    return probs


def is_valid(ir: GemmIR, s: GemmSchedule, dims: dict[str, int] | None = None) -> str | None:
    """None when the emitter can render `ir` with `s` (at `dims`, when given), else the reason."""
    probs = _problems(ir)
    if probs:
        return "; ".join(probs)
    if s.kind != "wgmma":
        return f"kind {s.kind!r} is not emitted yet (only wgmma)"
    if s.load not in LOADS:
        return f"load must be one of {LOADS}"
    if s.load == "cp_async":
        if s.cluster_m != 1:
            return "cp_async loads are not emitted with a 2x1 cluster (B is multicast by TMA)"
        if not CP_ASYNC_VERIFIED:
            return "the cp.async load path is emitted but not yet verified on a GPU"
    if s.tile_k not in (64, 128):
        return "tile_k must be 64 or 128 (one or two 128-byte swizzle rows of bf16/fp16)"
    if s.tile_k == 128:
        if s.cluster_m != 1:
            return "tile_k 128 is not emitted with a 2x1 cluster"
        if not WIDE_K_VERIFIED:
            return "tile_k 128 is emitted but not yet verified on a GPU"
    if s.consumers not in (1, 2):
        return "consumers must be 1 or 2"
    if s.pingpong:
        if s.consumers != 2 or s.tile_m != 128 or not s.persistent:
            return "pingpong needs 2 consumers, tile_m 128 and a persistent grid"
        if ir.b2 is not None:
            return "pingpong is not emitted with a second right operand"
        if s.acc_regs(ir) > 128:
            # each consumer holds both 64-row accumulators (tile_n registers a thread); compiled
            # by nvJitLink (setmaxnreg ignored: 168 registers a thread, as the product compiles)
            # tile_n 160 spills 1440 bytes and 192 spills 2176 and serialises its wgmmas (C7511)
            return "pingpong holds 2 x tile_n / 2 accumulator registers: tile_n <= 128 (spills)"
    elif s.tile_m != 64 * s.consumers:
        return f"tile_m must be 64 per consumer warpgroup ({64 * s.consumers})"
    if s.tile_n % 16 or not 16 <= s.tile_n <= 256:
        return "tile_n must be a multiple of 16 in [16, 256] (wgmma N)"
    if s.b_rows(ir) > 256:
        return "B rows per k-block exceed 256 (one TMA box); with b2 take tile_n <= 128"
    if s.stages < 2 or s.stages > 8:
        return "stages must be in [2, 8]"
    if s.cluster_n != 1 or s.cluster_m not in (1, 2):
        return "clusters: only 1x1 and 2x1 (two CTAs along M sharing B) are emitted"
    if s.cluster_m == 2:
        if s.pingpong:
            return "a 2x1 cluster is not emitted with ping-pong consumers"
        if (s.tile_n // 2) % 8:
            return "a 2x1 cluster splits B's tile_n rows in halves of a multiple of 8"
        if not CLUSTER_VERIFIED:
            return "2x1 clusters are emitted but not yet verified on a GPU"
    if s.split_k not in SPLIT_KS:
        return f"split_k must be one of {SPLIT_KS}"
    if s.split_k > 1:
        if s.persistent:
            return "split-K runs one tile per CTA cluster: persistent must be False"
        if s.pingpong or s.cluster_m != 1:
            return "split-K is not emitted with ping-pong consumers or a 2x1 cluster"
        if s.partial_bytes(ir) > s.ring_bytes(ir):
            return (
                f"split-K keeps the {s.partial_bytes(ir)}-byte fp32 partial tile in the ring of "
                f"{s.ring_bytes(ir)} bytes: more stages or a smaller tile"
            )
        if s.tile_n // 8 < s.split_k:
            return "split-K shares the tile's 8-column blocks among its CTAs: tile_n too narrow"
        if not SPLITK_VERIFIED:
            return "split-K is emitted but not yet verified on a GPU"
    if s.tma_store:
        box = 128 // staged_bytes(ir)  # columns of one 128-byte box row
        if s.tma_store % box or s.tile_n % s.tma_store:
            return f"tma_store: a multiple of {box} columns (one box) that divides tile_n"
        if s.pingpong or s.split_k > 1 or s.cluster_m > 1:
            return "tma_store is emitted for the cooperative kernel (no pingpong, split-K, cluster)"
        if len(ir.outputs) != 1 or ir.outputs[0].dtype not in ("bf16", "fp16", "fp8e4m3"):
            return "tma_store stages one bf16, fp16 or fp8 e4m3 output"
        if staged_bytes(ir) == 1 and not TMA_STORE_FP8_VERIFIED:
            return "the TMA-store epilogue of an fp8 output is emitted but not yet verified"
        if s.consumers == 2 and s.acc_regs(ir) >= 128 and (not s.persistent or s.group_m == 1):
            # ptxas (168 registers a thread with two consumers) spills 24 bytes in the residual
            # epilogue of the 128x256 tile staged without the grouped tile order; grouped
            # persistent does not, nor does one consumer warpgroup (more registers each)
            return "tma_store with 128 accumulator registers needs a persistent grid, group_m > 1"
        if not TMA_STORE_VERIFIED:
            return "the TMA-store epilogue is emitted but not yet verified on a GPU"
    if s.group_m < 1:
        return "group_m must be >= 1"
    if s.smem_bytes(ir) > SMEM_LIMIT:
        return f"{s.smem_bytes(ir)} bytes of shared memory exceed {SMEM_LIMIT}"
    # The accumulators plus about 40 registers of addressing and epilogue must fit the consumer
    # register budget.
    if s.acc_regs(ir) + 40 > s.consumer_regs():
        return (
            f"{s.acc_regs(ir)} accumulator registers per thread leave too little of "
            f"{s.consumer_regs()}"
        )
    if ir.batch and not BATCH_VERIFIED:
        return "batched GEMMs are emitted but not yet verified on a GPU"
    if ir.b.layout != "col":
        return "B must be stored [N, K] (layout 'col') for the wgmma path yet"
    if any(o.group_scale for o in ir.outputs):
        if s.tile_n % 128:
            return "a group-scaled fp8 output needs tile_n a multiple of its 128-column groups"
        if (s.tile_n // 8 // s.split_k) % 16:
            return "split-K shares would cut a 128-column scale group"
        if s.acc_regs(ir) >= 128 and s.cluster_m > 1:
            # the amax pass beside 128 accumulators and the 2x1 cluster's addressing spills
            # 88 bytes (ptxas, 168 registers a thread); split-K's does not since its reduction
            # stopped looping back into the main loop
            return "a group-scaled fp8 output with 128 accumulator registers spills in a cluster"
    if dims is not None:
        try:
            m, n, k = dims[ir.m], dims[ir.n], dims[ir.k]
            for d in ir.batch:
                m *= dims[d]  # batch axes flatten into the rows
        except KeyError as exc:
            return f"missing dim {exc}"
        if min(m, n, k) < 1:
            return "every dim must be >= 1"
        if k % 8:
            return "K must be a multiple of 8 (the TMA needs 16-byte row strides)"
        if s.tma_store and (n * staged_bytes(ir)) % 16 and not TMA_STORE_FALLBACK_VERIFIED:
            return "tma_store needs the output's rows a multiple of 16 bytes (its tensor map)"
        if max(m, n, k) >= 2**31:
            return "dims must be below 2**31"
    return None
