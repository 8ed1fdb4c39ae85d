"""The expression evaluator: per-row (scalar-level) values, computed once per pass before it
branches, and each element's value, from the registers its chunk was loaded into (or a
materialised intermediate), as f32 or a predicate; gathers x[row, idx[row]]."""

from __future__ import annotations

from factory.emit import ops
from factory.emit.ptx import EmitError
from factory.families.row.ir import ROLE_ROW, ROW, SCALAR
from factory.spec import expr as E


class _Ctx:
    """Where an element's leaves come from during one evaluation."""

    def __init__(self, kind: str, pass_no: int, e: int = 0, chunk_regs=None, gather=None):
        self.kind = kind  # "elem" or "gather"
        self.pass_no = pass_no
        self.e = e  # element index k*V + j inside the thread's chunk group
        self.chunk_regs = chunk_regs  # name -> list over chunks of lists of b32 regs
        self.gather = gather  # name -> (pred, b64 address) for gathers
        self.memo: dict = {}


class EvalMixin:
    """Per-row and per-element evaluation of the IR (see the module)."""

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
