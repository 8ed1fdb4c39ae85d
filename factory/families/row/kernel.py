"""The row kernel: one group of `threads_per_row` threads per row, one pass per stage.

Layout of a row among the T threads of its group: thread t owns chunks of V consecutive elements
at columns t*V + k*T*V (k = 0, 1, ...), so a warp's 16-byte accesses cover 512 contiguous bytes.
Two ways to walk the row:

- cached: all K chunks are loaded once into registers (every load in flight before the first
  use), and every pass runs over the registers; a row longer than T*V*K takes the stream path.
- stream: every pass loops over the row, U = `chunks` chunks per iteration, loading again (the
  second read of a row usually hits L2).

Each pass has a fast path (every chunk of this thread is whole and 16-byte aligned: vector loads
and stores, no predicates) and a tail path, so every kernel is correct for any M >= 1 and N >= 1.
How the tail path moves a row is the schedule's `tail`: element by element, each under its own
predicate, a thread's elements consecutive ("elements") or strided T apart so that a warp's
accesses are ("strided"); or "vectors": the element tail, and beside it, where N is a multiple
of V and the rows are aligned, each chunk whole or past the row's end, moved as one vector under
one predicate; or "stream": that vector tail alone in registers, a row it cannot serve taking the
stream path (no registers held for an element tail).

Reductions: per-thread accumulators, a butterfly over the warp (shfl.sync.bfly), then, when a row
spans W > 1 warps, one shared-memory slot per warp and a named barrier per row group; every thread
ends with the row's value. A row of T < 32 threads shares its warp with 32 / T others and its
butterfly stays within its T lanes; a row group past the last row works on the last row with its
stores off, so that every lane of a warp reaches each shuffle. max(F) and sum(exp(F - max F))
can run as one online pass.
"""

from __future__ import annotations

from factory.emit import ops
from factory.emit.ptx import LOG2E, Builder, EmitError, f32_literal
from factory.emit.types import Emitted
from factory.families.row.ir import (
    ROLE_COL,
    ROLE_ROW,
    ROLE_ROWSCALAR,
    ROLE_SCALAR,
    ROW,
    SCALAR,
    KernelIR,
    TensorRef,
    reduction_aliases,
)
from factory.families.row.schedules import (
    NUM_SMS,
    ROWS_PER_THREAD_RULE,
    Schedule,
    holds_cols,
    packed_pairs,
    rows_per_thread_ok,
)
from factory.spec import expr as E
from factory.spec.types import KernelParam, Launch

NEG_INF = float("-inf")
IDENTITY = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf")}
COMBINE = {"sum": "add.f32", "mean": "add.f32", "max": "max.f32", "min": "min.f32"}
EXPENSIVE_UNARY = {"exp", "log", "tanh", "erf", "sigmoid", "sqrt", "rsqrt"}
MAX_MATERIALISED_REGS = 64
# A 2-byte column vector's whole chunks on shifted rows move as 4-byte words put in place
# (_col_words); False moves them element by element, as bench/results/2026-12-05-h100-colwords
# does to compare the two.
COL_WORDS = True

LOAD_PREFIX = {
    "none": "ld.global",
    "nc": "ld.global.nc",
    "nc_noalloc": "ld.global.nc.L1::no_allocate",
    "evict_first": "ld.global.nc.L1::evict_first",
    "nc_pf256": "ld.global.nc.L2::256B",
    "nc_l2last": "ld.global.nc.L1::evict_last.L2::cache_hint",
    "nc_l2first": "ld.global.nc.L1::evict_first.L2::cache_hint",
    # per read: nc_l2last where a later pass reads the row again, nc_l2first on its last read
    "nc_l2reuse": "ld.global.nc.L1::evict_first.L2::cache_hint",
    "plain_l2last": "ld.global.L1::evict_last.L2::cache_hint",
}
STORE_PREFIX = {
    "none": "st.global",
    "cs": "st.global.cs",
    "noalloc": "st.global.L1::no_allocate",
    "l2first": "st.global.L2::cache_hint",
    "l2last": "st.global.L2::cache_hint",
}
# Hints that carry an L2 cache policy operand (made once per thread by createpolicy): the L2
# keeps the line in preference to others (evict_last) or gives it up first (evict_first).
CACHE_POLICY = {
    "nc_l2last": "evict_last",
    "nc_l2first": "evict_first",
    "nc_l2reuse": "evict_first",
    "plain_l2last": "evict_last",
    "l2first": "evict_first",
    "l2last": "evict_last",
}


def compute_stages(ir: KernelIR, online: bool, moments: bool = False) -> dict[E.Node, int]:
    """Stage of every node; with `online`, a paired sum finishes with its max; with `moments`,
    a variance with its mean."""
    pair_max = {p.sum_node: p.max_node for p in ir.online} if online else {}
    if moments:
        pair_max |= {q.var_node: q.mean_node for q in ir.moments}
    st: dict[E.Node, int] = {}
    for n in ir.order:
        if isinstance(n, E.Input | E.Const):
            st[n] = 0
        elif isinstance(n, E.Reduce):
            st[n] = st[pair_max[n].x] + 1 if n in pair_max else st[n.x] + 1
        elif isinstance(n, E.Gather):
            st[n] = st[n.x]
        else:
            st[n] = max(st[c] for c in E.children(n))
    return st


class _Ctx:
    """Where an element's leaves come from during one evaluation."""

    def __init__(self, kind: str, pass_no: int, e: int = 0, chunk_regs=None, gather=None):
        self.kind = kind  # "elem" or "gather"
        self.pass_no = pass_no
        self.e = e  # element index k*V + j inside the thread's chunk group
        self.chunk_regs = chunk_regs  # name -> list over chunks of lists of b32 regs
        self.gather = gather  # name -> (pred, b64 address) for gathers
        self.memo: dict = {}


class _ShiftChunk:
    """One chunk of a shifted step (see RowKernel._shifted_step): `whole`, a predicate that
    every element lies in the row, and valid(), which emits, where it is called, a predicate
    per element that it does (the loads find them only on the branch that straddling chunks
    take)."""

    def __init__(self, b, rem: str, lo: str | None, whole: str, V: int):
        self.b, self.rem, self.lo, self.whole, self.V = b, rem, lo, whole, V

    def valid(self) -> list[str]:
        b, out = self.b, []
        for j in range(self.V):
            v = b.reg("pred")
            b.op(f"setp.gt.s32 {v}, {self.rem}, {j}")
            if self.lo is not None:  # the row's first chunk: the window's places before it
                after = b.reg("pred")
                b.op(f"setp.le.s32 {after}, {self.lo}, {j}")
                b.op(f"and.pred {v}, {v}, {after}")
            out.append(v)
        return out


class RowKernel:
    def __init__(self, ir: KernelIR, s: Schedule, arch: str = "sm_90"):
        if s.family != "row":
            raise EmitError(f"the row emitter cannot render family {s.family}")
        self.ir, self.s, self.arch = ir, s, arch
        self.b = Builder()
        self.T = s.threads_per_row  # the row's threads, across the cluster when there is one
        self.C = s.cluster_blocks
        self.TB = self.T // self.C  # the row's threads in one block
        self.R = s.rows_per_block
        self.V = s.vec_elems
        self.W = max(1, self.TB // 32)  # warps of one row in one block
        # Rows shorter than a warp needs: a warp holds 32 / T rows, each reduced by a butterfly
        # over its own T lanes (xor offsets below T stay inside the row's aligned lanes).
        self.bfly = [o for o in (16, 8, 4, 2, 1) if o < self.TB]
        if self.TB < 32 and (self.TB * self.R) % 32:
            # every lane of a warp must reach each shuffle (full mask): whole warps (and in a
            # persistent grid a row loop the warp leaves as one: _clamp_row)
            raise EmitError("rows under a warp need whole warps per block")
        if self.C > 1 and (self.R != 1 or s.persistent_blocks_per_sm or int(arch[3:]) < 90):
            raise EmitError("a cluster row needs sm_90+, one row per block, no persistent grid")
        if self.C > 1 and self.W < 2:
            # the cluster step follows the shared-memory step across a block's warps
            raise EmitError("a cluster row needs at least two warps per block")
        self.K = s.rows_per_thread  # rows each row group holds at once (_rows_body)
        if not rows_per_thread_ok(s):
            raise EmitError(ROWS_PER_THREAD_RULE)
        self.fast = s.fast_math
        self.path = None  # under split_paths, the path whose copy of the row is being emitted
        self.mode = "cached"  # the row path being emitted (_row_body sets it)
        self.level = ir.level
        for t in ir.inputs:
            if t.role in (ROLE_ROW, ROLE_COL) and t.elem_bytes not in (2, 4):
                raise EmitError(f"row input {t.name} of {t.dtype}: only 2- and 4-byte elements")
            if t.elem_bytes * self.V < 4:
                raise EmitError("a chunk must be at least 4 bytes of every tensor")
        self.moments = list(ir.moments) if s.moments else []
        if self.moments and self.C > 1:
            raise EmitError("moments across a cluster are not implemented")
        self.fused = {n for q in self.moments for n in (q.mean_node, q.var_node)}
        self.stages = compute_stages(ir, s.online, bool(self.moments))
        self.pairs = list(ir.online) if s.online else []
        self.packed_pairs = set(packed_pairs(ir)) if s.packed_max else set()
        self.pair_sums = {p.sum_node for p in self.pairs}
        self.num_passes = self._num_passes()
        self.scal: dict = {}
        self.ptr: dict[str, str] = {}  # tensor name -> global base pointer (b64)
        self.tptr: dict[str, str] = {}  # tensor name -> this thread's pointer in the row (b64)
        self.rowptr: dict[str, str] = {}  # tensor name -> start of the row (b64)
        self.rowscalar_vals: dict[str, str] = {}
        self.index_vals: dict[str, str] = {}
        # max(x, keepdims=True) and max(x) are one value: only the first is computed.
        self.alias = reduction_aliases(ir.reductions)
        self.red_items_total = self._count_reduce_regs()
        self.red_slot = 0

    # ---------------------------------------------------------------- structure of the work

    def _num_passes(self) -> int:
        last = 0
        for r in self.ir.reductions:
            if r in self.pair_sums or r in self.fused:
                continue
            last = max(last, self.stages[r.x])
        for q in self.moments:
            last = max(last, self.stages[q.x_node])
        for o in self.ir.outputs:
            if o.role == ROLE_ROW:
                last = max(last, self.stages[o.node])
        return last + 1

    def _count_reduce_regs(self) -> int:
        n = sum(
            1
            for r in self.ir.reductions
            if r not in self.pair_sums and r not in self.alias and r not in self.fused
        )
        # a pair carries two values, its max is already counted; moments carry three
        return n + len(self.pairs) + 3 * len(self.moments)

    def _canon(self, r: E.Reduce) -> E.Reduce:
        return self.alias.get(r, r)

    def _pass_roots(self, p: int):
        """(regular reductions, online pairs, row outputs) finishing their work in pass p."""
        reds = [
            r
            for r in self.ir.reductions
            if r not in self.pair_sums
            and r not in self.alias
            and r not in self.fused
            and self.stages[r.x] == p
            and not any(self._canon(q.max_node) == r for q in self.pairs)
        ]
        pairs = [q for q in self.pairs if self.stages[q.f_node] == p]
        outs = [o for o in self.ir.outputs if o.role == ROLE_ROW and self._out_pass(o) == p]
        return reds, pairs, outs

    def _out_pass(self, o) -> int:
        """The pass that writes row output o: where its value is ready, or with late_stores (the
        row in registers) the last pass, so that every store follows every load."""
        if self.s.late_stores and getattr(self, "mode", None) == "cached":
            return self.num_passes - 1
        return self.stages[o.node]

    def _pass_moments(self, p: int) -> list:
        """Mean/variance pairs computed together in pass p (the `moments` schedule)."""
        return [q for q in self.moments if self.stages[q.x_node] == p]

    def _root_nodes(self, p: int) -> list[E.Node]:
        reds, pairs, outs = self._pass_roots(p)
        return (
            [r.x for r in reds]
            + [q.f_node for q in pairs]
            + [o.node for o in outs]
            + [q.x_node for q in self._pass_moments(p)]
        )

    def _row_closure(self, roots, stop=frozenset()) -> list[E.Node]:
        """Row-level nodes reachable from roots through row-level nodes, operands first."""
        seen: set = set()
        order: list = []

        def visit(n):
            if n in seen or self.level[n] != ROW:
                return
            seen.add(n)
            if n not in stop:
                for c in E.children(n):
                    visit(c)
            order.append(n)

        for r in roots:
            visit(r)
        return order

    def _is_expensive(self, n: E.Node) -> bool:
        if isinstance(n, E.Unary):
            return n.op in EXPENSIVE_UNARY
        if isinstance(n, E.Binary):
            return n.op in ("div", "pow") and self.level.get(n.b) == ROW
        return False

    def _plan_materialised(self) -> list[E.Node]:
        """Cached mode: expensive row intermediates computed in one pass and needed in a later
        one are kept in registers instead of recomputed (softmax's exp(x - max))."""
        chosen: list[E.Node] = []
        if not self.s.keep_intermediates:
            return chosen
        per_node = self.s.chunks * self.V
        for p in range(1, self.num_passes):
            for n in self._row_closure(self._root_nodes(p)):
                if (
                    self.stages[n] < p
                    and not isinstance(n, E.Input)
                    and self._is_expensive(n)
                    and n not in chosen
                    and (len(chosen) + 1) * per_node <= MAX_MATERIALISED_REGS
                ):
                    chosen.append(n)
        return chosen

    # ---------------------------------------------------------------- emission entry

    def render(self) -> Emitted:
        ir, s, b = self.ir, self.s, self.b
        entry = f"{_ident(ir.name)}_{s.tag()}"
        tensors = [t for t in ir.inputs] + [TensorRef(o.name, o.dtype, o.role) for o in ir.outputs]
        self.tensors = {t.name: t for t in tensors}
        self.tensor_list = tensors
        self.out_refs = {o.name: o for o in ir.outputs}
        dims = list(ir.batch_dims) + [ir.row_dim]
        params = tuple(KernelParam(kind="tensor", ptx_type="u64", name=t.name) for t in tensors)
        params += tuple(KernelParam(kind="dim", ptx_type="u32", name=d) for d in dims)

        self._prologue(tensors, dims)
        self.col_held = {}
        if holds_cols(s):
            self._hold_cols()
        self.prefetch = s.mode == "cached" and s.prefetch_rows
        if self.prefetch:
            self._prefetch_first_row()
        loop, done, next_row = b.new_label("row"), b.new_label("done"), b.new_label("next")
        b.label(loop)
        p = self.flat_done
        if self.row_raw:
            p, lead = b.reg("pred"), b.reg("b32")
            b.comment("the warp's first row: all its lanes leave the loop together")
            b.op(f"sub.u32 {lead}, {self.row_raw}, {self.warp_lead}")
            b.op(f"setp.ge.u32 {p}, {lead}, {self.rows}")
        elif p is None:
            p = b.reg("pred")
            b.op(f"setp.ge.u32 {p}, {self.row}, {self.rows}")
        b.op(f"@{p} bra {done}")
        if self.row_raw:
            self._clamp_row()
        if self.K == 1:  # (several rows a thread: each row's pointers in _rows_body)
            self._row_pointers(tensors)
        if s.flat:
            b.comment("a tile is never longer than the registers hold")
            self._row_body("cached")
        elif s.mode == "cached":
            stream_label = b.new_label("long_row")
            capacity = self.T * self.V * s.chunks
            if s.tail == "shifted":  # a row shifted back up to V - 1 elements must still fit
                capacity -= self.V - 1
            pl = b.reg("pred")
            b.op(f"setp.gt.u32 {pl}, {self.N}, {capacity}")
            b.op(f"@{pl} bra {stream_label}")
            if s.tail == "stream":
                b.comment("a row not of whole vectors streams too: no element tail in registers")
                b.op(f"@!{self.vec_ok} bra {stream_label}")
            b.comment(f"the row fits in registers (N <= {capacity})")
            if s.split_paths:
                self._split_row_bodies(next_row)
            else:
                self._rows_body("cached")
            b.op(f"bra.uni {next_row}")
            b.label(stream_label)
            b.comment("longer rows: stream every pass from memory")
        if not s.flat:
            self._rows_body("stream")
        b.label(next_row)
        if s.persistent_blocks_per_sm:
            if self.W > 1 and self.red_items_total:
                b.comment("shared reduction slots are reused by the next row")
                b.op(self.bar)
            counter = self.row_raw or self.row
            b.op(f"add.u32 {counter}, {counter}, {self.row_stride}")
            b.op(f"bra.uni {loop}")
        else:
            # One row group per block (the grid covers every row): no loop, so nothing has to
            # stay live for a next row (on the H200 that is 48 -> 40 registers for softmax at
            # 256 threads, hence more blocks per SM).
            b.comment("one row group per block: done")
        b.label(done)
        if self.C > 1:
            b.comment("no block leaves while another of its cluster may read its shared memory")
            self._cluster_barrier()
        b.op("ret")

        ptx = self._assemble(entry, params)
        rows_expr = "*".join(ir.batch_dims) if ir.batch_dims else "1"
        grid_x: int | str = f"ceildiv({rows_expr}, {self.R * self.K})"
        if s.flat:
            grid_x = f"ceildiv(({rows_expr})*{ir.row_dim}, {self.T * self.V * s.chunks})"
        if s.persistent_blocks_per_sm:
            grid_x = f"min(ceildiv({rows_expr}, {self.R}), {NUM_SMS * s.persistent_blocks_per_sm})"
        cluster = None
        if self.C > 1:
            grid_x, cluster = f"({rows_expr})*{self.C}", (self.C, 1, 1)
        launch = Launch(
            grid=(grid_x, 1, 1), block=(self.TB * self.R, 1, 1), smem_bytes=0, cluster=cluster
        )
        return Emitted(ptx=ptx, entry=entry, params=params, launch=launch)

    def _split_row_bodies(self, next_row: str) -> None:
        """The row in registers as one whole copy of the row's code per path, chosen once per
        row and the same for all its threads: whole chunks; under the "vectors" tail, a tail of
        whole vectors; the schedule's tail. ptxas then allocates registers for the path a row
        takes, not for the paths joined at every pass (LayerNorm 16384x5000 at 128 threads of 5
        chunks: each path alone fits 80 registers, the joined kernel takes 123)."""
        b = self.b
        whole = b.reg("pred")
        b.op(f"setp.ge.u32 {whole}, {self.N}, {self.s.chunks * self.T * self.V}")
        b.op(f"and.pred {whole}, {whole}, {self.vec_ok}")  # as fast_cached, for every thread
        ragged = b.new_label("row_tail")
        b.op(f"@!{whole} bra {ragged}")

        def copy(path: str, note: str) -> None:
            b.comment(f"the row's {note} path")
            self.path = path
            self._rows_body("cached")
            self.path = None

        copy("fast", "whole chunks")
        b.op(f"bra.uni {next_row}")
        b.label(ragged)
        if self.s.tail == "stream":  # (a row not of whole vectors streams: no element copy)
            copy("vectors", "vectors")
            return
        if self.s.tail == "vectors":
            elems = b.new_label("row_elems")
            b.op(f"@!{self.vec_ok} bra {elems}")
            copy("vectors", "vectors")
            b.op(f"bra.uni {next_row}")
            b.label(elems)
        copy("tail", "tail")

    def _assemble(self, entry: str, params) -> str:
        head = [
            f"// Generated by factory.emit for workload {self.ir.name!r}",
            f"// schedule: {self.s.to_dict()}",
            ".version 9.0",
            f".target {self.arch}",
            ".address_size 64",
            "",
            f".visible .entry {entry}(",
        ]
        plines = [f"    .param .{p.ptx_type} p_{_ident(p.name)}" for p in params]
        head.append(",\n".join(plines))
        head.append(f")\n.maxntid {self.TB * self.R}, 1, 1")
        if self.C > 1:
            head.append(f".reqnctapercluster {self.C}, 1, 1")
        if self.s.min_threads_per_sm:
            blocks = max(1, self.s.min_threads_per_sm // (self.TB * self.R))
            head.append(f".minnctapersm {blocks}")
        head.append("{")
        body = self.b.declarations()
        if self.W > 1 and self.red_items_total:
            words = self.R * self.red_items_total * self.W
            body.append(f"    .shared .align 16 .f32 red_smem[{words}];")
        if self.C > 1 and self.red_items_total:
            # one (value, second value) slot per reduction stage: what this block publishes
            body.append(f"    .shared .align 8 .f32 cl_smem[{2 * self.red_items_total}];")
        return "\n".join(head + body + [""] + self.b.lines + ["}", ""])

    # ---------------------------------------------------------------- prologue and rows

    def _prologue(self, tensors: list[TensorRef], dims: list[str]) -> None:
        b, T, V = self.b, self.T, self.V
        b.comment("parameters")
        for t in tensors:
            r = b.reg("b64")
            b.op(f"ld.param.u64 {r}, [p_{_ident(t.name)}]")
            b.op(f"cvta.to.global.u64 {r}, {r}")
            self.ptr[t.name] = r
        dim_regs = {}
        for d in dims:
            r = b.reg("b32")
            b.op(f"ld.param.u32 {r}, [p_{_ident(d)}]")
            dim_regs[d] = r
        self.N = dim_regs[self.ir.row_dim]
        if self.ir.batch_dims:
            rows = dim_regs[self.ir.batch_dims[0]]
            for d in self.ir.batch_dims[1:]:
                r = b.reg("b32")
                b.op(f"mul.lo.u32 {r}, {rows}, {dim_regs[d]}")
                rows = r
        else:
            rows = b.reg("b32")
            b.op(f"mov.u32 {rows}, 1")
        self.rows = rows
        self.row_len = self.N  # elements from one row's start to the next's
        self.flat_done = None
        if self.s.flat:
            self._flat_tiles(rows)
        TB = self.TB
        b.comment(f"{T} threads per row, {self.R} rows per block, {V} elements per chunk")
        if self.C > 1:
            b.comment(f"a cluster of {self.C} blocks of {TB} threads shares each row")
        tid = b.reg("b32")
        b.op(f"mov.u32 {tid}, %tid.x")
        g = b.reg("b32")
        b.op(f"shr.u32 {g}, {tid}, {TB.bit_length() - 1}")
        t = b.reg("b32")
        b.op(f"and.b32 {t}, {tid}, {TB - 1}")
        lane = b.reg("b32")
        b.op(f"and.b32 {lane}, {tid}, 31")
        self.lane = lane
        self.warp = b.reg("b32")
        b.op(f"shr.u32 {self.warp}, {t}, 5")
        self.cta_t0 = None
        if self.C > 1:
            self.cta_t0 = b.reg("pred")
            b.op(f"setp.eq.u32 {self.cta_t0}, {t}, 0")
            self.rank = b.reg("b32")
            b.op(f"mov.u32 {self.rank}, %cluster_ctarank")
            tr = b.reg("b32")
            b.op(f"mad.lo.u32 {tr}, {self.rank}, {TB}, {t}")
            t = tr
        self.g, self.t = g, t
        # Several multi-warp row groups in a block without a persistent grid share the block
        # barrier: every group makes the same passes (all rows have N elements), so they meet
        # at every barrier. A group past the last row works on the last row with its stores
        # switched off (row_ok), so that it still arrives at each barrier. Rows under a warp
        # do the same, so that every lane of a warp reaches each shuffle.
        self.shared_bar = self.R > 1 and self.TB > 32 and not self.s.persistent_blocks_per_sm
        self.clamped = self.shared_bar or (self.R > 1 and self.TB < 32) or self.K > 1
        self.row_ok = None
        if self.R == 1 or self.TB <= 32 or self.shared_bar:
            # The block barrier. An immediate id matters: a barrier id held in a register makes
            # ptxas reserve all 16 barriers, and the SM then holds far fewer blocks at once.
            self.bar = "bar.sync 0"
        else:
            # Several multi-warp row groups per block: each syncs on its own named barrier.
            bar_id = b.reg("b32")
            b.op(f"add.u32 {bar_id}, {g}, 1")
            self.bar = f"bar.sync {bar_id}, {TB}"
        self.policy = {}  # "load"/"store" -> the b64 cache policy operand, for hints that take one
        for kind, hint in (("load", self.s.load_hint), ("store", self.s.store_hint)):
            if hint in CACHE_POLICY:
                r = b.reg("b64")
                b.op(f"createpolicy.fractional.L2::{CACHE_POLICY[hint]}.b64 {r}, 1.0")
                self.policy[kind] = f", {r}"
        if self.s.load_hint == "nc_l2reuse" or self.s.col_hint == "nc_l2last":
            # the evict-last policy of rows read again and of per-column vectors
            r = b.reg("b64")
            b.op(f"createpolicy.fractional.L2::evict_last.b64 {r}, 1.0")
            self.policy["keep"] = f", {r}"
        self.cur_pass = None  # the pass whose loads are being emitted (None: the up-front loads)
        self.zero_padded: dict[E.Reduce, bool] = {}  # _zero_padded's answers
        self.tv = b.reg("b32")
        b.op(f"mul.lo.u32 {self.tv}, {t}, {V}")
        b.comment("vector path: N a multiple of V and every row-wise pointer 16-byte aligned")
        nm = b.reg("b32")
        b.op(f"and.b32 {nm}, {self.N}, {V - 1}")
        vec_ok = b.reg("pred")
        b.op(f"setp.eq.u32 {vec_ok}, {nm}, 0")
        rowwise = [t_ for t_ in tensors if t_.role in (ROLE_ROW, ROLE_COL)]
        if rowwise:
            acc = self.ptr[rowwise[0].name]
            for t_ in rowwise[1:]:
                r = b.reg("b64")
                b.op(f"or.b64 {r}, {acc}, {self.ptr[t_.name]}")
                acc = r
            low = b.reg("b64")
            b.op(f"and.b64 {low}, {acc}, 15")
            al = b.reg("pred")
            b.op(f"setp.eq.u64 {al}, {low}, 0")
            b.op(f"and.pred {vec_ok}, {vec_ok}, {al}")
        self.vec_ok = vec_ok
        if self.s.tail == "shifted":
            b.comment("shifted rows: every row tensor at the same offset within 16 bytes")
            row_t = [t_ for t_ in tensors if t_.role == ROLE_ROW]
            self.shift_ok = b.reg("pred")
            self.shift_first = row_t[0]
            acc = None
            for t_ in row_t[1:]:
                x = b.reg("b64")
                b.op(f"xor.b64 {x}, {self.ptr[row_t[0].name]}, {self.ptr[t_.name]}")
                if acc is not None:
                    b.op(f"or.b64 {x}, {x}, {acc}")
                acc = x
            if acc is None:
                b.op(f"setp.eq.u32 {self.shift_ok}, {self.N}, {self.N}")
            else:
                low = b.reg("b64")
                b.op(f"and.b64 {low}, {acc}, 15")
                b.op(f"setp.eq.u64 {self.shift_ok}, {low}, 0")
            for t_ in tensors:
                if self._moves_as_words(t_):
                    # its whole chunks move as 4-byte words (_col_words): a vector that starts
                    # between two words moves element by element instead, with the rows
                    odd = b.reg("b64")
                    b.op(f"and.b64 {odd}, {self.ptr[t_.name]}, 2")
                    even = b.reg("pred")
                    b.op(f"setp.eq.u64 {even}, {odd}, 0")
                    b.op(f"and.pred {self.shift_ok}, {self.shift_ok}, {even}")
        nf = b.reg("f32")
        b.op(f"cvt.rn.f32.u32 {nf}, {self.N}")
        self.inv_n = b.reg("f32")
        b.op(f"rcp.rn.f32 {self.inv_n}, {nf}")
        self.n_minus_tv = b.reg("b32")
        b.op(f"sub.s32 {self.n_minus_tv}, {self.N}, {self.tv}")
        # Cached mode: every chunk of this thread whole and aligned (the same for every row),
        # taken for the row's or the warp's last thread, so that a warp takes one path.
        # Under the "strided" tail a thread's tail elements are other threads' whole-chunk
        # elements, so the row's threads take one path: the last thread's. So do the threads
        # of a row of a warp or less: the warp's rows are of one length, so a choice per
        # thread would send each of its rows down both paths, one after the other (at rows of
        # 100 in 8 threads of four 8-byte chunks, thread 0's chunks are whole, the others'
        # not). On an H100 at 1048576x100 that took LayerNorm 172.4 -> 147.7 us, RMSNorm
        # 152.0 -> 137.8, softmax 159.4 -> 143.1 (bench/results/2026-12-06-h100-perrow).
        # A row of several warps chooses per warp, by the warp's last thread: every lane of a
        # warp then takes one path, and the warps whose chunks are all whole keep the fast one
        # (at 2000 columns in 64 threads of four chunks, the second warp's lanes 26-31 hold the
        # row's end, and a choice per thread ran both paths in that warp). A thread's chunks
        # are at t*V + k*T*V, so a warp's last lane has the warp's furthest chunk at every k.
        chunks = self.s.chunks
        self.fast_cached = b.reg("pred")
        self.n_minus_last = self.n_minus_tv
        if self.s.tail == "strided" or T < 32 or (T == 32 and self.s.mode == "cached"):
            self.n_minus_last = b.reg("b32")
            b.op(f"sub.s32 {self.n_minus_last}, {self.N}, {(T - 1) * V}")
        elif T > 32:
            last_lane = b.reg("b32")
            b.op(f"or.b32 {last_lane}, {self.t}, 31")
            self.n_minus_last = b.reg("b32")
            b.op(f"mul.lo.u32 {self.n_minus_last}, {last_lane}, {V}")
            b.op(f"sub.s32 {self.n_minus_last}, {self.N}, {self.n_minus_last}")
        b.op(f"setp.ge.s32 {self.fast_cached}, {self.n_minus_last}, {(chunks - 1) * T * V + V}")
        b.op(f"and.pred {self.fast_cached}, {self.fast_cached}, {vec_ok}")
        self.N64 = b.reg("b64")
        b.op(f"cvt.u64.u32 {self.N64}, {self.N}")
        # Byte offset of this thread's first chunk, per element size; under the "strided" tail
        # also how far its strided elements start before it (t*(V-1) elements: _elem_preds).
        strided = self.s.tail == "strided"
        if strided:
            self.t_v1 = b.reg("b32")
            b.op(f"mul.lo.u32 {self.t_v1}, {t}, {V - 1}")
        self.tv_bytes: dict[int, str] = {}
        self.tv1_bytes: dict[int, str] = {}
        for eb in sorted({t_.elem_bytes for t_ in rowwise}):
            r = b.reg("b64")
            b.op(f"mul.wide.u32 {r}, {self.tv}, {eb}")
            self.tv_bytes[eb] = r
            if strided:
                r = b.reg("b64")
                b.op(f"mul.wide.u32 {r}, {self.t_v1}, {eb}")
                self.tv1_bytes[eb] = r
        self.tptr0 = {}  # per-column vectors' thread pointers, the same for every row
        for t_ in tensors:
            if t_.role == ROLE_COL:
                r = b.reg("b64")
                b.op(f"add.s64 {r}, {self.ptr[t_.name]}, {self.tv_bytes[t_.elem_bytes]}")
                self.tptr[t_.name] = self.tptr0[t_.name] = r
                self.rowptr[t_.name] = self.ptr[t_.name]
        ctaid = b.reg("b32")
        b.op(f"mov.u32 {ctaid}, %ctaid.x")
        if self.C > 1:  # a row per cluster: blocks C*i .. C*i + C-1 share row i
            b.op(f"shr.u32 {ctaid}, {ctaid}, {self.C.bit_length() - 1}")
        self.row = b.reg("b32")
        b.op(f"mad.lo.u32 {self.row}, {ctaid}, {self.R * self.K}, {g}")
        first_row = self.row
        if self.K > 1:  # (clamped below: the unclamped first row stays for the other rows)
            first_row = b.reg("b32")
            b.op(f"mov.u32 {first_row}, {self.row}")
        self.row_raw = None  # rows under a warp in a row loop: the row before clamping
        if self.clamped:
            self.row_ok = b.reg("pred")
            last = b.reg("b32")
            b.op(f"sub.u32 {last}, {rows}, 1")
            if self.s.persistent_blocks_per_sm:
                # Rows under a warp in a persistent grid: the warp loops while its first row
                # is a row, each group past the last row on the last row with its stores off
                # (_clamp_row, at the top of every iteration), so that all the warp's lanes
                # leave the loop together and reach every shuffle until then.
                self.row_raw, self.row, self.row_last = self.row, b.reg("b32"), last
                self.warp_lead = b.reg("b32")  # groups of this warp before this one
                b.op(f"and.b32 {self.warp_lead}, {g}, {32 // TB - 1}")
            else:
                b.op(f"setp.lt.u32 {self.row_ok}, {self.row}, {rows}")
                b.op(f"min.u32 {self.row}, {self.row}, {last}")
        nct = b.reg("b32")
        b.op(f"mov.u32 {nct}, %nctaid.x")
        if self.C > 1:
            b.op(f"shr.u32 {nct}, {nct}, {self.C.bit_length() - 1}")
        self.row_stride = b.reg("b32")
        b.op(f"mul.lo.u32 {self.row_stride}, {nct}, {self.R}")
        self.is_t0 = b.reg("pred")
        b.op(f"setp.eq.u32 {self.is_t0}, {t}, 0")
        if self.K > 1:
            self._slot_rows(first_row, last)
        if self.row_raw:
            self.t_zero, self.is_t0 = self.is_t0, b.reg("pred")
            self._clamp_row()
        elif self.row_ok:  # the row's first thread writes its per-row outputs
            b.op(f"and.pred {self.is_t0}, {self.is_t0}, {self.row_ok}")
        self.lane0 = b.reg("pred")
        b.op(f"setp.eq.u32 {self.lane0}, {lane}, 0")
        if self.W > 1 and self.red_items_total:
            base = b.reg("b32")
            b.op(f"mov.u32 {base}, red_smem")
            gb = b.reg("b32")
            b.op(f"mad.lo.u32 {gb}, {g}, {self.red_items_total * self.W * 4}, {base}")
            self.red_group = gb
            wb = b.reg("b32")
            b.op(f"shl.b32 {wb}, {self.warp}, 2")
            self.red_write = b.reg("b32")
            b.op(f"add.u32 {self.red_write}, {gb}, {wb}")
        b.blank()

    def _slot_rows(self, first_row: str, last: str) -> None:
        """Several rows a thread: the group's rows are first_row + j * R (j < K), each clamped
        to the last row with its stores off past it, as a group past the last row is."""
        b = self.b
        self.slots = []
        for j in range(self.K):
            raw, ok, row, t0 = b.reg("b32"), b.reg("pred"), b.reg("b32"), b.reg("pred")
            b.op(f"add.u32 {raw}, {first_row}, {j * self.R}")
            b.op(f"setp.lt.u32 {ok}, {raw}, {self.rows}")
            b.op(f"min.u32 {row}, {raw}, {last}")
            b.op(f"and.pred {t0}, {self.is_t0}, {ok}")
            self.slots.append({"row": row, "row_ok": ok, "is_t0": t0})

    def _rows_body(self, mode: str) -> None:
        """The row body, or with several rows a thread (rows_per_thread), each row's: held in
        registers, every row's loads first, then each row's passes and stores, so that the
        loads of all of them are in flight together and ptxas may overlap their reductions;
        streamed, one row after the other."""
        if self.K == 1:
            self._row_body(mode)
            return
        b = self.b
        per_row = ("rowptr", "tptr", "rowscalar_vals", "index_vals")  # what _row_pointers sets
        loaded = []
        for j, slot in enumerate(self.slots):
            b.comment(f"row {j + 1} of this thread's {self.K}")
            self.row, self.row_ok, self.is_t0 = slot["row"], slot["row_ok"], slot["is_t0"]
            for k in per_row:
                setattr(self, k, dict(getattr(self, k)))
            self._row_pointers(self.tensor_list)
            held = self._row_loads() if mode == "cached" else None
            state = {k: getattr(self, k) for k in ("row", "row_ok", "is_t0", *per_row)}
            if held is None:
                self._row_body(mode)
            else:
                loaded.append((state, held))
        for j, (state, held) in enumerate(loaded):
            b.comment(f"row {j + 1} of {self.K}: its passes and stores")
            for k, v in state.items():
                setattr(self, k, v)
            self._row_body(mode, held=held)

    def _clamp_row(self) -> None:
        """This iteration's row of a persistent loop over rows under a warp: the last row, with
        its stores off, for a group past it (row_ok; is_t0 writes per-row outputs)."""
        b = self.b
        b.op(f"setp.lt.u32 {self.row_ok}, {self.row_raw}, {self.rows}")
        b.op(f"min.u32 {self.row}, {self.row_raw}, {self.row_last}")
        b.op(f"and.pred {self.is_t0}, {self.t_zero}, {self.row_ok}")

    def _hold_cols(self) -> None:
        """holds_cols: every per-column vector the kernel reads, loaded into registers once,
        before the first row (whole chunks or the tail, as a row's loads: both depend on N
        only); the cached passes of every row read them there."""
        names = [t.name for t in self.ir.inputs if t.role == ROLE_COL]
        self.col_held = self._alloc_chunk_regs(names, self.s.chunks)
        if names:
            b = self.b
            b.comment("per-column vectors, held in registers across every row")
            skip = b.new_label("cols_held")
            if self.s.tail == "stream":  # (rows not of whole vectors stream, reading them there)
                b.op(f"@!{self.vec_ok} bra {skip}")
            self._cached_loads(self.col_held, names, self.s.chunks, self.tptr)
            b.label(skip)

    def _flat_tiles(self, rows: str) -> None:
        """Schedule.flat: the M*N elements as one run in tiles of the capacity K, tile i the
        block's "row" i; N becomes this tile's length (K, or what is left for the last)."""
        b = self.b
        k = self.T * self.V * self.s.chunks
        b.comment(f"flat: the rows as one run of M*N elements, a tile of {k} per block")
        total = b.reg("b64")
        b.op(f"mul.wide.u32 {total}, {rows}, {self.N}")
        tile = b.reg("b32")
        b.op(f"mov.u32 {tile}, %ctaid.x")
        start = b.reg("b64")
        b.op(f"mul.wide.u32 {start}, {tile}, {k}")
        self.flat_done = b.reg("pred")  # a block past the run (none, at the grid we launch)
        b.op(f"setp.ge.u64 {self.flat_done}, {start}, {total}")
        left = b.reg("b64")
        b.op(f"sub.s64 {left}, {total}, {start}")
        b.op(f"min.u64 {left}, {left}, {k}")
        n = b.reg("b32")
        b.op(f"cvt.u32.u64 {n}, {left}")
        self.N, self.row_len = n, str(k)

    def _row_pointers(self, tensors: list[TensorRef]) -> None:
        b = self.b
        b.comment("this row's pointers")
        row_elems = b.reg("b64")
        b.op(f"mul.wide.u32 {row_elems}, {self.row}, {self.row_len}")
        row64 = b.reg("b64")
        b.op(f"cvt.u64.u32 {row64}, {self.row}")
        for t in tensors:
            if t.role == ROLE_ROW:
                off = b.reg("b64")
                b.op(f"mul.lo.u64 {off}, {row_elems}, {t.elem_bytes}")
                rp = b.reg("b64")
                b.op(f"add.s64 {rp}, {self.ptr[t.name]}, {off}")
                self.rowptr[t.name] = rp
                tp = b.reg("b64")
                b.op(f"add.s64 {tp}, {rp}, {self.tv_bytes[t.elem_bytes]}")
                self.tptr[t.name] = tp
            elif t.role in (ROLE_ROWSCALAR, ROLE_SCALAR):
                if t.role == ROLE_ROWSCALAR:
                    off = b.reg("b64")
                    b.op(f"mul.lo.u64 {off}, {row64}, {t.elem_bytes}")
                    a = b.reg("b64")
                    b.op(f"add.s64 {a}, {self.ptr[t.name]}, {off}")
                else:
                    a = self.ptr[t.name]
                self.rowptr[t.name] = a
                if t.name in self.ir.input_by_name:
                    self._load_row_scalar(t, a)
        if self.s.tail == "shifted":
            self._shift_row(tensors)

    def _shift_row(self, tensors: list[TensorRef]) -> None:
        """Tail "shifted": this row walked from the 16-byte-aligned address at or before its
        start. a = the elements between the two (0 where the row tensors are not congruent
        modulo 16 bytes: then no chunk counts as whole and every element moves alone); every
        row-wise thread pointer moves back a elements (a per-column vector's too, which keeps
        element c at window position c + a, so that its chunks are never aligned); the
        window holds N + a elements, of which the first a are the row before's."""
        b = self.b
        eb = self.shift_first.elem_bytes
        lowb = b.reg("b64")
        b.op(f"and.b64 {lowb}, {self.rowptr[self.shift_first.name]}, 15")
        a = b.reg("b32")
        b.op(f"cvt.u32.u64 {a}, {lowb}")
        b.op(f"shr.u32 {a}, {a}, {eb.bit_length() - 1}")
        b.op(f"@!{self.shift_ok} mov.u32 {a}, 0")
        for t in tensors:
            if t.role not in (ROLE_ROW, ROLE_COL):
                continue
            back = b.reg("b64")
            b.op(f"mul.wide.u32 {back}, {a}, {t.elem_bytes}")
            r = b.reg("b64")
            b.op(f"sub.s64 {r}, {self.tptr0.get(t.name, self.tptr[t.name])}, {back}")
            self.tptr[t.name] = r
        self.n_window = b.reg("b32")  # the window's elements from this thread's first on
        b.op(f"add.s32 {self.n_window}, {self.n_minus_tv}, {a}")
        self.window = b.reg("b32")  # the window's elements: N + a
        b.op(f"add.u32 {self.window}, {self.N}, {a}")
        self.shift_lo = b.reg("b32")  # window elements before the row, from this thread's first
        b.op(f"sub.s32 {self.shift_lo}, {a}, {self.tv}")

    def _load_row_scalar(self, t: TensorRef, addr: str) -> None:
        b = self.b
        if t.dtype in E.INDEX_DTYPES:
            r = b.reg("b64")
            if t.dtype == "int64":
                b.op(f"ld.global.nc.s64 {r}, [{addr}]")
            else:
                r32 = b.reg("b32")
                b.op(f"ld.global.nc.s32 {r32}, [{addr}]")
                b.op(f"cvt.s64.s32 {r}, {r32}")
            self.index_vals[t.name] = r
            return
        f = b.reg("f32")
        if t.dtype == "fp32":
            b.op(f"ld.global.nc.f32 {f}, [{addr}]")
        else:
            h = b.reg("b16")
            b.op(f"ld.global.nc.b16 {h}, [{addr}]")
            b.op(f"cvt.f32.{'bf16' if t.dtype == 'bf16' else 'f16'} {f}, {h}")
        self.rowscalar_vals[t.name] = f

    # ---------------------------------------------------------------- the body of one row

    def _used_inputs(self, mode: str) -> list[str]:
        """The inputs this row's passes read, in first use; sets the row's plan (materialised
        intermediates, the last pass that reads each input)."""
        self.mode = mode
        self.materialised = self._plan_materialised() if mode == "cached" else []
        mat_set = set(self.materialised)
        used_inputs: list[str] = []
        self.last_read: dict[str, int] = {}  # the last pass that reads each input
        for p in range(self.num_passes):
            stop = {n for n in mat_set if self.stages[n] < p}
            for n in self._row_closure(self._root_nodes(p) + self._mat_roots(p), stop):
                if isinstance(n, E.Input):
                    self.last_read[n.name] = p
                    if n.name not in used_inputs:
                        used_inputs.append(n.name)
        return used_inputs

    def _row_loads(self) -> dict:
        """The row's up-front loads in cached mode: row data, and per-column vectors with it
        under early_cols (or held from before the first row); the registers they land in."""
        used_inputs = self._used_inputs("cached")
        # Row data is loaded once, up front; per-column vectors (weights) are loaded by the
        # pass that reads them (they stay in L1/L2 across rows, and holding them from the
        # start would cost registers for the whole row).
        row_names = [n for n in used_inputs if self.tensors[n].role == ROLE_ROW]
        if self.s.early_cols and not self.col_held:
            # ...unless early_cols: then they come with the row, off the reduction's path
            # (or are held from before the first row: holds_cols).
            row_names += [n for n in used_inputs if self.tensors[n].role == ROLE_COL]
        held = self._alloc_chunk_regs(row_names, self.s.chunks)
        self._cached_loads(held, row_names, self.s.chunks, self.tptr)
        return held | self.col_held

    def _row_body(self, mode: str, held: dict | None = None) -> None:
        """One row's passes and stores; its loads first (cached mode) unless `held` already
        holds them (_rows_body)."""
        b, s = self.b, self.s
        self.scal = {}
        self.red_slot = 0  # the cached and stream paths never run for the same row
        chunks = s.chunks
        self._used_inputs(mode)
        per_node = chunks * self.V
        self.mat_regs = {n: [b.reg("f32") for _ in range(per_node)] for n in self.materialised}

        # The fallback stream path (rows past the register capacity) keeps few loads in flight
        # so that it does not raise the register count of the whole kernel.
        self.stream_chunks = s.chunks if s.mode == "stream" else min(s.chunks, 2)
        if mode == "cached" and self.prefetch:
            # This row is already in registers (loaded one iteration earlier); start the next
            # row's loads now, so they are in flight while this row is reduced and stored.
            held = dict(self.buf_a) | self.col_held
            nxt = b.reg("b32")
            b.op(f"add.u32 {nxt}, {self.row_raw or self.row}, {self.row_stride}")
            pn = b.reg("pred")
            self.has_next_row = pn
            b.op(f"setp.lt.u32 {pn}, {nxt}, {self.rows}")
            skip = b.new_label("no_next_row")
            b.op(f"@!{pn} bra {skip}")
            b.comment("prefetch the next row of this block")
            self._cached_loads(self.buf_b, self.prefetch_names, chunks, self._row_tptrs(nxt))
            b.label(skip)
        elif mode == "cached" and held is None:
            held = self._row_loads()

        if s.early_gather:
            # Gathered elements depend only on the row's index inputs: their loads go out now,
            # beside the row's, and are long back when the reductions before their use end.
            b.comment("gathered elements, loaded as the row starts")
            for n in self.ir.gathers:
                self._scalar(n)
        for p in range(self.num_passes):
            self.cur_pass = p if mode == "stream" else None
            self._emit_pass(p, mode, held)
        self.cur_pass = None

        if mode == "cached" and self.prefetch:
            b.comment("the prefetched row becomes this thread's row")
            for name in self.prefetch_names:
                for ka, kb in zip(self.buf_a[name], self.buf_b[name], strict=True):
                    for ra, rb in zip(ka, kb, strict=True):
                        b.op(f"@{self.has_next_row} mov.b32 {ra}, {rb}")

        outs = [o for o in self.ir.outputs if o.role == ROLE_ROWSCALAR]
        if outs:
            b.comment("per-row outputs, written by the row's first thread")
            for o in outs:
                v = self._as_f32(*self._scalar(o.node))
                self._store_scalar(o.dtype, self.rowptr[o.name], v, self.is_t0)

    def _mat_roots(self, p: int) -> list[E.Node]:
        return [n for n in getattr(self, "materialised", []) if self.stages[n] == p]

    def _alloc_chunk_regs(self, names: list[str], chunks: int) -> dict:
        regs = {}
        for name in names:
            eb = self.tensors[name].elem_bytes
            words = self.V * eb // 4
            regs[name] = [[self.b.reg("b32") for _ in range(words)] for _ in range(chunks)]
        return regs

    def _chunk_stride_bytes(self, eb: int) -> int:
        return self.T * self.V * eb

    def _cached_loads(self, held: dict, names: list[str], chunks: int, ptrs: dict) -> None:
        b = self.b
        slow, end = b.new_label("load_tail"), b.new_label("loaded")
        b.comment(f"load the row into registers: {chunks} chunks per thread, all in flight")

        def whole() -> None:
            for k in range(chunks):
                for name in names:
                    self._load_chunk_vec(name, ptrs[name], k, held[name][k])

        def ragged() -> None:
            if self.s.tail == "shifted":  # (each pass finds its predicates again: none kept)
                self._shifted_step(names, ptrs, held, chunks, self.n_window, self.shift_lo)
            else:
                self._tail(
                    lambda vec: self._load_tail(names, ptrs, held, chunks, self.n_minus_tv, vec)
                )

        self._whole_or_ragged(slow, end, whole, ragged)

    def _whole_or_ragged(self, slow: str, end: str, whole, ragged) -> None:
        """whole() where the chunks of this thread's warp are whole, else ragged() (the tail,
        correct for whole chunks too), behind a branch on fast_cached; in a split row's copy
        (self.path, _split_row_bodies) only that copy's side, with no branch."""
        b = self.b
        if self.path is None:
            b.op(f"@!{self.fast_cached} bra {slow}")
        if self.path in (None, "fast"):
            whole()
        if self.path is None:
            b.op(f"bra.uni {end}")
            b.label(slow)
        if self.path != "fast":
            ragged()
        b.label(end)

    def _cached_row_inputs(self) -> list[str]:
        """Row-tensor inputs the cached path holds in registers."""
        self.materialised = self._plan_materialised()
        mat_set = set(self.materialised)
        names: list[str] = []
        for p in range(self.num_passes):
            stop = {n for n in mat_set if self.stages[n] < p}
            for n in self._row_closure(self._root_nodes(p) + self._mat_roots(p), stop):
                if (
                    isinstance(n, E.Input)
                    and self.tensors[n.name].role == ROLE_ROW
                    and n.name not in names
                ):
                    names.append(n.name)
        return names

    def _row_tptrs(self, row: str) -> dict[str, str]:
        """This thread's pointers into `row` of every prefetched row tensor."""
        b = self.b
        row_elems = b.reg("b64")
        b.op(f"mul.wide.u32 {row_elems}, {row}, {self.N}")
        out = {}
        for name in self.prefetch_names:
            t = self.tensors[name]
            off = b.reg("b64")
            b.op(f"mul.lo.u64 {off}, {row_elems}, {t.elem_bytes}")
            a = b.reg("b64")
            b.op(f"add.s64 {a}, {self.ptr[name]}, {off}")
            tp = b.reg("b64")
            b.op(f"add.s64 {tp}, {a}, {self.tv_bytes[t.elem_bytes]}")
            out[name] = tp
        return out

    def _prefetch_first_row(self) -> None:
        """Two register buffers per row input: the row being worked on, and the next row of
        this block, loading meanwhile. The first row is loaded before the loop."""
        b, chunks = self.b, self.s.chunks
        self.prefetch_names = self._cached_row_inputs()
        self.buf_a = self._alloc_chunk_regs(self.prefetch_names, chunks)
        self.buf_b = self._alloc_chunk_regs(self.prefetch_names, chunks)
        skip = b.new_label("no_first_row")
        p = b.reg("pred")
        b.op(f"setp.ge.u32 {p}, {self.row}, {self.rows}")
        b.op(f"@{p} bra {skip}")
        pl = b.reg("pred")
        b.op(f"setp.gt.u32 {pl}, {self.N}, {self.T * self.V * chunks}")
        b.op(f"@{pl} bra {skip}")
        if self.s.tail == "stream":  # (such a row streams)
            b.op(f"@!{self.vec_ok} bra {skip}")
        self._cached_loads(self.buf_a, self.prefetch_names, chunks, self._row_tptrs(self.row))
        b.label(skip)

    def _chunk_rem(self, n_minus: str, k: int) -> str:
        """Elements of the row left from this thread's chunk k on (may be <= 0)."""
        if k == 0:
            return n_minus
        r = self.b.reg("b32")
        self.b.op(f"sub.s32 {r}, {n_minus}, {k * self.T * self.V}")
        return r

    def _load_chunk_vec(
        self, name: str, base: str, k: int, dst: list[str], guard: str = ""
    ) -> None:
        t = self.tensors[name]
        prefix, pol = self._load_prefix(t)
        off = k * self._chunk_stride_bytes(t.elem_bytes)
        for i in range(0, len(dst), 4):
            part = dst[i : i + 4]
            vec = {4: ".v4", 2: ".v2", 1: ""}[len(part)]
            regs = "{" + ", ".join(part) + "}" if len(part) > 1 else part[0]
            self.b.op(f"{guard}{prefix}{vec}.b32 {regs}, [{base}+{off + 4 * i}]{pol}")

    def _load_prefix(self, t: TensorRef) -> tuple[str, str]:
        """(instruction prefix, cache-policy operand or "") of a load of row or column data: the
        schedule's hint for row tensors, its col_hint for per-column vectors, the read-only path
        for anything else."""
        if t.role == ROLE_COL and self.s.col_hint == "nc_l2last":
            # every row reads the vector: keep it in L1 and L2 ahead of the rows streaming by
            return LOAD_PREFIX["nc_l2last"], self.policy["keep"]
        if t.role != ROLE_ROW:
            return LOAD_PREFIX["nc"], ""
        if (
            self.s.load_hint == "nc_l2reuse"
            and self.cur_pass is not None
            and self.cur_pass < self.last_read.get(t.name, -1)
        ):
            # a later pass reads this row again: ask the L2 to keep it until then
            return LOAD_PREFIX["nc_l2last"], self.policy["keep"]
        return LOAD_PREFIX[self.s.load_hint], self.policy.get("load", "")

    def _load_chunk_pred(
        self, name: str, base: str, k: int, dst: list[str], rem: str, vec: bool
    ) -> None:
        """A tail chunk, zeros past the row's end: one predicated vector load (vec: see _tail),
        or element by element."""
        b = self.b
        if vec:
            for r in dst:
                b.op(f"mov.b32 {r}, 0")
            self._load_chunk_vec(name, base, k, dst, guard=f"@{self._chunk_preds(rem, True)[0]} ")
            return
        base, step = self._elem_base(base, self.tensors[name].elem_bytes)
        preds = self._elem_preds(rem)
        self._load_chunk_elems(name, base, k, dst, preds, step=step, zero=True)

    def _load_tail(self, names, ptrs: dict, regs: dict, chunks: int, n_minus: str, vec: bool):
        """The tail path's loads of `names` into `regs`, chunk by chunk (see _load_chunk_pred)."""
        for k in range(chunks):
            rem = self._chunk_rem(n_minus, k)
            for name in names:
                self._load_chunk_pred(name, ptrs[name], k, regs[name][k], rem, vec)

    def _tail(self, emit_tail) -> None:
        """The tail path: emit_tail(False), element by element; under the schedule's "vectors"
        tail also emit_tail(True), taken at run time where the row is of whole vectors (N a multiple
        of V and every row-wise pointer aligned, so each chunk is whole or past the row's end).
        A branch, not predicates on both: predicated twins would hold both ways' registers at
        once (32 more at 4 chunks of bf16). Under the "stream" tail a row in registers is of
        whole vectors (others stream): only emit_tail(True); streamed, as "vectors"."""
        if self.s.tail == "stream" and self.mode == "cached":
            emit_tail(True)
            return
        if self.s.tail not in ("vectors", "stream") or self.path == "tail":
            emit_tail(False)
            return
        if self.path == "vectors":  # a split row's path of whole vectors
            emit_tail(True)
            return
        b = self.b
        elems, end = b.new_label("tail_elems"), b.new_label("tail_end")
        b.op(f"@!{self.vec_ok} bra {elems}")
        emit_tail(True)
        b.op(f"bra.uni {end}")
        b.label(elems)
        emit_tail(False)
        b.label(end)

    def _chunk_preds(self, rem: str, vec: bool) -> list[str]:
        """Per element of a tail chunk with `rem` elements of the row from its first on: in the
        row or not. Under vec one predicate serves the whole chunk."""
        if not vec:
            return self._elem_preds(rem)
        p = self.b.reg("pred")
        self.b.op(f"setp.gt.s32 {p}, {rem}, 0")
        return [p] * self.V

    def _elem_preds(self, rem: str) -> list[str]:
        """Per element j of a chunk in the element-by-element tail: in the row or not. `rem`
        counts the row's elements from the thread's first in the consecutive layout (t*V + j).
        Under the "strided" tail element j of thread t's chunk lies at column t + j*T of the
        chunk instead, so that a warp's single-element loads and stores cover consecutive
        addresses; its first element is t*(V-1) columns before t*V."""
        b = self.b
        step = 1
        if self.s.tail == "strided":
            r = b.reg("b32")
            b.op(f"add.s32 {r}, {rem}, {self.t_v1}")
            rem, step = r, self.T
        preds = []
        for j in range(self.V):
            p = b.reg("pred")
            b.op(f"setp.gt.s32 {p}, {rem}, {j * step}")
            preds.append(p)
        return preds

    def _elem_base(self, base: str, eb: int) -> tuple[str, int]:
        """(pointer, bytes from element to element) of a thread's chunk in the element tail:
        `base` (its first element in the consecutive layout) and the element size, or under
        the "strided" tail (see _elem_preds) moved back t*(V-1) elements and T elements apart."""
        if self.s.tail != "strided":
            return base, eb
        r = self.b.reg("b64")
        self.b.op(f"sub.s64 {r}, {base}, {self.tv1_bytes[eb]}")
        return r, self.T * eb

    # ---------------------------------------------------------------- one pass

    def _emit_pass(self, p: int, mode: str, held) -> None:
        b = self.b
        reds, pairs, outs = self._pass_roots(p)
        mats = self._mat_roots(p) if mode == "cached" else []
        moms = self._pass_moments(p)
        if not (reds or pairs or outs or mats or moms):
            return
        b.comment(
            f"pass {p}: "
            + ", ".join(
                [f"{r.op}" for r in reds]
                + ["online max/sum" for _ in pairs]
                + ["mean and variance (Chan)" for _ in moms]
                + [f"store {o.name}" for o in outs]
            )
        )
        self._prepare_scalars(p)
        accs = []
        self.partials = {}
        for r in reds:
            parts = []
            for _ in range(self.s.acc_split):
                a = b.reg("f32")
                b.op(f"mov.f32 {a}, {f32_literal(IDENTITY[r.op])}")
                parts.append(a)
            accs.append(parts[0])
            self.partials[parts[0]] = parts
        pair_accs = []
        for _ in pairs:
            m, s_ = b.reg("f32"), b.reg("f32")
            b.op(f"mov.f32 {m}, {f32_literal(NEG_INF)}")
            b.op(f"mov.f32 {s_}, 0f00000000")
            pair_accs.append((m, s_))
        work = (reds, accs, pairs, pair_accs, outs, mats)
        self.mom_accs = []
        for _ in moms:
            triple = tuple(b.reg("f32") for _ in range(3))  # count, mean, squared deviations
            for r in triple:
                b.op(f"mov.f32 {r}, 0f00000000")
            self.mom_accs.append(triple)
        self.mom_pass = (p, moms)
        if mode == "cached":
            chunks = self.s.chunks
            stop = {n for n in self.materialised if self.stages[n] < p}
            cols = []
            for n in self._row_closure(self._root_nodes(p) + mats, stop):
                if (
                    isinstance(n, E.Input)
                    and self.tensors[n.name].role == ROLE_COL
                    and n.name not in held
                ):
                    cols.append(n.name)
            regs = dict(held) | self._alloc_chunk_regs(cols, chunks)
            slow, end = b.new_label(f"p{p}_tail"), b.new_label(f"p{p}_end")

            def whole() -> None:
                groups = self.s.col_groups if cols else 1
                per = chunks // groups
                for g in range(groups):
                    ks = range(g * per, (g + 1) * per)
                    if g:
                        # Keeps ptxas from hoisting this group's column loads above the last
                        # group's stores, so that only one group's columns are live at a time.
                        b.op("fence.acq_rel.cta")
                    for k in ks:
                        for name in cols:
                            self._load_chunk_vec(name, self.tptr[name], k, regs[name][k])
                    self._elements(p, work, regs, ks, fast=True, ptrs=self.tptr)
                self._moment_groups(regs, chunks, fast=True)

            def tail(vec: bool) -> None:
                nm = self.n_minus_tv
                self._load_tail(cols, self.tptr, regs, chunks, nm, vec)
                self._elements(
                    p, work, regs, range(chunks), fast=False, ptrs=self.tptr, n_minus=nm, vec=vec
                )
                self._moment_groups(regs, chunks, fast=False, n_minus=nm, vec=vec)

            def ragged() -> None:
                if self.s.tail == "shifted":
                    # (a row of odd width takes this path every time: the columns in groups
                    # too, of up to ceil(chunks / groups) chunks)
                    groups = min(self.s.col_groups if cols else 1, chunks)
                    per = -(-chunks // groups)
                    words = self._worded(cols, self.tptr)  # once a pass, not once a group
                    for g, k0 in enumerate(range(0, chunks, per)):
                        ks = range(k0, min(chunks, k0 + per))
                        if g:
                            b.op("fence.acq_rel.cta")
                        sp = self._shifted_step(
                            cols, self.tptr, regs, ks, self.n_window, self.shift_lo, words
                        )
                        self._elements(p, work, regs, ks, fast=False, ptrs=self.tptr, shift=sp)
                else:
                    self._tail(tail)

            self._whole_or_ragged(slow, end, whole, ragged)
        else:
            self._stream_loop(p, work)
        self._finish_reductions(reds, accs, pairs, pair_accs)
        self._finish_moments(moms, self.mom_accs)

    def _stream_loop(self, p: int, work) -> None:
        b, T, V, U = self.b, self.T, self.V, self.stream_chunks
        reds, accs, pairs, pair_accs, outs, mats = work
        names = []
        for n in self._row_closure(self._root_nodes(p)):
            if isinstance(n, E.Input) and n.name not in names:
                names.append(n.name)
        out_names = [o.name for o in outs]
        col = b.reg("b32")
        b.op(f"mov.u32 {col}, 0")
        shifted = self.s.tail == "shifted"
        ptrs = {}
        for name in names + out_names:
            r = b.reg("b64")
            b.op(f"mov.b64 {r}, {self.tptr[name]}")
            ptrs[name] = r
        regs = self._alloc_chunk_regs(names, U)
        top, slow, nxt, end = (b.new_label(f"p{p}_{x}") for x in ("loop", "tail", "next", "end"))
        b.label(top)
        pe = b.reg("pred")
        b.op(f"setp.ge.u32 {pe}, {col}, {self.window if shifted else self.N}")
        b.op(f"@{pe} bra {end}")
        n_minus = b.reg("b32")
        b.op(f"sub.s32 {n_minus}, {self.n_window if shifted else self.n_minus_tv}, {col}")
        fast = b.reg("pred")
        # this thread's elements left; under "strided", and in a row under a warp (as
        # fast_cached), the row's last thread's; in a row of several warps, the warp's last
        # thread's (a streamed row of one warp keeps the choice per thread: only its last step
        # is ragged, and cross-entropy's suite kernels at 4096x32000 and 4096x128256 stream a
        # warp per row; so does a shifted row, whose first step straddles the row's start too:
        # a choice per warp there would need the warp's first lane for `inside`, untimed)
        last = n_minus
        if self.s.tail == "strided" or (T != 32 and not shifted):
            last = b.reg("b32")
            b.op(f"sub.s32 {last}, {self.n_minus_last}, {col}")
        b.op(f"setp.ge.s32 {fast}, {last}, {(U - 1) * T * V + V}")
        if shifted:
            lo = b.reg("b32")
            b.op(f"sub.s32 {lo}, {self.shift_lo}, {col}")
            inside = b.reg("pred")
            b.op(f"setp.le.s32 {inside}, {lo}, 0")
            b.op(f"and.pred {fast}, {fast}, {inside}")
            b.op(f"and.pred {fast}, {fast}, {self.shift_ok}")
        else:
            b.op(f"and.pred {fast}, {fast}, {self.vec_ok}")
        b.op(f"@!{fast} bra {slow}")
        words = {
            n: self._col_words(ptrs[n])
            for n in names
            if shifted and self._moves_as_words(self.tensors[n])
        }
        for k in range(U):
            for name in names:
                if name in words:
                    self._load_chunk_col_words(name, words[name], ptrs[name], k, regs[name][k])
                elif shifted and self.tensors[name].role == ROLE_COL:
                    self._load_chunk_elems(name, ptrs[name], k, regs[name][k])
                else:
                    self._load_chunk_vec(name, ptrs[name], k, regs[name][k])
        self._elements(p, work, regs, range(U), fast=True, ptrs=ptrs)
        self._moment_groups(regs, U, fast=True)
        b.op(f"bra.uni {nxt}")
        b.label(slow)

        def tail(vec: bool) -> None:
            self._load_tail(names, ptrs, regs, U, n_minus, vec)
            self._elements(p, work, regs, range(U), fast=False, ptrs=ptrs, n_minus=n_minus, vec=vec)
            self._moment_groups(regs, U, fast=False, n_minus=n_minus, vec=vec)

        if shifted:
            sp = self._shifted_step(names, ptrs, regs, U, n_minus, lo)
            self._elements(p, work, regs, range(U), fast=False, ptrs=ptrs, shift=sp)
        else:
            self._tail(tail)
        b.label(nxt)
        b.op(f"add.u32 {col}, {col}, {U * T * V}")
        for name, r in ptrs.items():
            b.op(f"add.s64 {r}, {r}, {U * self._chunk_stride_bytes(self.tensors[name].elem_bytes)}")
        b.op(f"bra.uni {top}")
        b.label(end)

    def _shifted_step(
        self,
        names,
        ptrs: dict,
        regs: dict,
        chunks: int | range,
        n_minus: str,
        lo: str,
        words: dict | None = None,
    ) -> list[_ShiftChunk | None]:
        """The first or last step of a shifted row (or any step of one whose tensors are not
        congruent): per chunk, which of its elements lie in the row (after the `lo` window
        elements before the row's start, within the `n_minus` from this thread's first on),
        and whether all do (one 16-byte load and store; else each element in the row moves
        alone, behind a branch that whole chunks skip); then the chunk's loads. Returns a
        _ShiftChunk per chunk, for _elements (None for a chunk not in `chunks`, a count or a
        range of chunk numbers)."""
        b, V = self.b, self.V
        cols = [n for n in names if self.tensors[n].role == ROLE_COL]
        rows = [n for n in names if n not in cols]
        # a 2-byte vector's whole chunks move as words put in place; the rest element by element
        worded = words if words is not None else self._worded(cols, ptrs)
        single = [n for n in cols if n not in worded]
        ks = chunks if isinstance(chunks, range) else range(chunks)
        steps: list[_ShiftChunk | None] = [None] * ks.start
        for k in ks:
            rem = self._chunk_rem(n_minus, k)
            whole = b.reg("pred")
            b.op(f"setp.ge.s32 {whole}, {rem}, {V}")
            if k == 0:  # lo <= V - 1 - (this thread's first element): only chunk 0 starts
                first_in = b.reg("pred")  # before the row, a later one starts T*V further on
                b.op(f"setp.le.s32 {first_in}, {lo}, 0")
                b.op(f"and.pred {whole}, {whole}, {first_in}")
            b.op(f"and.pred {whole}, {whole}, {self.shift_ok}")
            sc = _ShiftChunk(b, rem, lo if k == 0 else None, whole, V)
            steps.append(sc)
            if single:  # 4-byte elements: one load each, never a vector
                valid = sc.valid()
                for name in single:
                    self._load_chunk_elems(name, ptrs[name], k, regs[name][k], valid, zero=True)
            if not rows and not worded:
                continue
            # a whole chunk moves as 16-byte loads (a per-column vector's as words); a chunk
            # that straddles the row's start or end (one or two threads a row) branches to the
            # element loads, which set every register of the chunk (zeros outside the row)
            elems, done = b.new_label("shift_elems"), b.new_label("shift_loaded")
            b.op(f"@!{whole} bra {elems}")
            for name, w in worded.items():
                self._load_chunk_col_words(name, w, ptrs[name], k, regs[name][k])
            for name in rows:
                self._load_chunk_vec(name, ptrs[name], k, regs[name][k])
            b.op(f"bra.uni {done}")
            b.label(elems)
            valid = sc.valid()
            for name in [*worded, *rows]:
                self._load_chunk_elems(name, ptrs[name], k, regs[name][k], valid, zero=True)
            b.label(done)
        return steps

    def _worded(self, cols, ptrs: dict) -> dict:
        """_col_words of each of `cols` that moves as words on a shifted row."""
        return {n: self._col_words(ptrs[n]) for n in cols if self._moves_as_words(self.tensors[n])}

    @staticmethod
    def _moves_as_words(t: TensorRef) -> bool:
        """Whether `t`'s whole chunks on a shifted row move as 4-byte words (_col_words): a
        2-byte per-column vector, while COL_WORDS is on."""
        return COL_WORDS and t.role == ROLE_COL and t.elem_bytes == 2

    def _col_words(self, base: str) -> tuple[str, str, str]:
        """For a 2-byte per-column vector under the shifted tail, whose chunks start at any
        element: (its pointer moved back to the 4-byte word at or before it, whether that
        moved it (the chunk starts at an odd element: the same for every chunk of the row),
        the prmt selector that takes a word's upper element and the next word's lower then)."""
        b = self.b
        lo = b.reg("b64")
        b.op(f"and.b64 {lo}, {base}, 2")
        odd = b.reg("pred")
        b.op(f"setp.ne.u64 {odd}, {lo}, 0")
        al = b.reg("b64")
        b.op(f"sub.s64 {al}, {base}, {lo}")
        sel = b.reg("b32")
        b.op(f"selp.b32 {sel}, 21554, 12816, {odd}")  # 0x5432 : 0x3210
        return al, odd, sel

    def _load_chunk_col_words(self, name, words, base, k: int, dst, whole=None) -> None:
        """Whole chunk k of a 2-byte per-column vector under the shifted tail (see _col_words):
        its V/2 words from the word at or before it, plus its last element where it starts at
        an odd one, then each pair put in place with prmt: V/2 + 1 loads instead of V, each
        warp load spanning the same 512 bytes (so half the L1 wavefronts). Under `whole`
        (a predicate) only where it holds."""
        b = self.b
        al, odd, sel = words
        t = self.tensors[name]
        prefix, pol = self._load_prefix(t)
        off = k * self._chunk_stride_bytes(t.elem_bytes)
        guard = f"@{whole} " if whole else ""
        last_odd = odd
        if whole:
            last_odd = b.reg("pred")
            b.op(f"and.pred {last_odd}, {odd}, {whole}")
        for i, r in enumerate(dst):
            b.op(f"{guard}{prefix}.b32 {r}, [{al}+{off + 4 * i}]{pol}")
        last = b.reg("b32")
        b.op(f"mov.b32 {last}, 0")
        b.op(f"@{last_odd} {prefix}.u16 {last}, [{base}+{off + 2 * (self.V - 1)}]{pol}")
        for i, r in enumerate(dst):
            nxt = dst[i + 1] if i + 1 < len(dst) else last
            b.op(f"{guard}prmt.b32 {r}, {r}, {nxt}, {sel}")

    def _load_chunk_elems(self, name, base, k: int, dst, preds=None, step=None, zero=False):
        """Chunk k of `name` element by element, `step` bytes apart (the element size unless
        given): each element j under preds[j] if given (a 32-bit one zeroed first under
        `zero`)."""
        b = self.b
        t = self.tensors[name]
        prefix, pol = self._load_prefix(t)
        off = k * self._chunk_stride_bytes(t.elem_bytes)
        step = step or t.elem_bytes
        if t.elem_bytes == 4:
            for j, r in enumerate(dst):
                if zero:
                    b.op(f"mov.b32 {r}, 0")
                guard = f"@{preds[j]} " if preds else ""
                b.op(f"{guard}{prefix}.b32 {r}, [{base}+{off + step * j}]{pol}")
            return
        for w, r in enumerate(dst):
            hs = []
            for half in range(2):
                j = 2 * w + half
                h = b.reg("b16")
                if preds:
                    b.op(f"mov.b16 {h}, 0")
                guard = f"@{preds[j]} " if preds else ""
                b.op(f"{guard}{prefix}.b16 {h}, [{base}+{off + step * j}]{pol}")
                hs.append(h)
            b.op(f"mov.b32 {r}, {{{hs[0]}, {hs[1]}}}")

    def _elements(
        self,
        p,
        work,
        regs,
        ks: range,
        *,
        fast: bool,
        ptrs,
        n_minus=None,
        vec: bool = False,
        shift: list | None = None,
    ) -> None:
        """Per-element work of a pass over the chunks numbered `ks`, whose inputs are in
        `regs`: whole chunks (fast), or a tail's (vec: see _tail; shift: a shifted step's
        _ShiftChunk per chunk, from _shifted_step)."""
        b, V = self.b, self.V
        reds, accs, pairs, pair_accs, outs, mats = work
        pair_vals: list[list[str]] = [[] for _ in pairs]
        # packed_max, on the whole-chunk path: such a pair takes its chunks' loaded words
        packed = {q for q in pairs if fast and q in self.packed_pairs}
        for k in ks:
            preds = sk = None
            if shift is not None:
                sk = shift[k]  # a chunk of a shifted step
                preds = sk.valid()
            elif not fast:
                preds = self._chunk_preds(self._chunk_rem(n_minus, k), vec)
            out_vals: dict[str, list[str]] = {o.name: [] for o in outs}
            for j in range(V):
                e = k * V + j
                ctx = _Ctx("elem", p, e=e, chunk_regs=regs)
                for n in mats:
                    v = self._as_f32(*self._eval(n, ctx))
                    b.op(f"mov.f32 {self.mat_regs[n][e]}, {v}")
                for r, a in zip(reds, accs, strict=True):
                    v = self._as_f32(*self._eval(r.x, ctx))
                    # a tail's places outside the row hold zeros, which some sums take as is
                    if preds and not self._zero_padded(r):
                        v2 = b.reg("f32")
                        b.op(f"selp.f32 {v2}, {v}, {f32_literal(IDENTITY[r.op])}, {preds[j]}")
                        v = v2
                    a = self.partials[a][e % len(self.partials[a])]
                    b.op(f"{COMBINE[r.op]} {a}, {a}, {v}")
                for q, vals in zip(pairs, pair_vals, strict=True):
                    if q in packed:
                        if j == 0:
                            vals.extend(regs[q.f_node.name][k])
                        continue
                    v = self._as_f32(*self._eval(q.f_node, ctx))
                    if preds:
                        v2 = b.reg("f32")
                        b.op(f"selp.f32 {v2}, {v}, {f32_literal(NEG_INF)}, {preds[j]}")
                        v = v2
                    vals.append(v)
                for o in outs:
                    v = self._as_f32(*self._eval(o.node, ctx))
                    if preds and not vec and not sk:
                        self._store_elem(o, ptrs[o.name], k, j, v, preds[j])
                    else:
                        out_vals[o.name].append(v)
            if fast or vec or sk:
                for o in outs:
                    # one predicate for the whole chunk
                    pred = sk.whole if sk else preds[0] if vec else None
                    self._store_chunk_vec(o, ptrs[o.name], k, out_vals[o.name], pred)
            if sk and outs:  # a shifted chunk that is not whole: its elements alone
                done = b.new_label("shift_stored")
                b.op(f"@{sk.whole} bra {done}")
                for o in outs:
                    for j, v in enumerate(out_vals[o.name]):
                        self._store_elem(o, ptrs[o.name], k, j, v, preds[j])
                b.label(done)
            if not fast and self.packed_pairs and k != ks[-1]:
                # the tail's groups one chunk at a time, so that the tail does not hold every
                # chunk's elements as f32 at once (it would set the kernel's register count)
                for (m, s_), vals in zip(pair_accs, pair_vals, strict=True):
                    self._online_update(m, s_, vals)
                    vals.clear()
        for q, (m, s_), vals in zip(pairs, pair_accs, pair_vals, strict=True):
            if q in packed:
                self._online_update_packed(m, s_, vals, self.tensors[q.f_node.name].dtype)
            else:
                self._online_update(m, s_, vals)

    def _zero_padded(self, r: E.Reduce) -> bool:
        """Whether a sum reduction may take a tail chunk's places outside the row as they are,
        without a select: where every row and column input is 0 (as every tail's loads leave
        them), its argument is exactly 0, the identity of the sum. (RMSNorm's sum of squares
        is; LayerNorm's sum of squared deviations from the mean is not.)"""

        def vanishes(n: E.Node) -> bool:
            if isinstance(n, E.Input):
                return self.tensors[n.name].role in (ROLE_ROW, ROLE_COL)
            if isinstance(n, E.Const):
                return n.value == 0.0
            if isinstance(n, E.Cast):
                return vanishes(n.x)
            if isinstance(n, E.Unary):  # exactly 0 at 0 as emitted (erf's and tanh's
                return n.op in ("neg", "abs", "sqrt") and vanishes(n.x)  # approximations: not)
            if isinstance(n, E.Binary):
                if n.op == "pow":
                    return isinstance(n.b, E.Const) and n.b.value > 0 and vanishes(n.a)
                # a product too only of two vanishing factors: 0 * inf would be NaN
                both = vanishes(n.a) and vanishes(n.b)
                return n.op in ("add", "sub", "mul", "max", "min") and both
            if isinstance(n, E.Where):
                return vanishes(n.a) and vanishes(n.b)
            return False

        if r not in self.zero_padded:
            self.zero_padded[r] = r.op in ("sum", "mean") and vanishes(r.x)
        return self.zero_padded[r]

    def _online_update(self, m: str, s_: str, vals: list[str]) -> None:
        """Fold a group of values into (running max m, running sum s of exp(v - m))."""
        tree = self.s.acc_split > 1
        self.b.comment("online max/sum over this group" + (", by trees" if tree else ""))
        self._online_fold(m, s_, self._fold("max.f32", vals), iter(vals))

    def _online_update_packed(self, m: str, s_: str, words: list[str], dtype: str) -> None:
        """_online_update over the 16-bit elements packed two to a word in `words`: the max by
        a tree of packed max instructions, then each element unpacked for its exponential."""
        b = self.b
        b.comment("online max/sum over this group, the max on packed pairs")
        w = self._tree("max.bf16x2" if dtype == "bf16" else "max.f16x2", words, kind="b32")
        gm = b.reg("f32")
        b.op(f"max.f32 {gm}, {self._unpack_word(dtype, w, 0)}, {self._unpack_word(dtype, w, 1)}")
        unpacked = (self._unpack_word(dtype, word, half) for word in words for half in (0, 1))
        self._online_fold(m, s_, gm, unpacked, exps_first=True)

    def _online_fold(self, m: str, s_: str, gm: str, values, exps_first: bool = False) -> None:
        """(m, s) += a group whose max is gm: s rescaled to the new max, then the group's
        exponentials added (a tree with acc_split, else one after another; exps_first: every
        exponential written before the first add). `values` is consumed after the new max is
        known, so lazily made values are emitted there."""
        b = self.b
        mn = b.reg("f32")
        b.op(f"max.f32 {mn}, {m}, {gm}")
        ms = self._safe_max(mn)
        b.op(f"mul.f32 {s_}, {s_}, {self._exp_below(m, ms)}")
        if self.s.acc_split > 1:
            t = self._tree("add.f32", [self._exp_below(v, ms) for v in values])
            b.op(f"add.f32 {s_}, {s_}, {t}")
        elif exps_first:
            for e in [self._exp_below(v, ms) for v in values]:
                b.op(f"add.f32 {s_}, {s_}, {e}")
        else:
            for v in values:
                b.op(f"add.f32 {s_}, {s_}, {self._exp_below(v, ms)}")
        b.op(f"mov.f32 {m}, {mn}")

    def _fold(self, op: str, vals: list[str]) -> str:
        """vals folded by `op`: by a tree with acc_split, else as a chain from the left."""
        if self.s.acc_split > 1:
            return self._tree(op, vals)
        acc = vals[0]
        for v in vals[1:]:
            r = self.b.reg("f32")
            self.b.op(f"{op} {r}, {acc}, {v}")
            acc = r
        return acc

    def _tree(self, op: str, vals: list[str], dst: str | None = None, kind: str = "f32") -> str:
        """vals folded pairwise by `op` ("add.f32", "max.f32", ...): depth log2(len) instead of
        a chain of len - 1. The root goes to `dst` when given (it may be one of vals)."""
        b = self.b
        level = list(vals)
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level) - 1, 2):
                last = len(level) == 2
                r = dst if (last and dst is not None) else b.reg(kind)
                b.op(f"{op} {r}, {level[i]}, {level[i + 1]}")
                nxt.append(r)
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        if dst is not None and level[0] != dst:
            b.op(f"mov.{kind} {dst}, {level[0]}")
        return dst if dst is not None else level[0]

    def _safe_max(self, mn: str) -> str:
        """The max, with an all -inf max taken as 0 so that exp(-inf - -inf) is 0, not NaN."""
        b = self.b
        pinf = b.reg("pred")
        b.op(f"setp.eq.f32 {pinf}, {mn}, {f32_literal(NEG_INF)}")
        ms = b.reg("f32")
        b.op(f"selp.f32 {ms}, 0f00000000, {mn}, {pinf}")
        return ms

    def _exp_below(self, v: str, ms: str) -> str:
        """exp(v - ms) for v <= ms, the difference taken first: exactly 1 at v == ms however
        large |v| is. (An fma of v*log2(e) against a rounded -ms*log2(e) leaves that rounding,
        up to 1e23 for a -1e30 mask value, and its exp2 is inf: a masked softmax whose thread
        saw only masked elements came out NaN.)"""
        b = self.b
        t = b.reg("f32")
        b.op(f"sub.f32 {t}, {v}, {ms}")
        b.op(f"mul.f32 {t}, {t}, {f32_literal(LOG2E)}")
        b.op(f"ex2.approx.ftz.f32 {t}, {t}")
        return t

    # ---------------------------------------------------------------- stores

    def _store_chunk_vec(self, o, base: str, k: int, vals: list[str], pred=None) -> None:
        """Chunk k of output `o` as 16-byte stores; in a tail, under the chunk's predicate."""
        b = self.b
        prefix = STORE_PREFIX[self.s.store_hint]
        eb = E.DTYPE_BYTES[o.dtype]
        off = k * self._chunk_stride_bytes(eb)
        words = []
        if eb == 4:
            words = vals
        else:
            cvt = "cvt.rn.bf16x2.f32" if o.dtype == "bf16" else "cvt.rn.f16x2.f32"
            for i in range(0, len(vals), 2):
                r = b.reg("b32")
                b.op(f"{cvt} {r}, {vals[i + 1]}, {vals[i]}")  # the first operand is the high half
                words.append(r)
        typ = ".f32" if eb == 4 else ".b32"
        if pred and self.row_ok:
            both = b.reg("pred")
            b.op(f"and.pred {both}, {pred}, {self.row_ok}")
            pred = both
        pred = pred or self.row_ok
        guard = f"@{pred} " if pred else ""
        for i in range(0, len(words), 4):
            part = words[i : i + 4]
            vec = {4: ".v4", 2: ".v2", 1: ""}[len(part)]
            regs = "{" + ", ".join(part) + "}" if len(part) > 1 else part[0]
            pol = self.policy.get("store", "")
            b.op(f"{guard}{prefix}{vec}{typ} [{base}+{off + 4 * i}], {regs}{pol}")

    def _store_elem(self, o, base: str, k: int, j: int, v: str, pred: str) -> None:
        """Element j of chunk k of output `o` in the element tail (see _elem_base)."""
        eb = E.DTYPE_BYTES[o.dtype]
        base, step = self._elem_base(base, eb)
        off = k * self._chunk_stride_bytes(eb) + j * step
        self._store_scalar(o.dtype, f"{base}+{off}", v, pred)

    def _store_scalar(self, dtype: str, addr: str, v: str, pred: str) -> None:
        b = self.b
        prefix = STORE_PREFIX[self.s.store_hint]
        pol = self.policy.get("store", "")
        if self.row_ok and pred != self.is_t0:  # is_t0 already holds row_ok
            both = b.reg("pred")
            b.op(f"and.pred {both}, {pred}, {self.row_ok}")
            pred = both
        if dtype == "fp32":
            b.op(f"@{pred} {prefix}.f32 [{addr}], {v}{pol}")
            return
        h = b.reg("b16")
        b.op(f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32 {h}, {v}")
        b.op(f"@{pred} {prefix}.b16 [{addr}], {h}{pol}")

    # ---------------------------------------------------------------- reductions across threads

    def _finish_reductions(self, reds, accs, pairs, pair_accs) -> None:
        b = self.b
        if not (reds or pairs):
            return
        for r, a in zip(reds, accs, strict=True):
            parts = self.partials[a]
            if len(parts) > 1:
                b.comment(f"{r.op}: this thread's {len(parts)} partials, by a tree")
                self._tree(COMBINE[r.op], parts, dst=a)
        b.comment("row reduction: warp butterfly" + (", then across warps" if self.W > 1 else ""))
        for off in self.bfly:
            for r, a in zip(reds, accs, strict=True):
                o = b.reg("f32")
                b.op(f"shfl.sync.bfly.b32 {o}, {a}, {off}, 31, -1")
                b.op(f"{COMBINE[r.op]} {a}, {a}, {o}")
            for m, s_ in pair_accs:
                mo, so = b.reg("f32"), b.reg("f32")
                b.op(f"shfl.sync.bfly.b32 {mo}, {m}, {off}, 31, -1")
                b.op(f"shfl.sync.bfly.b32 {so}, {s_}, {off}, 31, -1")
                self._pair_combine(m, s_, mo, so)
        if self.W > 1:
            # Slots [group][slot][warp] of one f32 each; every stage uses its own slots, so no
            # thread overwrites a value another may still be reading within a row.
            slot0 = self.red_slot
            self.red_slot += len(accs) + len(pair_accs)
            if self.red_slot > self.red_items_total:
                raise EmitError("internal: more reduction slots used than counted")
            for idx, a in enumerate(accs):
                off = (slot0 + idx) * self.W * 4
                b.op(f"@{self.lane0} st.shared.f32 [{self.red_write}+{off}], {a}")
            for pidx, (m, _s) in enumerate(pair_accs):
                off = (slot0 + len(accs) + pidx) * self.W * 4
                b.op(f"@{self.lane0} st.shared.f32 [{self.red_write}+{off}], {m}")
            b.op(self.bar)
            for idx, (r, a) in enumerate(zip(reds, accs, strict=True)):
                base = (slot0 + idx) * self.W * 4
                b.op(f"ld.shared.f32 {a}, [{self.red_group}+{base}]")
                for w in range(1, self.W):
                    o = b.reg("f32")
                    b.op(f"ld.shared.f32 {o}, [{self.red_group}+{base + 4 * w}]")
                    b.op(f"{COMBINE[r.op]} {a}, {a}, {o}")
            self._pairs_across_warps(pair_accs, slot0 + len(accs))
            if self.C > 1:
                self._across_cluster(reds, accs, pair_accs, slot0)
        for r, a in zip(reds, accs, strict=True):
            if r.op == "mean":
                v = b.reg("f32")
                b.op(f"mul.f32 {v}, {a}, {self.inv_n}")
                self.scal[r] = (v, "f32")
            else:
                self.scal[r] = (a, "f32")
        for q, (m, s_) in zip(pairs, pair_accs, strict=True):
            self.scal[q.max_node] = (m, "f32")
            self.scal[self._canon(q.max_node)] = (m, "f32")
            self.scal[q.sum_node] = (s_, "f32")
            self.scal[self._canon(q.sum_node)] = (s_, "f32")
        self._publish_aliases()

    def _publish_aliases(self) -> None:
        """A reduction that differs from a computed one only in keepdims gets its value."""
        for src, dst in self.alias.items():
            if dst in self.scal and src not in self.scal:
                self.scal[src] = self.scal[dst]
            if src in self.scal and dst not in self.scal:
                self.scal[dst] = self.scal[src]

    # ---------------------------------------------------------------- mean and variance together

    def _moment_groups(
        self, regs, chunks: int, *, fast: bool, n_minus=None, vec: bool = False
    ) -> None:
        """Fold this thread's elements in `regs` into each moment pair's (count, mean, squared
        deviations): the group's own mean first, then its deviations from it (both over the
        registers), then Chan's merge into the running triple."""
        b, V = self.b, self.V
        p, moms = self.mom_pass
        for q, acc in zip(moms, self.mom_accs, strict=True):
            preds = []
            for k in range(chunks):
                pk = None if fast else self._chunk_preds(self._chunk_rem(n_minus, k), vec)
                preds += [None if fast else pk[j] for j in range(V)]
            cnt, total = b.reg("f32"), b.reg("f32")
            b.op(f"mov.f32 {total}, 0f00000000")
            if fast:
                b.op(f"mov.f32 {cnt}, {f32_literal(float(len(preds)))}")
            else:
                b.op(f"mov.f32 {cnt}, 0f00000000")
            for v, pr in zip(self._x_values(q, p, regs, chunks), preds, strict=True):
                if pr is None:
                    b.op(f"add.f32 {total}, {total}, {v}")
                else:
                    b.op(f"@{pr} add.f32 {total}, {total}, {v}")
                    b.op(f"@{pr} add.f32 {cnt}, {cnt}, 0f3F800000")
            mean = b.reg("f32")
            b.op(f"mul.f32 {mean}, {total}, {self._rcp_count(cnt)}")
            m2 = b.reg("f32")
            b.op(f"mov.f32 {m2}, 0f00000000")
            for v, pr in zip(self._x_values(q, p, regs, chunks), preds, strict=True):
                d = b.reg("f32")
                b.op(f"sub.f32 {d}, {v}, {mean}")
                guard = "" if pr is None else f"@{pr} "
                b.op(f"{guard}fma.rn.f32 {m2}, {d}, {d}, {m2}")
            self._chan_merge(acc, (cnt, mean, m2))

    def _x_values(self, q, p: int, regs, chunks: int):
        """X of each element of the group, evaluated afresh on every call: between the two sweeps
        of a group nothing is held but the packed row already in registers (holding 32 f32
        values cost LayerNorm 17 registers at 256 threads x 4 chunks)."""
        for e in range(chunks * self.V):
            yield self._as_f32(*self._eval(q.x_node, _Ctx("elem", p, e=e, chunk_regs=regs)))

    def _rcp_count(self, count: str) -> str:
        """1 / max(count, 1): an empty group (a thread past the row's end) divides by one."""
        inv = self.b.reg("f32")
        self.b.op(f"max.f32 {inv}, {count}, 0f3F800000")
        self.b.op(f"rcp.rn.f32 {inv}, {inv}")
        return inv

    def _chan_merge(self, acc, other) -> None:
        """acc <- acc merged with other, each (count, mean, squared deviations from the mean):
        n = na + nb, mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n with d = mb - ma."""
        b = self.b
        n, m, m2 = acc
        nb, mb, m2b = other
        nn, f, d, t = (b.reg("f32") for _ in range(4))
        b.op(f"add.f32 {nn}, {n}, {nb}")
        b.op(f"mul.f32 {f}, {nb}, {self._rcp_count(nn)}")
        b.op(f"sub.f32 {d}, {mb}, {m}")
        b.op(f"fma.rn.f32 {m}, {d}, {f}, {m}")
        b.op(f"mul.f32 {t}, {d}, {f}")
        b.op(f"mul.f32 {t}, {t}, {d}")
        b.op(f"add.f32 {m2}, {m2}, {m2b}")
        b.op(f"fma.rn.f32 {m2}, {t}, {n}, {m2}")
        b.op(f"mov.f32 {n}, {nn}")

    def _finish_moments(self, moms, accs) -> None:
        """Merge the threads' triples across the row (a butterfly over the warp, then the warps
        through shared memory) and publish the row's mean and variance."""
        b = self.b
        if not moms:
            return
        b.comment("mean and variance across the row: Chan's merge, lower lane first")
        for off in self.bfly:
            up = b.reg("pred")
            bit = b.reg("b32")
            b.op(f"and.b32 {bit}, {self.lane}, {off}")
            b.op(f"setp.ne.u32 {up}, {bit}, 0")
            for acc in accs:
                other = []
                for r in acc:
                    o = b.reg("f32")
                    b.op(f"shfl.sync.bfly.b32 {o}, {r}, {off}, 31, -1")
                    other.append(o)
                # Both lanes of a pair merge (lower, upper), so they agree to the last bit.
                lo, hi = [], []
                for r, o in zip(acc, other, strict=True):
                    a_, c_ = b.reg("f32"), b.reg("f32")
                    b.op(f"selp.f32 {a_}, {o}, {r}, {up}")
                    b.op(f"selp.f32 {c_}, {r}, {o}, {up}")
                    lo.append(a_)
                    hi.append(c_)
                self._chan_merge(lo, hi)
                for r, v in zip(acc, lo, strict=True):
                    b.op(f"mov.f32 {r}, {v}")
        if self.W > 1:
            slot0 = self.red_slot
            self.red_slot += 3 * len(accs)
            if self.red_slot > self.red_items_total:
                raise EmitError("internal: more reduction slots used than counted")
            for i, acc in enumerate(accs):
                for c, r in enumerate(acc):
                    off = (slot0 + 3 * i + c) * self.W * 4
                    b.op(f"@{self.lane0} st.shared.f32 [{self.red_write}+{off}], {r}")
            b.op(self.bar)
            for i, acc in enumerate(accs):
                bases = [(slot0 + 3 * i + c) * self.W * 4 for c in range(3)]
                for r, base in zip(acc, bases, strict=True):
                    b.op(f"ld.shared.f32 {r}, [{self.red_group}+{base}]")
                for w in range(1, self.W):
                    other = [b.reg("f32") for _ in range(3)]
                    for r, base in zip(other, bases, strict=True):
                        b.op(f"ld.shared.f32 {r}, [{self.red_group}+{base + 4 * w}]")
                    self._chan_merge(acc, other)
        for q, (_n, m, m2) in zip(moms, accs, strict=True):
            var = b.reg("f32")
            b.op(f"mul.f32 {var}, {m2}, {self.inv_n}")
            for node, val in ((q.mean_node, m), (q.var_node, var)):
                self.scal[node] = (val, "f32")
                self.scal[self._canon(node)] = (val, "f32")
        self._publish_aliases()

    def _pairs_across_warps(self, pair_accs, first_slot: int) -> None:
        """Pairs: the max went through the slot above; the warp's sum rescaled to the row max
        goes through a second round (a barrier later), so each slot stays one word."""
        b = self.b
        if not pair_accs:
            return
        for pidx, (m, s_) in enumerate(pair_accs):
            base = (first_slot + pidx) * self.W * 4
            rowmax = b.reg("f32")
            b.op(f"ld.shared.f32 {rowmax}, [{self.red_group}+{base}]")
            for w in range(1, self.W):
                o = b.reg("f32")
                b.op(f"ld.shared.f32 {o}, [{self.red_group}+{base + 4 * w}]")
                b.op(f"max.f32 {rowmax}, {rowmax}, {o}")
            b.op(f"mul.f32 {s_}, {s_}, {self._exp_below(m, self._safe_max(rowmax))}")
            b.op(f"mov.f32 {m}, {rowmax}")
        # Second round: every thread read the maxima above before anyone overwrites them.
        b.op(self.bar)
        for pidx, (_m, s_) in enumerate(pair_accs):
            base = (first_slot + pidx) * self.W * 4
            b.op(f"@{self.lane0} st.shared.f32 [{self.red_write}+{base}], {s_}")
        b.op(self.bar)
        for pidx, (_m, s_) in enumerate(pair_accs):
            base = (first_slot + pidx) * self.W * 4
            b.op(f"ld.shared.f32 {s_}, [{self.red_group}+{base}]")
            for w in range(1, self.W):
                o = b.reg("f32")
                b.op(f"ld.shared.f32 {o}, [{self.red_group}+{base + 4 * w}]")
                b.op(f"add.f32 {s_}, {s_}, {o}")

    def _cluster_barrier(self) -> None:
        self.b.op("barrier.cluster.arrive.release.aligned")
        self.b.op("barrier.cluster.wait.acquire.aligned")

    def _across_cluster(self, reds, accs, pair_accs, first_slot: int) -> None:
        """Every thread holds its block's value of each reduction (and online pair). Thread 0
        of each block publishes them in its shared memory; after a cluster barrier every thread
        reads all the blocks' values through distributed shared memory and combines them in
        rank order, so every block of the row ends with the same bits. Each stage has its own
        slots: nothing is overwritten while another block may still read it."""
        b = self.b
        b.comment(f"across the cluster: {self.C} blocks combine through distributed shared memory")
        base = b.reg("b32")
        b.op(f"mov.u32 {base}, cl_smem")
        values = [(a, None) for a in accs] + list(pair_accs)
        for i, (x, y) in enumerate(values):
            off = (first_slot + i) * 8
            b.op(f"@{self.cta_t0} st.shared.f32 [{base}+{off}], {x}")
            if y is not None:
                b.op(f"@{self.cta_t0} st.shared.f32 [{base}+{off + 4}], {y}")
        self._cluster_barrier()
        remote = []
        for rank in range(self.C):
            r = b.reg("b32")
            b.op(f"mapa.shared::cluster.u32 {r}, {base}, {rank}")
            remote.append(r)
        for i, (r, a) in enumerate(zip(reds, accs, strict=True)):
            off = (first_slot + i) * 8
            b.op(f"ld.shared::cluster.f32 {a}, [{remote[0]}+{off}]")
            for rank in range(1, self.C):
                o = b.reg("f32")
                b.op(f"ld.shared::cluster.f32 {o}, [{remote[rank]}+{off}]")
                b.op(f"{COMBINE[r.op]} {a}, {a}, {o}")
        for j, (m, s_) in enumerate(pair_accs):
            off = (first_slot + len(accs) + j) * 8
            b.op(f"ld.shared::cluster.f32 {m}, [{remote[0]}+{off}]")
            b.op(f"ld.shared::cluster.f32 {s_}, [{remote[0]}+{off + 4}]")
            for rank in range(1, self.C):
                mo, so = b.reg("f32"), b.reg("f32")
                b.op(f"ld.shared::cluster.f32 {mo}, [{remote[rank]}+{off}]")
                b.op(f"ld.shared::cluster.f32 {so}, [{remote[rank]}+{off + 4}]")
                self._pair_combine(m, s_, mo, so)

    def _pair_combine(self, m: str, s_: str, mo: str, so: str) -> None:
        b = self.b
        mn = b.reg("f32")
        b.op(f"max.f32 {mn}, {m}, {mo}")
        ms = self._safe_max(mn)
        a = self._exp_below(m, ms)
        c = self._exp_below(mo, ms)
        t = b.reg("f32")
        b.op(f"mul.f32 {t}, {so}, {c}")
        b.op(f"fma.rn.f32 {s_}, {s_}, {a}, {t}")
        b.op(f"mov.f32 {m}, {mn}")

    # ---------------------------------------------------------------- scalar-level values

    def _prepare_scalars(self, p: int) -> None:
        """Compute, before the pass branches, every per-row value the pass reads."""
        stop = (
            {n for n in self.materialised if self.stages[n] < p} if self.mode == "cached" else set()
        )
        roots = self._root_nodes(p) + (self._mat_roots(p) if self.mode == "cached" else [])
        for n in self._row_closure(roots, stop):
            if n in stop:
                continue
            for c in E.children(n):
                if self.level[c] == SCALAR:
                    self._scalar(c)
            if (
                isinstance(n, E.Binary)
                and n.op == "div"
                and self.level[n.b] == SCALAR
                and self.level[n.a] == ROW
            ):
                key = ("rcp", n.b)
                if key not in self.scal:
                    v = self._as_f32(*self._scalar(n.b))
                    self.scal[key] = (ops.rcp(self.b, v, False), "f32")
        for o in self.ir.outputs:
            if o.role == ROLE_ROW and self.stages[o.node] == p and self.level[o.node] == SCALAR:
                self._scalar(o.node)

    def _scalar(self, n: E.Node):
        if n in self.scal:
            return self.scal[n]
        b = self.b
        if isinstance(n, E.Const):
            v = (b.const_f32(n.value), "f32")
        elif isinstance(n, E.Input):
            if n.name in self.rowscalar_vals:
                v = (self.rowscalar_vals[n.name], "f32")
            elif n.name in self.index_vals:
                f = b.reg("f32")
                b.op(f"cvt.rn.f32.s64 {f}, {self.index_vals[n.name]}")
                v = (f, "f32")
            else:
                raise EmitError(f"internal: per-row input {n.name} was not loaded")
        elif isinstance(n, E.Reduce):
            raise EmitError("internal: a reduction was read before its pass finished")
        elif isinstance(n, E.Gather):
            v = self._gather(n)
        else:
            args = [self._scalar(c) for c in E.children(n)]
            v = self._apply(n, args)
        self.scal[n] = v
        return v

    def _gather(self, n: E.Gather):
        """x[row, idx[row]]: every thread of the row evaluates x at that one column (the loads
        hit the same address, so it costs one transaction per warp). Out-of-range -> NaN."""
        b = self.b
        idx = self.index_vals[n.idx.name]
        ok = b.reg("pred")
        b.op(f"setp.lt.u64 {ok}, {idx}, {self.N64}")
        addrs = {}
        for leaf in self._row_closure([n.x]):
            if isinstance(leaf, E.Input) and leaf.name not in addrs:
                t = self.tensors[leaf.name]
                off = b.reg("b64")
                b.op(f"mul.lo.u64 {off}, {idx}, {t.elem_bytes}")
                a = b.reg("b64")
                b.op(f"add.s64 {a}, {self.rowptr[leaf.name]}, {off}")
                addrs[leaf.name] = a
        ctx = _Ctx("gather", -1, gather=(ok, addrs))
        val = self._as_f32(*self._eval(n.x, ctx))
        r = b.reg("f32")
        b.op(f"selp.f32 {r}, {val}, 0f7FC00000, {ok}")
        return (r, "f32")

    # ---------------------------------------------------------------- elementwise evaluation

    def _eval(self, n: E.Node, ctx: _Ctx):
        if n in ctx.memo:
            return ctx.memo[n]
        if self.level[n] == SCALAR:
            if n not in self.scal:
                raise EmitError(f"internal: per-row value {type(n).__name__} not prepared")
            return self.scal[n]
        if (
            ctx.kind == "elem"
            and self.mode == "cached"
            and n in self.mat_regs
            and self.stages[n] < ctx.pass_no
        ):
            v = (self.mat_regs[n][ctx.e], "f32")
        elif isinstance(n, E.Input):
            v = (self._leaf(n, ctx), "f32")
        elif (
            isinstance(n, E.Binary)
            and n.op == "div"
            and ("rcp", n.b) in self.scal
            and self.level[n.a] == ROW
        ):
            a = self._as_f32(*self._eval(n.a, ctx))
            r = self.b.reg("f32")
            self.b.op(f"mul.f32 {r}, {a}, {self.scal[('rcp', n.b)][0]}")
            v = (r, "f32")
        else:
            args = [self._eval(c, ctx) for c in E.children(n)]
            v = self._apply(n, args)
        ctx.memo[n] = v
        return v

    def _leaf(self, n: E.Input, ctx: _Ctx) -> str:
        b = self.b
        t = self.tensors[n.name]
        if ctx.kind == "gather":
            ok, addrs = ctx.gather
            if t.elem_bytes == 4:
                raw = b.reg("b32")
                b.op(f"mov.b32 {raw}, 0")
                b.op(f"@{ok} ld.global.b32 {raw}, [{addrs[n.name]}]")
                return self._unpack_word(t.dtype, raw, 0)
            h = b.reg("b16")
            b.op(f"mov.b16 {h}, 0")
            b.op(f"@{ok} ld.global.b16 {h}, [{addrs[n.name]}]")
            return self._unpack_half(t.dtype, h)
        k, j = divmod(ctx.e, self.V)
        words = ctx.chunk_regs[n.name][k]
        if t.elem_bytes == 4:
            return self._unpack_word(t.dtype, words[j], 0)
        return self._unpack_word(t.dtype, words[j // 2], j % 2)

    def _unpack_word(self, dtype: str, word: str, half: int) -> str:
        """Element `half` (0 = low) of a 32-bit word as f32."""
        b = self.b
        f = b.reg("f32")
        if dtype == "fp32":
            b.op(f"mov.b32 {f}, {word}")
        elif dtype == "int32":
            b.op(f"cvt.rn.f32.s32 {f}, {word}")
        elif dtype == "bf16":
            # bf16 -> f32 is the 16 bits moved to the top of the word.
            w = b.reg("b32")
            if half == 0:
                b.op(f"shl.b32 {w}, {word}, 16")
            else:
                b.op(f"and.b32 {w}, {word}, -65536")
            b.op(f"mov.b32 {f}, {w}")
        elif dtype == "fp16":
            lo, hi = b.reg("b16"), b.reg("b16")
            b.op(f"mov.b32 {{{lo}, {hi}}}, {word}")
            b.op(f"cvt.f32.f16 {f}, {hi if half else lo}")
        else:
            raise EmitError(f"cannot read {dtype} elements")
        return f

    def _unpack_half(self, dtype: str, h: str) -> str:
        b = self.b
        f = b.reg("f32")
        b.op(f"cvt.f32.{'bf16' if dtype == 'bf16' else 'f16'} {f}, {h}")
        return f

    def _as_f32(self, reg: str, kind: str) -> str:
        if kind == "f32":
            return reg
        r = self.b.reg("f32")
        self.b.op(f"selp.f32 {r}, 0f3F800000, 0f00000000, {reg}")
        return r

    def _as_pred(self, reg: str, kind: str) -> str:
        if kind == "pred":
            return reg
        p = self.b.reg("pred")
        self.b.op(f"setp.neu.f32 {p}, {reg}, 0f00000000")
        return p

    def _apply(self, n: E.Node, args):
        b, fast = self.b, self.fast
        if isinstance(n, E.Unary):
            fn = ops.UNARY.get(n.op)
            if fn is None:
                raise EmitError(f"no PTX for unary {n.op}")
            return (fn(b, self._as_f32(*args[0]), fast), "f32")
        if isinstance(n, E.Binary):
            x = self._as_f32(*args[0])
            if n.op == "pow":
                return (ops.pow_const(b, x, float(n.b.value), fast), "f32")
            fn = ops.BINARY.get(n.op)
            if fn is None:
                raise EmitError(f"no PTX for binary {n.op}")
            return (fn(b, x, self._as_f32(*args[1]), fast), "f32")
        if isinstance(n, E.Compare):
            return (ops.compare(b, n.op, self._as_f32(*args[0]), self._as_f32(*args[1])), "pred")
        if isinstance(n, E.Where):
            p = self._as_pred(*args[0])
            r = b.reg("f32")
            b.op(f"selp.f32 {r}, {self._as_f32(*args[1])}, {self._as_f32(*args[2])}, {p}")
            return (r, "f32")
        if isinstance(n, E.Cast):
            return (ops.cast_round(b, self._as_f32(*args[0]), n.to), "f32")
        raise EmitError(f"cannot render {type(n).__name__}")


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)
