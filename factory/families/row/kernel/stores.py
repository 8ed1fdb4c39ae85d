"""Stores: a chunk as 16-byte vectors (16-bit outputs packed two to a word), an element of the
tail, a per-row scalar; each under the row's predicate (row_ok) and the schedule's store hint."""

from __future__ import annotations

from factory.spec import expr as E

STORE_PREFIX = {
    "none": "st.global",
    "cs": "st.global.cs",
    "noalloc": "st.global.L1::no_allocate",
    "l2first": "st.global.L2::cache_hint",
    "l2last": "st.global.L2::cache_hint",
}


class StoresMixin:
    """Stores of row and per-row outputs (see the module)."""

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
