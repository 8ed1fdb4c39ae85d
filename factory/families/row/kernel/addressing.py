"""Addressing and tails: the kernel's prologue (parameters, thread, row and warp indices, the
barriers, cache policies, the vector and fast-path predicates), each row's pointers (and under
the "shifted" tail its window), and the tail path's predicates.

Each pass has a fast path (every chunk of this thread is whole and 16-byte aligned: vector loads
and stores, no predicates) and a tail path, so every kernel is correct for any M >= 1 and N >= 1.
How the tail path moves a row is the schedule's `tail`: element by element, each under its own
predicate, a thread's elements consecutive ("elements") or strided T apart so that a warp's
accesses are ("strided"); or "vectors": the element tail, and beside it, where N is a multiple
of V and the rows are aligned, each chunk whole or past the row's end, moved as one vector under
one predicate; or "stream": that vector tail alone in registers, a row it cannot serve taking the
stream path (no registers held for an element tail); or "shifted": the row walked from the
16-byte-aligned address at or before its start.
"""

from __future__ import annotations

from factory.families.row.ir import ROLE_COL, ROLE_ROW, ROLE_ROWSCALAR, ROLE_SCALAR, TensorRef
from factory.families.row.kernel.loads import CACHE_POLICY
from factory.spec import expr as E


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


class AddressingMixin:
    """The prologue, row pointers and tail predicates (see the module)."""

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
        # not).
        # A row of several warps chooses per warp, by the warp's last thread: every lane of a
        # warp then takes one path, and the warps whose chunks are all whole keep the fast one
        # (at 2000 columns in 64 threads of four chunks, the second warp's lanes 26-31 hold the
        # row's end, and a choice per thread runs both paths in that warp). A thread's chunks
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

    def _clamp_row(self) -> None:
        """This iteration's row of a persistent loop over rows under a warp: the last row, with
        its stores off, for a group past it (row_ok; is_t0 writes per-row outputs)."""
        b = self.b
        b.op(f"setp.lt.u32 {self.row_ok}, {self.row_raw}, {self.rows}")
        b.op(f"min.u32 {self.row}, {self.row_raw}, {self.row_last}")
        b.op(f"and.pred {self.is_t0}, {self.t_zero}, {self.row_ok}")

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

    def _chunk_stride_bytes(self, eb: int) -> int:
        return self.T * self.V * eb

    def _chunk_rem(self, n_minus: str, k: int) -> str:
        """Elements of the row left from this thread's chunk k on (may be <= 0)."""
        if k == 0:
            return n_minus
        r = self.b.reg("b32")
        self.b.op(f"sub.s32 {r}, {n_minus}, {k * self.T * self.V}")
        return r

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
