"""Schedule spaces: how a row kernel is laid out on the GPU, as flat frozen option objects.

A `Schedule` is one point in the space. Its fields are plain ints, bools and short strings so that
search code can mutate any field generically (`dataclasses.replace`), serialise it (`asdict`) and
rebuild it (`Schedule.from_dict`). Whether a point makes sense for an IR at some dims is decided in
one place, `is_valid`; `space` is the product of the option lists filtered by it.

Hardware facts (Hopper, sm_90) that bound the space:
- 1024 threads per block, 64K 32-bit registers and 2048 threads per SM, 132 SMs on H100 SXM/H200;
- 16-byte accesses per thread (ld.global.v4.b32) are the widest and the coalescing sweet spot;
- a barrier id held in a register makes ptxas reserve all 16 named barriers, which cuts the
  blocks an SM holds: a row that spans several warps gets a block of its own (`bar.sync 0`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from pathlib import Path

from factory.device import DEFAULT as DEVICE
from factory.families.row.ir import ROLE_ROW, KernelIR
from factory.spec import expr as E

NUM_SMS = DEVICE.sms  # the persistent grid is sized from it
MAX_THREADS_PER_BLOCK = DEVICE.max_threads_per_block
# Rows of at most 256 bf16 (128 fp32) elements may take fewer than a warp's threads: 4 lanes
# of 16 bytes each cover 32 bf16 elements. Up to 512 bytes, one round of a warp's 16-byte
# chunks, where a warp a row of one chunk each leaves each lane one load in flight
# (bench/results/ROW-FAMILY-NOTES.md, threads_per_row).
MIN_THREADS_PER_ROW = 4
SHORT_ROW_BYTES = 32 * 16
# Rows short enough that the 8-byte chunks of narrow_vec are searched where 16-byte ones leave
# them misaligned (the lengths where they are known to pay: ROW-FAMILY-NOTES.md, vec_elems).
NARROW_ROW_BYTES = 256
REGISTER_BUDGET_PER_THREAD = 128  # our estimate's cap: beyond it occupancy drops below 2 blocks

MODES = ("cached", "stream")
LOAD_HINTS = (
    "none",
    "nc",
    "nc_noalloc",
    "evict_first",
    "nc_pf256",
    "nc_l2last",
    "nc_l2first",
    "nc_l2reuse",
    "plain_l2last",
)
STORE_HINTS = ("none", "cs", "noalloc", "l2first", "l2last")
CLUSTER_BLOCKS = (1, 2, 4, 8)  # 8: the portable cluster size
# Fields that `to_dict` leaves out at these values (their defaults): a record that lacks one and
# a record that holds it at its default name one schedule.
LATE_DEFAULTS = {
    "cluster_blocks": 1,
    "late_stores": False,
    "early_cols": False,
    "moments": False,
    "col_groups": 1,
    "col_hint": "nc",
    "acc_split": 1,
    "early_gather": False,
    "packed_max": False,
    "tail": "elements",
    "flat": False,
    "split_paths": False,
    "rows_per_thread": 1,
}
ROWS_PER_THREAD = (1, 2, 4)
ACC_SPLITS = (1, 2, 4, 8)
COL_GROUPS = (1, 2, 4, 8)
COL_HINTS = ("nc", "nc_l2last")
# Two letters per load and store hint in tags (a tag names the entry point, so it must be unique).
_HINT_TAGS = {
    "none": "no",
    "nc": "nl",
    "nc_noalloc": "nc",
    "evict_first": "ev",
    "nc_pf256": "np",
    "nc_l2last": "el",
    "nc_l2first": "ef",
    "nc_l2reuse": "lf",
    "plain_l2last": "pl",
}
_STORE_TAGS = {"none": "no", "cs": "cs", "noalloc": "na", "l2first": "ef", "l2last": "el"}


@dataclass(frozen=True)
class Schedule:
    """One layout of the row kernel.

    threads_per_row: threads that share one row (32 = a warp; more = several warps, reduced
        through shared memory; 4, 8 or 16 for rows of at most 256 bf16 elements, several rows
        to a warp, each reduced over its own lanes).
    rows_per_block: row groups per block (block size = threads_per_row * rows_per_block).
        Multi-warp groups of one block meet at the block barrier (so not with a persistent
        grid, where each group would need its own named barrier).
    vec_elems: elements per thread per chunk (8 bf16 = one 16-byte ld.global.v4).
    chunks: "cached": chunks per thread held in registers, so the row capacity is
        threads_per_row * vec_elems * chunks (longer rows fall back to streaming);
        "stream": chunks loaded per loop iteration (the unroll, loads in flight).
    mode: "cached" reads the row once into registers and makes every pass there; "stream" reads
        it again from memory (L2) for every pass.
    online: fuse max(F) and sum(exp(F - max F)) into one pass (running max, rescaled sum).
    load_hint / store_hint: cache qualifiers for row data. "nc" (ld.global.nc, the read-only
        path) is the default; "nc_noalloc" adds L1::no_allocate. "nc_pf256" adds the L2::256B
        prefetch-size hint (the L2 fetches 256 bytes around each miss); it is not in `space`.
        "nc_l2last" / "nc_l2first" and the stores "l2last" / "l2first" attach an L2 eviction
        policy (createpolicy, the L2::cache_hint operand): what max-autotune's Triton kernels
        do for the norms (x kept in L2 for its second read, the output let go first).
        Evict-last row loads are the cached default for rows of more than a warp and in
        `space`; the evict-first stores are left to plans.
        "nc_l2reuse" (stream mode only) picks the policy per read: evict-last where a later
        pass reads the same row again, evict-first on its last read, so that the L2 keeps a
        row until its last pass and then lets it go first (what inductor's looped reductions
        do for the norms). "plain_l2last" is "nc_l2last" on the plain (coherent) load path,
        as Triton emits it.
    persistent_blocks_per_sm: 0 = one block per row group; k > 0 = grid of k blocks per SM
        looping over rows.
    fast_math: approximate div/sqrt/tanh (allowed only where the tolerance is loose).
    min_threads_per_sm: 0 = let ptxas choose the registers; k > 0 = ask for at least k resident
        threads per SM (.minnctapersm), which caps the registers (65536 / k per thread).
    keep_intermediates: "cached" mode: keep expensive row intermediates needed by a later pass
        (softmax's exp(x - max)) in registers; False recomputes them (one more exp per element,
        far fewer registers, so more rows in flight per SM).
    prefetch_rows: "cached" mode with a persistent grid: load the block's next row into a
        second register buffer while this row is reduced and stored (memory stays busy through
        the reductions; twice the registers for row data).
    cluster_blocks: 1 = a row lives in one block; k > 1 = a thread block cluster of k blocks
        (sm_90+) shares each row, threads_per_row counting the row's threads across the
        cluster: rows too long for one block's registers stay in registers, and the blocks
        combine their partial reductions through distributed shared memory. `to_dict` leaves
        it out at 1 (LATE_DEFAULTS), as every field below at its default.
    late_stores: "cached" mode: a row output that is ready before the last pass (the new
        residual h of add+RMSNorm) is written in the last pass, next to the other outputs,
        instead of in the middle of the reduction's loads; the kernel then reads everything
        first and writes everything last, as a fused compiler kernel does.
    early_cols: "cached" mode without prefetch: per-column vectors (RMSNorm's weight) are
        loaded with the row, before the reduction, instead of by the pass that reads them after
        it, so no load latency sits between the reduction and the stores (more registers held
        through the reduction). Rows under a warp in a persistent grid (holds_cols): loaded
        once, before the first row, and held across every row of the thread, prefetched or not.
    moments: a mean and the mean squared deviation from it (LayerNorm) in one pass: each
        thread's elements give (count, mean, squared deviations), merged across the row by
        Chan's update, instead of a second pass and a second reduction across the row (one
        barrier fewer per row; streamed, one read of the row fewer).
    col_groups: "cached" mode: the pass that reads per-column vectors (a norm's weight and
        bias) loads them, and writes its outputs, in this many groups of chunks, with a CTA
        fence (fence.acq_rel.cta) between groups. Without the fence ptxas hoists every chunk's
        column loads to the top of the pass, and they are all live at once: LayerNorm at 256
        threads of 4 chunks needs 79 registers (3 blocks of 256 per SM); in 4 groups, 64 (4
        blocks) with no spill. The cost is the column loads of one group waiting for the last
        group's stores to be issued. In `space`, not in `default_schedule`. Also any chunk
        count's own number (one chunk at a time), which `space` offers where 4 does not divide
        the chunks: a row of odd width (the shifted tail loads its columns in these groups
        too) held in 5 chunks of 128 threads needs 80 registers so instead of 128 for
        LayerNorm, 66 instead of 95 for RMSNorm.
    col_hint: how per-column vectors are loaded: "nc" (the read-only path) or "nc_l2last"
        (L1 and L2 evict-last with the policy operand, as inductor's norms load their weight:
        every row reads the vector, the rows stream by once).
    acc_split: each thread folds its elements into this many partial accumulators per
        reduction, element e into partial e mod acc_split, combined by a tree before the
        reduction across threads; an online max/sum group takes its max and its sum of
        exponentials by trees too. 1 folds every element into one register, a chain of
        chunks * vec_elems dependent adds (4 cycles each) that sits between a row's last load
        and its reduction across threads. The order of a float sum changes with it (a
        pairwise order, no less accurate).
    early_gather: load every gathered element (cross-entropy's logits[row, target[row]]) when
        the row starts, beside its first row loads, instead of after the reductions that come
        before its use, where its load latency sits on the row's critical path.
    packed_max: an online max/sum whose F is a 16-bit row input (cross-entropy's and softmax's
        logits) takes the group's max on the loaded words, two elements per instruction
        (max.bf16x2 / max.f16x2; exact, as a max of values of one format is one of them), and
        unpacks each element to f32 only for its exponential: half the max instructions, and
        the group's elements need not all be live as f32 at once (fewer registers, so more
        chunks of loads in flight fit under a register cap). The tail of the row (predicated
        loads) folds its group one chunk at a time for the same reason.
    tail: how the tail path moves a row (the path of a row this layout's chunks do not divide:
        a streamed row's last step, a whole row shorter than the cached capacity, and every
        row whose length is not a multiple of vec_elems). "elements": element by element, each
        thread's elements consecutive (t*V + j). "vectors": where N is a multiple of vec_elems
        and the rows are 16-byte aligned, each chunk of the tail is whole or past the row's
        end, so it is loaded and stored as one 16-byte access under one predicate (the kernel
        branches to it at run time; other rows take the element tail). "strided": element by
        element, element j of thread t at t + j*T, so that a warp's single-element accesses
        cover consecutive addresses (for rows of a length that is not a multiple of
        vec_elems, which all take the element tail). Either costs code, and at a tight register cap
        registers (a kernel's count is set by its tail path too), so `fit_tail` sets it only
        where the job's rows take it. "shifted": for a row whose start is not 16-byte aligned (a
        length that is not a multiple of vec_elems: cross-entropy over a vocabulary of 50257,
        RMSNorm over 4999 columns), the row is walked from the aligned address at or before its
        start, so its chunks are whole 16-byte loads and stores but for the one or two that straddle
        its ends, which move element by element (the elements before the start belong to the row
        before). A per-column vector (a norm's weight) then sits at another alignment and moves
        element by element (from L1). Row tensors of one element size; rows whose tensors are not
        congruent modulo 16 bytes move element by element at run time. `fit_tail` picks it for
        streamed rows; rows held in registers are fitted
        "strided", with a shifted twin in the space (see fit_tail). "stream": a row held in
        registers is whole chunks or whole vectors, as under "vectors", and any other row (a
        length that is not a multiple of vec_elems, a misaligned pointer) takes the long-row
        path, which streams it: the kernel holds no registers for an element tail, which is
        what sets the count of a short row's kernel (LayerNorm at 8 threads of four 8-byte
        chunks: 64 registers, 48 without it; RMSNorm 47 -> 38). `fit_tail` picks it for rows
        under a warp where every row of the job is a multiple of vec_elems.
    flat: for an elementwise operator (every input and output a row tensor, no reduction, no
        gather), the rows are one contiguous run of M*N elements, so the kernel walks that run
        in tiles of the layout's capacity (threads_per_row * vec_elems * chunks), one tile a
        block, whatever N is: every tile starts 16-byte aligned and only the last can be
        short. A row length that is not a multiple of vec_elems would otherwise leave every
        row misaligned and every element moving alone. The kernel still takes (M, N); its grid
        is ceildiv(M*N, capacity). Cached mode, one row group per block, no persistent grid,
        no cluster. `fit_tail` sets it where a row length is not a multiple of vec_elems.
    split_paths: a row held in registers gets one whole copy of its code per path (whole
        chunks; a tail of whole vectors; the tail element by element), chosen once per row,
        instead of a branch between the paths at every pass. ptxas then sizes registers for
        the path a row takes rather than for the paths joined pass after pass: LayerNorm at
        16384x5000, 128 threads of 5 chunks, needs 96 registers rather than 123, and fits a
        cap of 80 without spilling (96 bytes spilled joined); elsewhere it can cost registers
        (RMSNorm 16384x4096 at 128 threads: 80 -> 128). More code per kernel. Cached mode, not
        flat, no prefetched rows. In `space` as `split_twin` of layouts whose rows take a tail.
    rows_per_thread: each row group holds this many rows at once, a thread's chunks of every
        one of them: all their loads go out first, then each row is reduced and stored, so
        one thread keeps several rows' loads in flight and the reductions of its rows
        overlap (what torch.compile's persistent reductions do for short rows: at 131072x200
        bf16, one warp a block holding four rows, a lane one 16-byte chunk of each). Cached
        mode, rows of a warp or less, one row group per block (no persistent grid, prefetch,
        tiles or cluster), not the shifted tail. A block then covers rows_per_block x
        rows_per_thread rows.

    The measurements behind these rules: bench/results/ROW-FAMILY-NOTES.md, by field.
    """

    family: str = "row"
    threads_per_row: int = 256
    rows_per_block: int = 1
    vec_elems: int = 8
    chunks: int = 4
    mode: str = "cached"
    online: bool = False
    load_hint: str = "nc"
    store_hint: str = "none"
    persistent_blocks_per_sm: int = 0
    fast_math: bool = True
    min_threads_per_sm: int = 0
    keep_intermediates: bool = True
    prefetch_rows: bool = False
    cluster_blocks: int = 1
    late_stores: bool = False
    early_cols: bool = False
    moments: bool = False
    col_groups: int = 1
    col_hint: str = "nc"
    acc_split: int = 1
    early_gather: bool = False
    packed_max: bool = False
    tail: str = "elements"
    flat: bool = False
    split_paths: bool = False
    rows_per_thread: int = 1

    def to_dict(self) -> dict:
        # Every field is an int, bool or str: no deep copy (asdict's) is needed. The agents
        # call this for every point of a space when they spread a generation (300k+ a job).
        return {
            k: v for k in _FIELD_NAMES if LATE_DEFAULTS.get(k, _ABSENT) != (v := getattr(self, k))
        }

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown schedule fields: {sorted(unknown)}")
        return cls(**d)

    @property
    def threads_per_block(self) -> int:
        return self.threads_per_row * self.rows_per_block // self.cluster_blocks

    def tag(self) -> str:
        """A short, stable name for entry points and tables."""
        s = (
            f"{self.mode[0]}t{self.threads_per_row}r{self.rows_per_block}"
            f"v{self.vec_elems}c{self.chunks}"
        )
        if self.online:
            s += "o"
        if self.persistent_blocks_per_sm:
            s += f"p{self.persistent_blocks_per_sm}"
        if not self.fast_math:
            s += "x"
        if self.min_threads_per_sm:
            s += f"m{self.min_threads_per_sm}"
        if not self.keep_intermediates:
            s += "k"
        if self.prefetch_rows:
            s += "f"
        if self.cluster_blocks > 1:
            s += f"cl{self.cluster_blocks}"
        if self.late_stores:
            s += "d"
        if self.early_cols:
            s += "e"
        if self.moments:
            s += "w"
        if self.col_groups > 1:
            s += f"g{self.col_groups}"
        if self.col_hint != "nc":
            s += "h"
        if self.acc_split > 1:
            s += f"a{self.acc_split}"
        if self.early_gather:
            s += "q"
        if self.packed_max:
            s += "b"
        if self.rows_per_thread > 1:
            s += f"s{self.rows_per_thread}"
        if self.tail != "elements":
            s += {"vectors": "u", "strided": "z", "shifted": "y", "stream": "n"}[self.tail]
        if self.flat:
            s += "j"
        if self.split_paths:
            s += "i"
        return s + f"_{_HINT_TAGS[self.load_hint]}{_STORE_TAGS[self.store_hint]}"


_FIELD_NAMES = tuple(f.name for f in fields(Schedule))
_ABSENT = object()

TAG_LEGEND = (
    "c/s the row cached in registers or streamed, t threads per row, r rows per block, v "
    "elements per thread per access, c chunks; then o online max/sum, p persistent blocks per SM, "
    "x precise math, m register cap for that many threads per SM, k intermediates recomputed, "
    "f next row prefetched, cl blocks per cluster, d early outputs stored last, e per-column "
    "vectors loaded with the row, w mean and variance in one pass, g per-column vectors loaded in "
    "that many groups of chunks, h per-column vectors loaded with the evict-last policies, a "
    "partial accumulators per thread, q gathered elements loaded when the row starts, b the "
    "online max taken on packed 16-bit pairs, s rows held by each thread at once, u / z / y "
    "the row's tail moved as whole vectors / "
    "as strided elements / a misaligned row walked from an aligned address, n whole vectors "
    "held and any other row streamed, j rows "
    "walked as one run of tiles, i one copy of the row's code per path; after "
    "the underscore, the load hint (nl ld.global.nc, no plain, nc nc without L1 allocation, ev "
    "evict-first, np nc with 256-byte L2 prefetch, el / ef nc with the L2 evict-last / "
    "evict-first policy, lf evict-last on reads a later pass repeats and evict-first on the "
    "last, pl plain loads with the evict-last policy) and the store hint (no plain, cs "
    "streaming, na no L1 allocation, el / ef the L2 policies)."
)


def has_col_inputs(ir: KernelIR) -> bool:
    """Whether the operator reads a per-column vector (a norm's weight; early_cols loads it)."""
    return any(t.role == "col" for t in ir.inputs)


def has_early_outputs(ir: KernelIR) -> bool:
    """Whether a row output is ready before the last pass over the row (late_stores moves it)."""
    last = ir.num_stages - 1
    return any(o.role == "row" and ir.stage[o.node] < last for o in ir.outputs)


def packed_pairs(ir: KernelIR) -> list:
    """The online max/sum pairs whose F is a 16-bit (bf16, fp16) row input read as it is."""
    out = []
    for q in ir.online:
        if isinstance(q.f_node, E.Input):
            t = ir.input_by_name.get(q.f_node.name)
            if t is not None and t.dtype in ("bf16", "fp16") and t.role == ROLE_ROW:
                out.append(q)
    return out


def tail_runs(ir: KernelIR, s: Schedule, dims: dict[str, int]) -> bool:
    """Whether rows of `dims` take the tail path under `s` with whole vectors available (N a
    multiple of vec_elems, which aligned pointers then keep aligned): a cached row shorter than
    the layout's capacity, or a streamed row its steps do not divide. (Rows of a length that
    is not a multiple of vec_elems take the element tail all along.)"""
    n = int(dims[ir.row_dim])
    if n % s.vec_elems:
        return False
    step = s.threads_per_row * s.vec_elems * s.chunks
    if s.mode == "cached":
        return n < step
    return n % step != 0


TAILS = ("elements", "vectors", "strided", "shifted", "stream")


def shift_ok(ir: KernelIR, s: Schedule) -> bool:
    """Whether `s` can walk `ir`'s misaligned rows from an aligned address (tail "shifted")."""
    row_bytes = {t.elem_bytes for t in ir.inputs if t.role == ROLE_ROW} | {
        E.DTYPE_BYTES[o.dtype] for o in ir.outputs if o.role == ROLE_ROW
    }
    return (
        len(row_bytes) == 1
        and not s.moments
        and not s.prefetch_rows
        and not s.flat
        and not s.late_stores
        and s.cluster_blocks == 1
    )


def elementwise(ir: KernelIR) -> bool:
    """Whether every input and output is a row tensor and nothing is reduced or gathered: then
    rows are independent of where they break (`flat` may join them)."""
    return (
        all(t.role == ROLE_ROW for t in ir.inputs)
        and all(o.role == ROLE_ROW for o in ir.outputs)
        and not ir.reductions
        and not ir.gathers
        and not ir.online
        and not ir.moments
    )


def flat_ok(ir: KernelIR, s: Schedule) -> bool:
    """Whether `s` can walk `ir`'s rows as one run of tiles (see Schedule.flat)."""
    return (
        elementwise(ir)
        and s.mode == "cached"
        and s.rows_per_block == 1
        and s.rows_per_thread == 1
        and not s.persistent_blocks_per_sm
        and not s.prefetch_rows
        and s.cluster_blocks == 1
    )


def fit_tail(ir: KernelIR, s: Schedule, dims_list: list[dict[str, int]]) -> Schedule:
    """`s` with the tail its rows at `dims_list` take: for rows under a warp held in registers
    whose every length is a multiple of vec_elems, "stream" (whole vectors in registers, any
    other row streamed: fewer registers); "vectors" where any of them takes the
    tail with whole vectors; else, for a row in registers, "strided" where any has a length
    that is not a multiple of vec_elems; else "elements". A streamed row that is not a multiple
    of vec_elems is walked "shifted" where it can, while rows in registers keep "strided":
    there shifted is faster or slower by operator and layout (slower for RMSNorm and LayerNorm,
    whose weight is then not aligned with the row's chunks), so the space and the suite's
    candidates hold both for the search (`shifted_twin`). An elementwise operator whose rows are
    not a multiple of vec_elems walks them as one run of tiles instead (`flat`), where it can.
    The measurements: bench/results/ROW-FAMILY-NOTES.md, tail."""
    if s.flat:
        s = replace(s, flat=False)
    misaligned = any(int(d[ir.row_dim]) % s.vec_elems for d in dims_list)
    if misaligned and flat_ok(ir, s):
        return replace(s, flat=True, tail="elements")  # the last tile's tail only
    if s.mode == "cached" and s.threads_per_row < 32 and not misaligned:
        return replace(s, tail="stream")  # rows under a warp: no element tail in registers
    if any(tail_runs(ir, s, d) for d in dims_list):
        return replace(s, tail="vectors")
    if misaligned and s.mode == "cached":
        return replace(s, tail="strided")
    if misaligned and shift_ok(ir, s):
        return replace(s, tail="shifted")
    return s if s.tail == "elements" else replace(s, tail="elements")


def shifted_twin(ir: KernelIR, s: Schedule, dims_list: list[dict[str, int]]) -> Schedule | None:
    """A fitted row in registers that takes the strided tail, walked shifted instead, where that
    is valid at every shape of `dims_list` (the row and up to V - 1 elements before it must fit
    the registers); else None. Either is the faster by operator and layout (see fit_tail), so
    the space and the suite's candidates hold both."""
    if s.tail != "strided" or not shift_ok(ir, s):
        return None
    twin = replace(s, tail="shifted")
    return twin if fits_job(ir, twin, dims_list) else None


def split_twin(ir: KernelIR, s: Schedule, dims_list: list[dict[str, int]]) -> Schedule | None:
    """`s` with split_paths, where some row of `dims_list` is shorter than the layout's register
    capacity (it takes a tail path); else None. The twin fits the job wherever `s` does. Which of
    the two is the faster depends on the operator and the shape, so the space holds both
    (bench/results/ROW-FAMILY-NOTES.md, split_paths)."""
    if s.split_paths or s.mode != "cached" or s.flat or s.prefetch_rows:
        return None
    capacity = s.threads_per_row * s.vec_elems * s.chunks
    if not any(int(d[ir.row_dim]) < capacity for d in dims_list):
        return None
    # is_valid's only rule on split_paths is the one checked above, so the twin fits wherever
    # `s` does (the caller's `s` fits the job): no second pass over every shape.
    return replace(s, split_paths=True)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def fast_math_allowed(ir: KernelIR) -> bool:
    """Approximate div/sqrt/tanh carry about 2^-11..2^-21 relative error: only for outputs whose
    tolerance is at least bf16/fp16-sized."""
    return ir.tolerance_rel_norm >= 1e-3


def estimate_registers(ir: KernelIR, s: Schedule) -> int:
    """A rough per-thread register count for the cached mode (held row data plus materialised
    intermediates); the compile report is the truth, this only prunes the space early."""
    if s.mode != "cached":
        return 40 + 8 * s.chunks * s.vec_elems // 4
    held = 0
    for t in ir.row_inputs():
        held += s.chunks * max(1, s.vec_elems * t.elem_bytes // 4)
    materialised = _materialised_nodes(ir, s) * s.chunks * s.vec_elems  # f32 each
    return 32 + (held + materialised) * s.rows_per_thread


def _materialised_nodes(ir: KernelIR, s: Schedule) -> int:
    """How many row intermediates the emitter keeps in registers between passes (softmax's
    exp(x - max); none for RMSNorm, whose x*x is recomputed from the held row)."""
    key = ("materialised", s.online, s.keep_intermediates, s.late_stores, s.moments)
    if key not in ir.memo:
        from factory.families.row.kernel import RowKernel  # the emitter imports this module

        k = RowKernel(
            ir,
            Schedule(
                mode="cached",
                online=s.online,
                keep_intermediates=s.keep_intermediates,
                late_stores=s.late_stores,
                moments=s.moments,
            ),
        )
        k.mode = "cached"
        ir.memo[key] = len(k._plan_materialised())
    return ir.memo[key]


def is_valid(
    ir: KernelIR, s: Schedule, dims: dict[str, int], *, capacity: bool = True
) -> tuple[bool, str]:
    """Whether `s` is a sensible layout of `ir` at `dims`; (False, reason) otherwise.
    Correctness never depends on it (every emitted kernel handles any M and N); it prunes layouts
    that cannot launch or would waste the machine at these dims. With `capacity` False a row held
    in registers may be longer than the layout holds (it streams) or fill under half of it."""
    if s.family != "row":
        return False, f"unknown family {s.family}"
    if s.mode not in MODES:
        return False, f"unknown mode {s.mode}"
    if s.load_hint not in LOAD_HINTS or s.store_hint not in STORE_HINTS:
        return False, "unknown cache hint"
    if s.load_hint == "nc_l2reuse" and s.mode != "stream":
        return False, "nc_l2reuse is for stream mode, where a row is read again by a later pass"
    if s.cluster_blocks not in CLUSTER_BLOCKS:
        return False, f"cluster_blocks must be one of {CLUSTER_BLOCKS}"
    if s.cluster_blocks > 1:
        if s.rows_per_block != 1 or s.persistent_blocks_per_sm or s.prefetch_rows:
            return False, "a cluster shares one row: one row per block, no persistent grid"
        if s.threads_per_row // s.cluster_blocks < 256:
            return False, "a cluster is for rows past one block: at least 256 threads a block"
    top = MAX_THREADS_PER_BLOCK * s.cluster_blocks
    if not _pow2(s.threads_per_row) or not MIN_THREADS_PER_ROW <= s.threads_per_row <= top:
        return False, f"threads_per_row must be a power of two in [{MIN_THREADS_PER_ROW}, {top}]"
    if s.threads_per_row < 32:
        reason = _sub_warp_reason(ir, s, dims)
        if reason:
            return False, reason
    if not _pow2(s.vec_elems) or s.vec_elems > 16:
        return False, "vec_elems must be a power of two <= 16"
    if s.chunks < 1 or s.chunks > 16:
        return False, "chunks must be in [1, 16]"
    if s.rows_per_block < 1 or s.threads_per_block > MAX_THREADS_PER_BLOCK:
        return False, f"{s.threads_per_block} threads per block exceeds 1024"
    if s.threads_per_row > 32 and s.rows_per_block > 1 and s.persistent_blocks_per_sm:
        # Looping groups would each sync on their own named barrier, whose id is then a
        # register: ptxas reserves all 16 barriers and far fewer blocks fit on an SM. Without
        # the loop, the groups of a block share the block barrier.
        return False, "one multi-warp row group per persistent block (a register barrier id)"
    if s.persistent_blocks_per_sm < 0 or s.persistent_blocks_per_sm > 32:
        return False, "persistent_blocks_per_sm must be in [0, 32]"
    if s.min_threads_per_sm % 256 or not 0 <= s.min_threads_per_sm <= 2048:
        return False, "min_threads_per_sm must be a multiple of 256 in [0, 2048]"
    if s.fast_math and not fast_math_allowed(ir):
        return False, "fast_math is not allowed by the output tolerance"
    if s.prefetch_rows and (s.mode != "cached" or not s.persistent_blocks_per_sm):
        return False, "prefetch_rows needs the cached mode and a persistent grid"
    if s.late_stores and (s.mode != "cached" or not has_early_outputs(ir)):
        return (
            False,
            "late_stores needs the cached mode and a row output ready before the last pass",
        )
    if s.early_cols and (
        s.mode != "cached" or (s.prefetch_rows and not holds_cols(s)) or not has_col_inputs(ir)
    ):
        return (
            False,
            "early_cols needs the cached mode, a per-column input and no prefetch (but for rows "
            "under a warp in a persistent grid, which hold the columns across rows)",
        )
    if s.tail == "stream" and (s.mode != "cached" or s.flat):
        return False, "the stream tail is for rows held in registers (cached), not tiles"
    if s.split_paths and (s.mode != "cached" or s.flat or s.prefetch_rows):
        return False, "split_paths needs the cached mode, not flat, without prefetched rows"
    if s.tail not in TAILS:
        return False, f"tail must be one of {TAILS}"
    if s.tail == "shifted" and not shift_ok(ir, s):
        return (
            False,
            "the shifted tail needs row tensors of one element size, and no mean and variance "
            "in one pass, prefetched rows, tiles, late stores or cluster",
        )
    if s.flat and not flat_ok(ir, s):
        return (
            False,
            "flat needs an elementwise operator, the cached mode, one row group per block, no "
            "persistent grid and no cluster",
        )
    if s.col_hint not in COL_HINTS:
        return False, f"col_hint must be one of {COL_HINTS}"
    if s.col_hint != "nc" and not has_col_inputs(ir):
        return False, "col_hint needs a per-column input"
    if s.col_groups not in COL_GROUPS and s.col_groups != s.chunks:
        return False, f"col_groups must be one of {COL_GROUPS} or the chunks"
    if s.col_groups > 1 and (
        s.mode != "cached" or s.early_cols or s.chunks % s.col_groups or not has_col_inputs(ir)
    ):
        return (
            False,
            "col_groups needs the cached mode, per-column inputs loaded by their pass (not "
            "early_cols) and chunks that split evenly into the groups",
        )
    if s.acc_split not in ACC_SPLITS:
        return False, f"acc_split must be one of {ACC_SPLITS}"
    if s.acc_split > 1 and s.acc_split > s.chunks * s.vec_elems:
        return False, "more partial accumulators than elements per thread per pass"
    if s.rows_per_thread not in ROWS_PER_THREAD:
        return False, f"rows_per_thread must be one of {ROWS_PER_THREAD}"
    if not rows_per_thread_ok(s):
        return False, ROWS_PER_THREAD_RULE
    if s.early_gather and not ir.gathers:
        return False, "early_gather needs a gathered input"
    if s.packed_max and not (s.online and packed_pairs(ir)):
        return False, "packed_max needs an online max/sum over a 16-bit row input"
    if s.moments and (not ir.moments or s.cluster_blocks > 1):
        return False, "moments needs a mean/variance pair and a row in one block"
    if s.online and not ir.online:
        return False, "online needs a max/sum-of-exp pair"
    widest = 16 // ir.min_elem_bytes()
    if s.vec_elems * ir.min_elem_bytes() > 32:
        return False, "more than 32 bytes per chunk of the narrowest tensor"
    if s.vec_elems < widest // 2:
        return False, "accesses narrower than 8 bytes"
    n = int(dims[ir.row_dim])
    per_pass = s.threads_per_row * s.vec_elems
    if s.mode == "cached":
        check, capacity = capacity, per_pass * s.chunks
        if s.tail == "shifted":  # the row moved back to an aligned start must still fit
            capacity -= s.vec_elems - 1
        if n > capacity and not s.flat and check:  # flat: tiles, whatever the row length
            return False, f"row of {n} exceeds the register capacity {capacity}"
        smallest = s.threads_per_row == MIN_THREADS_PER_ROW and s.chunks == 1
        if n <= capacity // 2 and not s.flat and check and not smallest:
            return False, f"row of {n} fills under half of the capacity {capacity}"
        regs = estimate_registers(ir, s)
        if regs > REGISTER_BUDGET_PER_THREAD:
            return False, f"about {regs} registers per thread"
    else:
        if n < per_pass * s.chunks:
            return False, "stream mode on a row shorter than one iteration"
    return True, ""


def _sub_warp_reason(ir: KernelIR, s: Schedule, dims: dict[str, int]) -> str:
    """Why a layout of fewer than 32 threads per row does not fit ("" where it does). Such rows
    share a warp (32 / threads_per_row of them), so each warp must be whole (in a persistent
    grid the warp leaves its row loop as one, see holds_cols); they are for rows a warp
    would hold in one round of its 16-byte chunks (a row of at most 256 bf16 or 128 fp32
    elements), held in registers."""
    if (s.threads_per_row * s.rows_per_block) % 32:
        return "rows under a warp need whole warps per block (threads_per_row x rows_per_block)"
    if s.mode != "cached":
        return "rows under a warp are held in registers (cached)"
    n = int(dims[ir.row_dim])
    if not short_row(ir, n):
        return f"a row of {n} fills more than a round of a warp's 16-byte chunks: a warp or more"
    return ""


ROWS_PER_THREAD_RULE = (
    "rows_per_thread needs the cached mode, rows of a warp or less and one row group per block "
    "(no persistent grid, prefetch, tiles or cluster), not the shifted tail"
)


def rows_per_thread_ok(s: Schedule) -> bool:
    """Whether `s` may hold several rows a thread (ROWS_PER_THREAD_RULE; the emitter's rule
    too); any layout of one row a thread may."""
    return s.rows_per_thread == 1 or not (
        s.mode != "cached"
        or s.flat
        or s.threads_per_row > 32
        or s.persistent_blocks_per_sm
        or s.prefetch_rows
        or s.cluster_blocks > 1
        or s.tail == "shifted"
    )


def holds_cols(s: Schedule) -> bool:
    """Whether early_cols means per-column vectors loaded once, before the first row, and held
    in registers across every row the thread works on: rows under a warp in a persistent grid
    (a short row's columns are a few registers; the shifted tail moves them with each row, so
    not there). Elsewhere early_cols loads them with each row."""
    return (
        s.early_cols
        and s.threads_per_row < 32
        and bool(s.persistent_blocks_per_sm)
        and s.tail != "shifted"
    )


def short_row(ir: KernelIR, n: int, limit: int = SHORT_ROW_BYTES) -> bool:
    """Whether a row of n elements is one for fewer threads than a warp (see Schedule): at
    most `limit` bytes of the narrowest tensor."""
    return int(n) * ir.min_elem_bytes() <= limit


def narrow_vec(ir: KernelIR, dims_list: list[dict[str, int]]) -> int:
    """The elements of an 8-byte chunk of the narrowest tensor, where every row of `dims_list`
    is at most NARROW_ROW_BYTES long and a multiple of it but not of a 16-byte chunk (100
    bf16: 200-byte rows, every other one off a 16-byte boundary, all on an 8-byte one): there
    8-byte chunks start every row aligned and need no tail but the last chunk's; else 0."""
    v = 8 // ir.min_elem_bytes()
    rows = [int(d[ir.row_dim]) for d in dims_list]
    if not rows or not all(short_row(ir, n, NARROW_ROW_BYTES) for n in rows):
        return 0
    return v if all(n % v == 0 for n in rows) and any(n % (2 * v) for n in rows) else 0


def _modes_for(ir: KernelIR) -> list[tuple[str, bool]]:
    out = [("cached", False), ("stream", False)]
    if ir.online:
        out += [("cached", True), ("stream", True)]
    return out


def _occupancy_options(threads_per_block: int) -> list[tuple[int, bool, int]]:
    """(persistent_blocks_per_sm, prefetch_rows, min_threads_per_sm) combinations worth trying:
    plain; registers capped for 768 to 2048 threads per SM (1280 and 1792 fill the steps
    between 4, 5, 6 and 7 blocks of 256 threads: 64, 51, 42 and 36 registers); a persistent
    grid of k blocks per SM that prefetches the next row, with registers capped so that the k
    blocks are resident."""
    out = [(0, False, 0)] + [
        (0, False, m) for m in (768, 1024, 1280, 1536, 1792, 2048) if m >= threads_per_block
    ]
    for k in (2, 4, 6, 8):
        if k * threads_per_block <= 2048 and (k * threads_per_block) % 256 == 0:
            out.append((k, True, k * threads_per_block))
    return out


def fewest_chunks(n: int, threads: int, vec: int) -> int:
    """The fewest chunks of `vec` elements that cover a row of `n` at `threads` threads per row
    (e.g. 5 for 5000 columns at 128 threads of 8)."""
    return -(-int(n) // (threads * vec))


def _fewest_chunks(ir: KernelIR, threads: int, vec: int, dims_list) -> set[int]:
    """Per shape of the job, fewest_chunks of its row."""
    return {fewest_chunks(d[ir.row_dim], threads, vec) for d in dims_list}


def fits_job(ir: KernelIR, s: Schedule, dims_list: list[dict[str, int]]) -> bool:
    """Whether `s` is a candidate for a job of `dims_list` (one kernel serves every shape of a
    job): valid at each shape; or a row held in registers that is valid at one shape at least
    and at the others in all but its capacity, where a longer row streams through the kernel's
    long-row path and a shorter one leaves chunks idle. No register layout holds rows of both
    4096 and 8192, so without the second rule a job at the suite's three shapes could only time
    streaming layouts, slower than the register-held ones at 4096 (bench/results/
    ROW-FAMILY-NOTES.md, fits_job)."""
    verdicts = [is_valid(ir, s, d)[0] for d in dims_list]
    if all(verdicts):
        return True
    if s.mode != "cached" or s.flat or not any(verdicts):
        return False
    return all(is_valid(ir, s, d, capacity=False)[0] for d in dims_list)


# The last few spaces built, by what decides them (see _space_key). Building one takes seconds
# of CPU (softmax at the suite's three shapes: 99K points, about 7 s and 31 MB), and every
# generation of a job asks for the same one again.
_SPACES: OrderedDict = OrderedDict()
_SPACES_KEPT = 2  # up to ~30 MB each, in every agent worker process
_SPACES_LOCK = threading.Lock()  # a web server's threads may run the agents (eager tasks)


def _space_key(ir: KernelIR, dims_list: list[dict[str, int]]) -> tuple:
    """What a space depends on: the IR's tensors, outputs (their expression trees, compared by
    value), tolerance, and the job's shapes."""
    shapes = tuple(tuple(sorted((k, int(v)) for k, v in d.items())) for d in dims_list)
    return (
        ir.batch_dims,
        ir.row_dim,
        ir.inputs,
        ir.outputs,
        ir.tolerance_rel_norm,
        shapes,
    )


def space(ir: KernelIR, dims_list: list[dict[str, int]]) -> list[Schedule]:
    """Every schedule that fits a job of `dims_list` (the product of the option lists, filtered
    by `fits_job`), in a stable order. A new list each call; the schedules (frozen) are shared
    with the last few calls of the same key."""
    key = _space_key(ir, dims_list)
    with _SPACES_LOCK:
        hit = _SPACES.get(key)
        if hit is not None:
            _SPACES.move_to_end(key)
    if hit is None:  # built outside the lock: two threads may both build it, both right
        path = _space_path(key)
        hit = _space_read(path) if path is not None else None
        if hit is None:
            hit = tuple(_build_space(ir, dims_list))
            if path is not None:
                _space_write(path, hit)
        with _SPACES_LOCK:
            _SPACES[key] = hit
            while len(_SPACES) > _SPACES_KEPT:
                _SPACES.popitem(last=False)
    return list(hit)


# A space is also kept on disk beside the compile cache (factory.compile.cache_dir), so that
# every agent worker process (a prefork pool has one per core, and a job's generations land on
# any of them) reads it back instead of building it again: LayerNorm at 16384x4999 is 55K
# schedules, 2.8 s to build, 0.3 s to read (a 0.3 MB file). The file's name hashes the format,
# this module's source and the space's key, so an edit here makes new names; the least recently
# used files beyond SPACE_FILES_KEPT go.
SPACE_FILE_FORMAT = 1
SPACE_FILES_KEPT = 64
_SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _space_path(key: tuple) -> Path | None:
    from factory.compile import cache_dir

    root = cache_dir()
    if root is None:
        return None
    h = hashlib.sha256(f"space {SPACE_FILE_FORMAT} {_SOURCE_DIGEST} {key!r}".encode())
    return root / "spaces" / f"{h.hexdigest()}.space"


def _space_read(path: Path) -> tuple[Schedule, ...] | None:
    """The space stored at `path`, or None when it is absent, torn or of other fields."""
    try:
        data = json.loads(zlib.decompress(path.read_bytes()))
        if data["fields"] != [f.name for f in fields(Schedule)]:
            return None
        out = tuple(Schedule(*row) for row in data["rows"])
        os.utime(path)  # recently used: the last to be pruned
    except (OSError, ValueError, TypeError, KeyError, zlib.error):
        return None
    return out


def _space_write(path: Path, schedules: tuple[Schedule, ...]) -> None:
    """Atomically (a reader sees the whole file or none); a failure costs only the saving."""
    from factory.compile import remove_oldest, write_atomically

    names = [f.name for f in fields(Schedule)]
    data = {"fields": names, "rows": [[getattr(s, n) for n in names] for s in schedules]}
    try:
        write_atomically(path, zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 1))
    except OSError:
        return
    remove_oldest(list(path.parent.glob("*.space")), SPACE_FILES_KEPT)


def _build_space(ir: KernelIR, dims_list: list[dict[str, int]]) -> list[Schedule]:
    fast_options = [True, False] if fast_math_allowed(ir) else [False]
    keep_options = [True, False] if ir.online else [True]
    # (8-byte chunks too where they, not 16-byte ones, start every short row aligned)
    vecs = sorted(
        {16 // ir.min_elem_bytes(), 32 // ir.min_elem_bytes(), narrow_vec(ir, dims_list)} - {0}
    )
    late_options = [False, True] if has_early_outputs(ir) else [False]
    moment_options = [False, True] if ir.moments else [False]
    early_options = [False, True] if has_col_inputs(ir) else [False]
    # (and one chunk at a time where 4 does not divide the chunks: below, per chunk count)
    group_options = [1, 4] if has_col_inputs(ir) else [1]
    packed_options = [False, True] if packed_pairs(ir) else [False]
    rows = [int(d[ir.row_dim]) for d in dims_list]
    out = []
    # Past 1024 threads a row takes a cluster of 1024-thread blocks (2, 4 or 8 of them).
    # Rows under a warp (threads_per_row 4-16) share warps: their blocks hold 32 to 512 threads.
    threads = (4, 8, 16) if all(short_row(ir, n) for n in rows) else ()
    layouts = [
        (t, r)
        for t in threads + (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
        for r in (1, 2, 4, 8, 16, 32, 64, 128)
        if (r <= 8 if t >= 32 else 32 <= t * r <= 512)
    ]
    for (t, r), v, c, mode_online, lh, sh, fm, keep, late, mom, early, grp, pk in itertools.product(
        layouts,
        vecs,
        range(1, 9),
        _modes_for(ir),
        ("nc", "nc_noalloc", "nc_l2last", "nc_l2reuse"),
        ("none", "cs"),
        fast_options,
        keep_options,
        late_options,
        moment_options,
        early_options,
        group_options,
        packed_options,
    ):
        mode, online = mode_online
        if pk and not online:  # packed_max is an option of the online max/sum only
            continue
        if grp == 4 and c % 4 and c > 1:
            grp = c  # 4 groups need chunks that 4 divides: here one chunk at a time
        if c & (c - 1) and c not in _fewest_chunks(ir, t, v, dims_list):
            continue  # 3, 5, 6 or 7 chunks: only as the fewest that cover a row of the job
        if _never_fits(mode, t * v * c, t == MIN_THREADS_PER_ROW and c == 1, rows):
            continue  # is_valid would refuse every variant below by the row's length alone
        cluster = max(1, t // MAX_THREADS_PER_BLOCK)
        for p, prefetch, min_threads in _occupancy_options(t * r // cluster):
            if p and t < 32:
                # rows under a warp looping in a persistent grid: slower than the same layout
                # without the loop (ROW-FAMILY-NOTES.md, persistent_blocks_per_sm): not searched
                continue
            s = Schedule(
                threads_per_row=t,
                rows_per_block=r,
                vec_elems=v,
                chunks=c,
                mode=mode,
                online=online,
                load_hint=lh,
                store_hint=sh,
                persistent_blocks_per_sm=p,
                fast_math=fm,
                min_threads_per_sm=min_threads,
                keep_intermediates=keep,
                prefetch_rows=prefetch,
                cluster_blocks=cluster,
                late_stores=late,
                moments=mom,
                early_cols=early,
                col_groups=grp,
                packed_max=pk,
            )
            # Beside it, two rows a row group holds at once, where a layout may: the faster at
            # some short rows, the slower at others (ROW-FAMILY-NOTES.md, rows_per_thread), so
            # searched, not a default
            two = replace(s, rows_per_thread=2)
            for lay in [s, two] if rows_per_thread_ok(two) else [s]:
                if not fits_job(ir, lay, dims_list):
                    continue
                fitted = fit_tail(ir, lay, dims_list)
                for x in (fitted, shifted_twin(ir, fitted, dims_list)):
                    if x is not None:
                        out += [x] + [y for y in [split_twin(ir, x, dims_list)] if y is not None]
    return out


def _never_fits(mode: str, capacity: int, smallest: bool, rows: list[int]) -> bool:
    """Whether is_valid refuses a layout of `capacity` elements per row pass (threads x vector x
    chunks) at every row length of `rows` by that length alone, whatever its other fields, so
    that fits_job refuses it too: held in registers, a row past the capacity or filling under
    half of it (but for the smallest layout); streamed, a row shorter than one iteration. (The
    shifted tail, which holds V - 1 elements less, is fitted after fits_job.) Building the space
    skips such layouts before constructing their variants: most points of a short row's space."""
    if mode == "cached":
        return all(n > capacity or (n <= capacity // 2 and not smallest) for n in rows)
    return all(n < capacity for n in rows)


# Row loads of a row of a warp or less (rows up to 1024 bf16 in registers): the read-only path
# without an L2 policy, the faster there (ROW-FAMILY-NOTES.md, load_hint). The suite's longer
# rows keep the evict-last policy.
WARP_ROW_LOAD_HINT = "nc"


def default_rows_per_block(threads_per_row: int) -> int:
    """Rows a block of the default layout and of the seeds: one row group of more than a warp,
    four rows of a warp, and rows under a warp in blocks of 128 threads (see _default_layout)."""
    if threads_per_row > 32:
        return 1
    return 4 if threads_per_row == 32 else 128 // threads_per_row


def default_schedule(ir: KernelIR, dims: dict[str, int]) -> Schedule:
    """A good first layout at `dims`: the row in registers up to 32K elements (4 chunks of 16
    bytes per thread, the fewest threads that cover the row, at least a warp), streaming with
    the online max/sum beyond that; the whole-vector tail where rows of `dims` take it."""
    s = fit_tail(ir, _default_layout(ir, dims), [dims])
    if s.flat:  # tiles are independent of the row's length: the power-of-two layout
        s = replace(s, chunks=4)
    if s.threads_per_row < 32:
        # A short row its chunks do not fill takes one copy of the row's code per path. The
        # joined kernel chooses its path per row there too, and the two are level (by operator,
        # a few percent either way: ROW-FAMILY-NOTES.md, split_paths); the space holds both.
        s = split_twin(ir, s, [dims]) or s
    return s


def _default_layout(ir: KernelIR, dims: dict[str, int]) -> Schedule:
    n = int(dims[ir.row_dim])
    eb = ir.min_elem_bytes()
    v = 16 // eb
    fm = fast_math_allowed(ir)
    online = bool(ir.online)
    if online and not any(o.role == "row" for o in ir.outputs) and n > 32 * v * 8:
        # A per-row result from max/sum-of-exp over a long row (cross-entropy): stream it once
        # with the online pair, four 16-byte chunks in flight per thread. With 4096 rows or more,
        # one warp per row and two rows per block, near the copy ceiling. Fewer rows leave the
        # GPU half empty with a warp each: below 4096 rows, at least 128 threads per row and
        # enough that the rows hold about 128K threads in all (ROW-FAMILY-NOTES.md, Defaults).
        rows = math.prod(int(dims[d]) for d in ir.batch_dims)
        threads = 32
        while (
            rows < 4096
            and (threads < 128 or rows * threads < 131072)
            and threads < MAX_THREADS_PER_BLOCK
            and threads * 2 * v * 4 <= n  # one streaming step must fit in the row
        ):
            threads *= 2
        return Schedule(
            threads_per_row=threads,
            rows_per_block=2 if threads == 32 else 1,
            vec_elems=v,
            chunks=4,
            mode="stream",
            online=True,
            fast_math=fm,
        )
    if short_row(ir, n):
        # A short row (at most 256 bf16): one 16-byte chunk per thread, the fewest threads that
        # cover it, 256 threads a block. One that 16-byte chunks leave misaligned (100 bf16)
        # takes four 8-byte chunks per thread instead. 128 threads a block (as fast as 256 or
        # faster; 32 or 64 are faster in some cases and much slower in others). Past 128 bf16
        # (256 bytes), up to four 16-byte chunks per thread, the fewest threads that cover the
        # row that way (8 for 129-256 bf16), rather than a warp of one chunk each: one chunk a
        # thread leaves a warp 512 bytes in flight, and LayerNorm's 47 registers hold 40 warps
        # an SM. The measurements: ROW-FAMILY-NOTES.md, vec_elems and Defaults.
        nv = narrow_vec(ir, [dims])
        v, per_thread = (nv, 4) if nv else (v, 1 if short_row(ir, n, SHORT_ROW_BYTES // 2) else 4)
        threads = MIN_THREADS_PER_ROW
        while threads * v * per_thread < n:
            threads *= 2
        return Schedule(
            threads_per_row=threads,
            rows_per_block=default_rows_per_block(threads),
            vec_elems=v,
            chunks=fewest_chunks(n, threads, v),
            mode="cached",
            online=False,
            load_hint=WARP_ROW_LOAD_HINT,
            fast_math=fm,
        )
    chunks = 4
    threads = 32
    while threads * v * chunks < n and threads < MAX_THREADS_PER_BLOCK:
        threads *= 2
    if threads * v * chunks >= n:
        # The fewest chunks that cover the row at that many threads: a row of 3072 takes 128
        # threads of 3 chunks, which it fills, rather than 4 (a quarter idle, and every row
        # through the tail path). Powers of two keep 4.
        chunks = fewest_chunks(n, threads, v)
        # The online pair costs a second exp per element when the row is in registers anyway.
        # Row loads with the L2 evict-last policy (ROW-FAMILY-NOTES.md, load_hint). Rows of
        # one warp: without (WARP_ROW_LOAD_HINT).
        return Schedule(
            threads_per_row=threads,
            rows_per_block=default_rows_per_block(threads),
            vec_elems=v,
            chunks=chunks,
            mode="cached",
            online=False,
            load_hint=WARP_ROW_LOAD_HINT if threads == 32 else "nc_l2last",
            fast_math=fm,
        )
    return Schedule(
        threads_per_row=1024,
        rows_per_block=1,
        vec_elems=v,
        chunks=4,
        mode="stream",
        online=online,
        fast_math=fm,
    )
