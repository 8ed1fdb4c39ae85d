"""The body of a row and its passes: the row (or with rows_per_thread several rows) held in
registers or streamed, each pass's accumulators, its fast and tail paths over the chunks, and
the per-element work of a pass (materialised values, reductions' terms, online pairs, stores)."""

from __future__ import annotations

from factory.emit.ptx import f32_literal
from factory.emit.reduce import COMBINE, IDENTITY, NEG_INF
from factory.families.row.ir import ROLE_COL, ROLE_ROW, ROLE_ROWSCALAR
from factory.families.row.kernel.evaluation import _Ctx
from factory.spec import expr as E


class PassesMixin:
    """A row's body and passes (see the module)."""

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
        # a choice per warp there would need the warp's first lane for `inside`)
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
