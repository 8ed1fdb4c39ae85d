"""The row kernel: one group of `threads_per_row` threads per row, one pass per stage.

Layout of a row among the T threads of its group: thread t owns chunks of V consecutive elements
at columns t*V + k*T*V (k = 0, 1, ...), so a warp's 16-byte accesses cover 512 contiguous bytes.
Two ways to walk the row:

- cached: all K chunks are loaded once into registers (every load in flight before the first
  use), and every pass runs over the registers; a row longer than T*V*K takes the stream path.
- stream: every pass loops over the row, U = `chunks` chunks per iteration, loading again (the
  second read of a row usually hits L2).

`RowKernel` is composed of one part per section of the kernel, each a module of this package:

- `plan`: the stage of every node, the passes and what each finishes, materialisation;
- `addressing`: the prologue (indices, barriers, policies, fast-path predicates), each row's
  pointers, and the tail paths' predicates (the schedule's `tail`);
- `loads`: row, column and per-row loads, prefetching, shifted steps;
- `passes`: the body of a row (or several), each pass's fast and tail paths, per-element work;
- `reductions`: across the row's threads, warps and cluster, through `factory.emit.reduce`;
- `stores`: chunks, tail elements and per-row values;
- `evaluation`: the expression evaluator (per-row values and each element's).

This module holds the constructor (which refuses what the layout cannot render), the row loop
(`render`) and the kernel's text (`_assemble`).
"""

from __future__ import annotations

from factory.emit import reduce as R
from factory.emit.ptx import Builder, EmitError
from factory.emit.reduce import COMBINE, IDENTITY, NEG_INF
from factory.emit.types import Emitted
from factory.families.row.ir import ROLE_COL, ROLE_ROW, KernelIR, TensorRef, reduction_aliases
from factory.families.row.kernel.addressing import AddressingMixin, _ident
from factory.families.row.kernel.evaluation import EvalMixin
from factory.families.row.kernel.loads import CACHE_POLICY, COL_WORDS, LOAD_PREFIX, LoadsMixin
from factory.families.row.kernel.passes import PassesMixin
from factory.families.row.kernel.plan import (
    EXPENSIVE_UNARY,
    MAX_MATERIALISED_REGS,
    PlanMixin,
    compute_stages,
)
from factory.families.row.kernel.reductions import ReductionsMixin
from factory.families.row.kernel.stores import STORE_PREFIX, StoresMixin
from factory.families.row.schedules import (
    NUM_SMS,
    ROWS_PER_THREAD_RULE,
    Schedule,
    holds_cols,
    packed_pairs,
    rows_per_thread_ok,
)
from factory.spec.types import KernelParam, Launch

__all__ = [
    "CACHE_POLICY",
    "COL_WORDS",
    "COMBINE",
    "EXPENSIVE_UNARY",
    "IDENTITY",
    "LOAD_PREFIX",
    "MAX_MATERIALISED_REGS",
    "NEG_INF",
    "STORE_PREFIX",
    "RowKernel",
    "compute_stages",
]


class RowKernel(
    PlanMixin,
    AddressingMixin,
    LoadsMixin,
    PassesMixin,
    ReductionsMixin,
    StoresMixin,
    EvalMixin,
):
    """The emitter of one row kernel: `RowKernel(ir, schedule, arch).render()`."""

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
        self.bfly = R.butterfly_offsets(self.TB)
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
            # stay live for a next row (fewer registers, hence more blocks per SM).
            b.comment("one row group per block: done")
        b.label(done)
        if self.C > 1:
            b.comment("no block leaves while another of its cluster may read its shared memory")
            R.cluster_barrier(b)
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
