"""The translator's own small expression graph, and its rendering as manifest text.

Nodes mirror `factory.spec.expr` (the language the manifest is written in) but carry the extra
facts the translation needs: shapes whose entries are dim labels (renamed at render time), a
value kind (float, index, mask), and pushdown rewrites that add or remove axes of size 1, which
the language has no syntax for (PyTorch's unsqueeze/squeeze/keepdim views).

Nodes are interned (`Graph.make`): a structurally equal sub-expression is one node, so a value
PyTorch computes twice (`(x - m).exp()` in two places) is written once, as a `[let]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Precedence levels of the rendered Python expression syntax.
_ATOM, _POW, _UNARY, _MUL, _ADD, _CMP = 100, 90, 80, 70, 60, 50
_BIN_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "matmul": "@"}
_BIN_LEVEL = {"add": _ADD, "sub": _ADD, "mul": _MUL, "div": _MUL, "pow": _POW, "matmul": _MUL}
_CMP_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_CAST_FUNC = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


class ShapeError(Exception):
    """A rewrite the language cannot express; the translator names the node it came from."""


@dataclass(eq=False)
class INode:
    """kind: in const un bin cmp where red gather cast T arg pool scan flip. `args` are child
    nodes; `attrs` the rest (op name, axis, keepdims, dtype, constant value, input name; a
    pool's window, stride and padding; a scan's axis, exclusive and reverse; a flip's axes)."""

    kind: str
    op: str
    args: tuple
    attrs: tuple
    shape: tuple
    vkind: str  # "float", "index" or "mask"
    uid: int = field(default=0)

    @property
    def rank(self) -> int:
        return len(self.shape)


def broadcast(a: tuple, b: tuple) -> tuple:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"shapes {a} and {b} do not broadcast")
    return tuple(reversed(out))


class Graph:
    def __init__(self) -> None:
        self._interned: dict[tuple, INode] = {}
        self.hints: dict[int, str] = {}  # node uid -> a name for its [let] or constant

    # -- construction ------------------------------------------------------------------------

    def make(self, kind, op, args, attrs, shape, vkind, hint: str | None = None) -> INode:
        key = (kind, op, tuple(a.uid for a in args), attrs, tuple(shape), vkind)
        node = self._interned.get(key)
        if node is None:
            node = INode(kind, op, tuple(args), attrs, tuple(shape), vkind, len(self._interned) + 1)
            self._interned[key] = node
        if hint and node.uid not in self.hints:
            self.hints[node.uid] = hint
        return node

    def input(self, name: str, shape: tuple, vkind: str) -> INode:
        return self.make("in", "", (), (name,), shape, vkind)

    def const(self, value: float, hint: str | None = None) -> INode:
        value = float(value)
        if math.isinf(value):  # the language caps constants at 1e30; exp(-1e30 - m) is 0 too
            value = math.copysign(1e30, value)
        if value == 0.0:
            value = 0.0  # -0.0 and 0.0 are one constant
        return self.make("const", "", (), (value,), (), "float", hint)

    def unary(self, op: str, x: INode, hint=None) -> INode:
        if op == "neg" and x.kind == "const":
            return self.const(-x.attrs[0])
        return self.make("un", op, (x,), (), x.shape, "float", hint)

    def binary(self, op: str, a: INode, b: INode, hint=None) -> INode:
        if op == "pow" and b.kind != "const":
            raise ShapeError("the exponent of ** must be a constant")
        if op == "sub" and a.kind == "scan" and a.op == "sum" and not a.attrs[1] and a.args[0] is b:
            # x.cumsum(d) - x: the exclusive prefix sum (element i sums elements 0..i-1)
            return self.scan("sum", b, a.attrs[0], True, a.attrs[2], hint)
        if a.kind == "const" and b.kind == "const" and op in ("add", "sub", "mul", "div"):
            x, y = a.attrs[0], b.attrs[0]
            if not (op == "div" and y == 0.0):
                return self.const({"add": x + y, "sub": x - y, "mul": x * y}.get(op, x / (y or 1)))
        return self.make("bin", op, (a, b), (), broadcast(a.shape, b.shape), "float", hint)

    def compare(self, op: str, a: INode, b: INode) -> INode:
        return self.make("cmp", op, (a, b), (), broadcast(a.shape, b.shape), "mask")

    def where(self, c: INode, a: INode, b: INode, hint=None) -> INode:
        shape = broadcast(broadcast(c.shape, a.shape), b.shape)
        return self.make("where", "", (c, a, b), (), shape, "float", hint)

    def reduce(self, op: str, x: INode, axis: int, keepdims: bool, hint=None) -> INode:
        axis %= x.rank
        if x.shape[axis] == 1 and op in ("max", "min", "mean", "sum"):
            # Reducing an axis of one element is the element itself.
            return x if keepdims else self.squeeze(x, axis)
        shape = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1 :]
        return self.make("red", op, (x,), (axis, keepdims), shape, "float", hint)

    def argreduce(self, op: str, x: INode, axis: int, keepdims: bool) -> INode:
        """argmax/argmin along `axis`: an index value (the first on ties), only ever an output."""
        axis %= x.rank
        shape = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1 :]
        return self.make("arg", op, (x,), (axis, keepdims), shape, "index")

    def pool(self, op: str, x: INode, window: tuple, stride: tuple, padding: tuple,
             shape: tuple, hint=None) -> INode:  # fmt: skip
        """maxpool/avgpool over the trailing len(window) axes; `shape` names the pooled axes."""
        return self.make("pool", op, (x,), (window, stride, padding), shape, "float", hint)

    def scan(self, op: str, x: INode, axis: int, exclusive: bool, reverse: bool,
             hint=None) -> INode:  # fmt: skip
        """cumsum/cumprod (op "sum"/"prod") along `axis`, the language's exclusive and reverse.
        A scan of a flip is a flip of the scan the other way round (element i of the scan of
        x reversed along `axis` is element n-1-i of x's reverse scan; a flip along another
        axis commutes with it), so x.flip(d).cumsum(d).flip(d) is cumsum(x, reverse=True)."""
        axis %= x.rank
        if x.kind == "flip":
            axes = x.attrs[0]
            inner = self.scan(op, x.args[0], axis, exclusive, reverse ^ (axis in axes), hint)
            return self.flip(inner, axes)
        if x.shape[axis] == 1 and not exclusive:
            return x  # the scan of one element is the element
        return self.make("scan", op, (x,), (axis, exclusive, reverse), x.shape, "float", hint)

    def flip(self, x: INode, axes) -> INode:
        """x reversed along `axes` (axes of 1 drop out; a flip of a flip along the same axis
        cancels). Not in the language: it only ever translates where a scan and a second flip
        absorb it (`scan`); the translator refuses a flip left in the graph."""
        axes = {a % x.rank for a in axes if x.shape[a % x.rank] != 1}
        if x.kind == "flip":
            axes ^= set(x.attrs[0])
            x = x.args[0]
        if not axes:
            return x
        return self.make("flip", "", (x,), (tuple(sorted(axes)),), x.shape, x.vkind)

    def gather(self, x: INode, idx: INode, hint=None) -> INode:
        return self.make("gather", "", (x, idx), (), idx.shape, "float", hint)

    def cast(self, x: INode, to: str) -> INode:
        if x.kind == "cast" and x.attrs[0] == to:
            return x
        return self.make("cast", "", (x,), (to,), x.shape, "float")

    def transpose(self, x: INode) -> INode:
        if x.rank != 2:
            raise ShapeError(
                f"only a 2-D tensor can be transposed in the manifest language (w.T); this one "
                f"has {x.rank} axes"
            )
        if x.kind == "T":
            return x.args[0]
        return self.make("T", "", (x,), (), (x.shape[1], x.shape[0]), "float")

    def matmul(self, a: INode, b: INode, hint=None) -> INode:
        if a.rank < 2 or b.rank < 2:
            raise ShapeError("matmul needs operands of at least two axes")
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"matmul of shapes {a.shape} and {b.shape}")
        batch = broadcast(a.shape[:-2], b.shape[:-2])
        shape = batch + (a.shape[-2], b.shape[-1])
        return self.make("bin", "matmul", (a, b), (), shape, "float", hint)

    # -- axes of size 1 ----------------------------------------------------------------------

    def unsqueeze(self, x: INode, q: int) -> INode:
        """x with a new axis of size 1 at position q (0 <= q <= rank); pushed down to the leaves
        (a reduction keeps its axis, an elementwise op unsqueezes its operands)."""
        if q == 0 or x.kind == "const":
            return x  # a leading axis of 1 is what broadcasting does anyway
        if x.kind in ("un", "cast"):
            return self._rebuild(x, [self.unsqueeze(x.args[0], q)])
        if x.kind in ("bin", "cmp", "where") and x.op != "matmul":
            kids = []
            for c in x.args:
                cq = q - (x.rank - c.rank)
                kids.append(c if cq <= 0 else self.unsqueeze(c, cq))
            return self._rebuild(x, kids)
        if x.kind == "red":
            axis, keep = x.attrs
            child = x.args[0]
            if not keep:
                if q == axis:
                    return self.make("red", x.op, (child,), (axis, True), _ins(x.shape, q, 1),
                                     "float", self.hints.get(x.uid))  # fmt: skip
                cq = q if q < axis else q + 1
            else:
                cq = q
            new_axis = axis + (1 if cq <= axis else 0)
            inner = self.unsqueeze(child, cq)
            return self.make("red", x.op, (inner,), (new_axis, keep), _ins(x.shape, q, 1),
                             "float", self.hints.get(x.uid))  # fmt: skip
        if x.kind == "arg":
            axis, keep = x.attrs
            if not keep and q == axis:
                return self.argreduce(x.op, x.args[0], axis, True)
        if x.kind == "pool" and q <= x.rank - len(x.attrs[0]):
            inner = self.unsqueeze(x.args[0], q)
            return self.pool(x.op, inner, *x.attrs, _ins(x.shape, q, 1), self.hints.get(x.uid))
        if x.kind == "scan":
            axis, exclusive, reverse = x.attrs
            inner = self.unsqueeze(x.args[0], q)
            return self.scan(x.op, inner, axis + (q <= axis), exclusive, reverse,
                             self.hints.get(x.uid))  # fmt: skip
        if x.kind == "flip":
            inner = self.unsqueeze(x.args[0], q)
            return self.flip(inner, [a + (q <= a) for a in x.attrs[0]])
        what = {"in": "an input", "gather": "a gather", "T": "a transposed matrix",
                "arg": "an argmax/argmin", "pool": "a pooling's window axes"}.get(
            x.kind, "a matrix product"
        )  # fmt: skip
        raise ShapeError(
            f"a new axis of size 1 inside {what} (shape {x.shape}) has no equivalent in the "
            "manifest language"
        )

    def squeeze(self, x: INode, q: int) -> INode:
        """x without its axis q of size 1."""
        if x.shape[q] != 1:
            raise ShapeError(f"axis {q} of shape {x.shape} is not 1")
        if x.kind in ("un", "cast"):
            return self._rebuild(x, [self.squeeze(x.args[0], q)])
        if x.kind in ("bin", "cmp", "where") and x.op != "matmul":
            kids = []
            for c in x.args:
                cq = q - (x.rank - c.rank)
                kids.append(c if cq < 0 else self.squeeze(c, cq))
            return self._rebuild(x, kids)
        if x.kind == "red" and x.attrs[1] and x.attrs[0] == q:
            return self.make("red", x.op, x.args, (q, False), _drop(x.shape, q), "float",
                             self.hints.get(x.uid))  # fmt: skip
        if x.kind == "arg":
            if x.attrs[1] and x.attrs[0] == q:
                return self.argreduce(x.op, x.args[0], q, False)
            raise ShapeError("an argmax/argmin's index is an output as it is (keepdim or not)")
        if x.kind == "pool" and q < x.rank - len(x.attrs[0]):
            inner = self.squeeze(x.args[0], q)
            return self.pool(x.op, inner, *x.attrs, _drop(x.shape, q), self.hints.get(x.uid))
        if x.kind == "scan" and q != x.attrs[0]:
            axis, exclusive, reverse = x.attrs
            inner = self.squeeze(x.args[0], q)
            return self.scan(x.op, inner, axis - (q < axis), exclusive, reverse,
                             self.hints.get(x.uid))  # fmt: skip
        if x.kind == "flip":  # its axes are not of size 1
            inner = self.squeeze(x.args[0], q)
            return self.flip(inner, [a - (q < a) for a in x.attrs[0]])
        # Anything else (an input declared with an axis of 1): reducing one element is exact.
        return self.make("red", "max", (x,), (q, False), _drop(x.shape, q), "float")

    def _rebuild(self, x: INode, kids: list) -> INode:
        hint = self.hints.get(x.uid)
        if x.kind == "un":
            return self.unary(x.op, kids[0], hint)
        if x.kind == "cast":
            return self.cast(kids[0], x.attrs[0])
        if x.kind == "bin":
            return self.binary(x.op, kids[0], kids[1], hint)
        if x.kind == "cmp":
            return self.compare(x.op, kids[0], kids[1])
        return self.where(kids[0], kids[1], kids[2], hint)

    def substitute(self, roots: list[INode], mapping: dict[int, INode]) -> list[INode]:
        """Rebuild `roots` with every node whose uid is in `mapping` replaced (operands of the
        replacements themselves are left alone)."""
        memo: dict[int, INode] = {}

        def go(n: INode) -> INode:
            if n.uid in mapping:
                return mapping[n.uid]
            if n.uid in memo:
                return memo[n.uid]
            kids = tuple(go(c) for c in n.args)
            if all(k is c for k, c in zip(kids, n.args, strict=True)):
                out = n
            else:
                out = self.make(
                    n.kind, n.op, kids, n.attrs, n.shape, n.vkind, self.hints.get(n.uid)
                )
            memo[n.uid] = out
            return out

        return [go(r) for r in roots]


def _ins(shape: tuple, q: int, v) -> tuple:
    return shape[:q] + (v,) + shape[q:]


def _drop(shape: tuple, q: int) -> tuple:
    return shape[:q] + shape[q + 1 :]


def walk(roots: list[INode]) -> list[INode]:
    """Every node reachable from `roots`, operands first."""
    seen: set[int] = set()
    order: list[INode] = []
    stack: list[tuple[INode, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, done = stack.pop()
        if done:
            if n.uid not in seen:
                seen.add(n.uid)
                order.append(n)
            continue
        if n.uid in seen:
            continue
        stack.append((n, True))
        for c in reversed(n.args):
            if c.uid not in seen:
                stack.append((c, False))
    return order


# -- rendering -----------------------------------------------------------------------------------


def format_number(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


class Renderer:
    """Turns the graph under `outputs` into expression texts: a node used more than once (or
    whose text grows long) becomes a named `[let]`; named constants go to `[constants]`."""

    LONG = 600  # characters; MAX_EXPR_CHARS is 2000

    def __init__(self, graph: Graph, dim_names: dict, taken: set[str], reserved: set[str]):
        self.g = graph
        self.dim_names = dim_names
        self.taken = set(taken)
        self.reserved = reserved
        self.lets: list[tuple[str, str]] = []
        self.constants: list[tuple[str, float]] = []
        self._names: dict[int, str] = {}
        self._const_names: dict[float, str] = {}
        # reduction uid -> (its innermost operand's text, the axes of that operand it reduces,
        # the operand's rank): nested reductions of one kind are written as one, axis=(2, 3)
        self._red: dict[int, tuple[str, tuple[int, ...], int]] = {}
        self._uses: dict[int, int] = {}

    def fresh(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "t"
        if not base[0].isalpha():
            base = "t_" + base
        base = base[:28]
        name, i = base, 1
        while name in self.taken or name in self.reserved:
            name = f"{base}_{i}"
            i += 1
        self.taken.add(name)
        return name

    def render(self, outputs: list[INode]) -> list[str]:
        order = walk(outputs)
        uses: dict[int, int] = {n.uid: 0 for n in order}
        for n in order:
            for c in n.args:
                uses[c.uid] += 1
        roots = {o.uid for o in outputs}
        self._uses = uses
        text: dict[int, tuple[str, int]] = {}
        for n in order:
            t = self._text(n, text)
            shared = uses[n.uid] > 1 or (n.uid in roots and uses[n.uid] > 0)
            trivial = n.kind in ("in", "const") or (n.kind == "T" and n.args[0].kind == "in")
            long = len(t[0]) > self.LONG and n.uid not in roots
            if (shared or long) and not trivial and n.vkind != "mask":
                name = self.fresh(self.g.hints.get(n.uid) or "t")
                self.lets.append((name, t[0]))
                t = (name, _ATOM)
                self._red.pop(n.uid, None)  # a named reduction is not merged into its user
            text[n.uid] = t
        return [text[o.uid][0] for o in outputs]

    def _const(self, n: INode) -> tuple[str, int]:
        v = n.attrs[0]
        hint = self.g.hints.get(n.uid)
        if hint:
            name = self._const_names.get(v)
            if name is None:
                name = self.fresh(hint)
                self._const_names[v] = name
                self.constants.append((name, v))
            return name, _ATOM
        s = format_number(v)
        return s, (_UNARY if s.startswith("-") else _ATOM)

    def _text(self, n: INode, text) -> tuple[str, int]:
        def arg(i: int, level: int, strict: bool = False) -> str:
            s, lv = text[n.args[i].uid]
            return f"({s})" if (lv < level or (strict and lv == level)) else s

        k = n.kind
        if k == "in":
            return n.attrs[0], _ATOM
        if k == "const":
            return self._const(n)
        if k == "un":
            if n.op == "neg":
                return "-" + arg(0, _UNARY), _UNARY
            return f"{n.op}({text[n.args[0].uid][0]})", _ATOM
        if k == "bin":
            if n.op in ("max", "min"):
                return f"{n.op}({text[n.args[0].uid][0]}, {text[n.args[1].uid][0]})", _ATOM
            level = _BIN_LEVEL[n.op]
            if n.op == "pow":  # right-associative: the base needs parentheses at equal level
                return f"{arg(0, level, strict=True)} ** {arg(1, _UNARY)}", level
            return f"{arg(0, level)} {_BIN_SYMBOL[n.op]} {arg(1, level, strict=True)}", level
        if k == "cmp":
            return f"{arg(0, _ADD)} {_CMP_SYMBOL[n.op]} {arg(1, _ADD)}", _CMP
        if k == "where":
            parts = [text[c.uid][0] for c in n.args]
            return f"where({parts[0]}, {parts[1]}, {parts[2]})", _ATOM
        if k == "red":
            return self._reduction(n, text), _ATOM
        if k == "arg":
            axis, keep = n.attrs
            kw = f", axis={axis - n.args[0].rank}" + (", keepdims=True" if keep else "")
            return f"{n.op}({text[n.args[0].uid][0]}{kw})", _ATOM
        if k == "pool":
            window, stride, padding = n.attrs

            def ints(v: tuple, single: bool) -> str:
                if len(v) == 1 or (single and len(set(v)) == 1):
                    return str(v[0])
                return "(" + ", ".join(str(i) for i in v) + ")"

            kw = f"window={ints(window, False)}, stride={ints(stride, True)}"
            if any(padding):
                kw += f", padding={ints(padding, True)}"
            return f"{n.op}pool({text[n.args[0].uid][0]}, {kw})", _ATOM
        if k == "scan":
            axis, exclusive, reverse = n.attrs
            kw = f", axis={axis - n.rank}"
            kw += (", exclusive=True" if exclusive else "") + (", reverse=True" if reverse else "")
            return f"cum{n.op}({text[n.args[0].uid][0]}{kw})", _ATOM
        if k == "gather":
            return f"gather({text[n.args[0].uid][0]}, {text[n.args[1].uid][0]})", _ATOM
        if k == "cast":
            return f"{_CAST_FUNC[n.attrs[0]]}({text[n.args[0].uid][0]})", _ATOM
        if k == "T":
            return f"{arg(0, _ATOM, strict=False)}.T", _ATOM
        raise ShapeError(f"unknown node kind {k}")

    def _reduction(self, n: INode, text) -> str:
        """sum/mean/max/min over one axis, or over several where the operand is a reduction of
        the same kind used nowhere else: `mean(x, axis=(2, 3), keepdims=True)` and
        `mean(d, axis=None)`, as the catalogue writes them. The language reads those as the
        same nested single-axis reductions (the highest axis first), so only the text differs."""
        axis, keep = n.attrs
        c = n.args[0]
        inner = self._red.get(c.uid)
        merged = None
        if (
            inner is not None
            and c.kind == "red"
            and c.op == n.op
            and c.attrs[1] == keep
            and self._uses.get(c.uid) == 1
        ):
            base, axes, rank = inner
            if keep:
                outer = axis
            else:
                outer = [i for i in range(rank) if i not in axes][axis]
            if outer < min(axes):
                merged = (base, (outer, *axes), rank)
        if merged is None:
            merged = (text[c.uid][0], (axis,), c.rank)
        self._red[n.uid] = merged
        base, axes, rank = merged
        if len(axes) == 1:
            kw = f", axis={axes[0] - rank}"
        elif len(axes) == rank and not keep:
            kw = ", axis=None"
        else:
            kw = ", axis=(" + ", ".join(str(a) for a in sorted(axes)) + ")"
        return f"{n.op}({base}{kw}" + (", keepdims=True" if keep else "") + ")"
