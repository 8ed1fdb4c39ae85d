"""Loads: a row's chunks into registers (all in flight before the first use), the next row's
(prefetch_rows), per-column vectors held across rows, the tail's predicated loads, a shifted
row's steps (a 2-byte per-column vector's chunks as 4-byte words put in place), per-row scalars,
and the cache hint of each."""

from __future__ import annotations

from factory.families.row.ir import ROLE_COL, ROLE_ROW, TensorRef
from factory.spec import expr as E

# A 2-byte column vector's whole chunks on shifted rows move as 4-byte words put in place
# (_col_words); False moves them element by element.
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


class LoadsMixin:
    """Loads of row, column and per-row data (see the module)."""

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

    def _alloc_chunk_regs(self, names: list[str], chunks: int) -> dict:
        regs = {}
        for name in names:
            eb = self.tensors[name].elem_bytes
            words = self.V * eb // 4
            regs[name] = [[self.b.reg("b32") for _ in range(words)] for _ in range(chunks)]
        return regs

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
