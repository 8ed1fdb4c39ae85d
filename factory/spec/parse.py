"""The operator expression language: Python expression syntax, parsed with `ast` (mode="eval"),
checked against a whitelist and turned into the nodes of `factory.spec.expr`. Nothing is ever
eval'ed or compiled; names resolve only to the tensors, lets and constants of the manifest.

Grammar (everything else is refused with a SpecError naming the field):
  numbers; names; + - * / ; ** with a constant exponent |e| <= 16; unary -;
  one comparison < <= > >= == != (gives a mask, usable only as where's condition);
  where(c, a, b); exp log sqrt rsqrt tanh sigmoid erf abs;
  max(a, b) / min(a, b) elementwise; sum/mean/max/min(x, axis=-1, keepdims=False) reductions;
  gather(x, idx) along the last axis; casts f32(x) bf16(x) f16(x);
  a @ b and matmul(a, b) over the last two axes (leading batch axes broadcast), w.T (a 2-D tensor
  with its axes swapped: `x @ w.T` multiplies by a weight stored [N, K], as torch's F.linear);
  sum/mean/max/min/prod(x, axis=(0, 2), keepdims=False) over a tuple of axes or axis=None (every
  axis; nested single-axis Reduce nodes, innermost axis first); cumsum/cumprod(x, axis=-1,
  exclusive=False, reverse=False); argmax/argmin(x, axis=-1, keepdims=False) (an index value,
  the first on ties); the constants inf and -inf;
  maxpool/avgpool(x, window=3 or (3, 3), stride=window, padding=0) over the trailing one or two
  axes (a pooled axis becomes a derived dim, see expr.Pool).
Broadcasting follows numpy's rules on symbolic shapes.
"""

from __future__ import annotations

import ast
import math
import re
import warnings

from factory.spec.expr import (
    ArgReduce,
    Binary,
    Cast,
    Compare,
    Const,
    Gather,
    Input,
    MatMul,
    Node,
    Pool,
    Reduce,
    Scan,
    Shape,
    Transpose,
    Unary,
    Where,
    pooled_dim_name,
    pooled_size,
)
from factory.spec.limits import (
    MAX_CONST_ABS,
    MAX_EXPR_CHARS,
    MAX_EXPR_DEPTH,
    MAX_EXPR_NODES,
    MAX_POW_EXPONENT,
)

UNARY_FUNCS = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs")
CAST_FUNCS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
REDUCE_FUNCS = ("sum", "mean", "max", "min")
SCAN_FUNCS = {"cumsum": "sum", "cumprod": "prod"}
ARG_FUNCS = ("argmax", "argmin")
POOL_FUNCS = {"maxpool": "max", "avgpool": "avg"}
EXTRA_FUNCS = ("prod", *SCAN_FUNCS, *ARG_FUNCS, *POOL_FUNCS)  # parsed by ExprParser._extended
ATTENTION_FUNCS = ("attention", "attention_lse")  # parsed by factory.spec.attention
FUNCTION_NAMES = (
    frozenset(UNARY_FUNCS)
    | set(CAST_FUNCS)
    | set(REDUCE_FUNCS)
    | {"where", "gather", "matmul"}
    | set(EXTRA_FUNCS)
    | set(ATTENTION_FUNCS)
)
INF_NAME = "inf"  # the constant infinity (-inf by unary minus), unless the manifest names one
REDUCE_KEYWORDS = ("axis", "keepdims")

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_ALLOWED_CHARS = re.compile(r"^[ -~\t\n]*$")

# Friendly names for refused syntax; anything not listed is "<ClassName> is not allowed".
_REFUSED = {
    ast.Attribute: "attribute access (a.b) is not allowed (only w.T, a 2-D tensor transposed)",
    ast.Subscript: "subscripts (a[i]) are not allowed; use gather(x, idx)",
    ast.Lambda: "lambdas are not allowed",
    ast.IfExp: "conditional expressions are not allowed; use where(c, a, b)",
    ast.BoolOp: "and/or are not allowed; combine masks with where",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.JoinedStr: "strings are not allowed",
    ast.FormattedValue: "strings are not allowed",
    ast.NamedExpr: "assignment expressions (:=) are not allowed",
    ast.Starred: "starred arguments are not allowed",
    ast.List: "lists are not allowed",
    ast.Tuple: "tuples are not allowed",
    ast.Set: "sets are not allowed",
    ast.Dict: "dicts are not allowed",
    ast.Slice: "slices are not allowed",
    ast.Await: "await is not allowed",
    ast.Yield: "yield is not allowed",
    ast.YieldFrom: "yield is not allowed",
}


class ExprError(Exception):
    """Raised inside the parser; the manifest loader turns it into a SpecError entry.
    `unknown_name` is set when the problem is a name that is not in scope."""

    def __init__(self, message: str, unknown_name: str | None = None):
        super().__init__(message)
        self.unknown_name = unknown_name


def _kind(node: Node) -> str:
    if node.dtype == "bool":
        return "mask"
    if node.dtype in ("int32", "int64"):
        return "index"
    return "float"


def shape_text(shape: Shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + (",)" if len(shape) == 1 else ")")


def broadcast_shapes(a: Shape, b: Shape) -> Shape:
    """numpy broadcasting on symbolic shapes: equal entries match, 1 stretches; anything else is
    an error (two different dim names may differ at run time)."""
    out: list = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ExprError(f"cannot broadcast shapes {shape_text(a)} and {shape_text(b)}")
    return tuple(reversed(out))


class ExprParser:
    """Parses expressions against a scope of names -> nodes. Nodes are interned in `interner`,
    so a structurally equal sub-expression is the same object everywhere in the workload."""

    def __init__(self, scope: dict[str, Node], interner: dict[Node, Node] | None = None):
        self.scope = scope
        self.interner = interner if interner is not None else {}
        self._count = 0

    def make(self, node: Node) -> Node:
        return self.interner.setdefault(node, node)

    def parse(self, text: object) -> Node:
        if not isinstance(text, str):
            raise ExprError("must be a string")
        if len(text) > MAX_EXPR_CHARS:
            raise ExprError(f"longer than {MAX_EXPR_CHARS} characters")
        if not _ALLOWED_CHARS.match(text):
            raise ExprError("only printable ASCII characters are allowed")
        if not text.strip():
            raise ExprError("is empty")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # "1if x else 2" and friends: refuse, don't print
                tree = ast.parse(text.strip(), mode="eval")
        except SyntaxWarning as e:
            raise ExprError(f"syntax error: {str(e)[:100]}") from None
        except SyntaxError as e:
            raise ExprError(f"syntax error at column {e.offset or 0}: {e.msg}") from None
        except (ValueError, RecursionError, MemoryError):
            raise ExprError("cannot be parsed (too complex)") from None
        self._count = 0
        return self._visit(tree.body, 0)

    # -- the walk -----------------------------------------------------------------------------

    def _visit(self, n: ast.AST, depth: int) -> Node:
        if depth > MAX_EXPR_DEPTH:
            raise ExprError(f"nested deeper than {MAX_EXPR_DEPTH} levels")
        self._count += 1
        if self._count > MAX_EXPR_NODES:
            raise ExprError(f"has more than {MAX_EXPR_NODES} parts; split it with [let]")
        if isinstance(n, ast.Constant):
            return self.make(Const(self._number(n.value)))
        if isinstance(n, ast.Name):
            return self._name(n.id)
        if isinstance(n, ast.UnaryOp):
            return self._unary(n, depth)
        if isinstance(n, ast.BinOp):
            return self._binop(n, depth)
        if isinstance(n, ast.Compare):
            return self._compare(n, depth)
        if isinstance(n, ast.Call):
            return self._call(n, depth)
        if isinstance(n, ast.Attribute) and n.attr == "T":
            return self._transpose(self._visit(n.value, depth + 1))
        raise ExprError(_REFUSED.get(type(n), f"{type(n).__name__} is not allowed"))

    @staticmethod
    def _number(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            what = "strings" if isinstance(v, str | bytes) else f"{type(v).__name__} constants"
            raise ExprError(f"{what} are not allowed; only numbers")
        if isinstance(v, int) and abs(v) > MAX_CONST_ABS:
            raise ExprError(f"constant too large (limit {MAX_CONST_ABS:g})")
        f = float(v)
        if not math.isfinite(f) or abs(f) > MAX_CONST_ABS:
            raise ExprError(f"constant too large (limit {MAX_CONST_ABS:g})")
        return f

    def _name(self, name: str) -> Node:
        if name.startswith("_"):
            raise ExprError(f"name {name!r} is not allowed (names may not start with '_')")
        if name in self.scope:
            return self.scope[name]
        if name == INF_NAME:
            return self.make(Const(math.inf))
        if name in FUNCTION_NAMES:
            raise ExprError(f"{name!r} is a function; call it, e.g. {name}(x)")
        known = ", ".join(sorted(self.scope)) or "none"
        raise ExprError(f"unknown name {name!r} (known names: {known})"[:300], unknown_name=name)

    def _unary(self, n: ast.UnaryOp, depth: int) -> Node:
        if isinstance(n.op, ast.UAdd):
            return self._operand(self._visit(n.operand, depth + 1), "unary +")
        if not isinstance(n.op, ast.USub):
            raise ExprError(f"operator {type(n.op).__name__} is not allowed")
        x = self._operand(self._visit(n.operand, depth + 1), "unary -")
        if isinstance(x, Const):
            return self.make(Const(-x.value))
        return self.make(Unary("neg", x, x.shape))

    def _operand(self, x: Node, what: str) -> Node:
        if _kind(x) == "mask":
            raise ExprError(f"a comparison cannot be used with {what}; use where(c, a, b)")
        return x

    def _binop(self, n: ast.BinOp, depth: int) -> Node:
        if isinstance(n.op, ast.MatMult):
            a = self._visit(n.left, depth + 1)
            return self._matmul(a, self._visit(n.right, depth + 1), "a @ b")
        op = _BINOPS.get(type(n.op))
        if op is None:
            raise ExprError(f"operator {type(n.op).__name__} is not allowed (only + - * / ** @)")
        a = self._operand(self._visit(n.left, depth + 1), _SYMBOL[op])
        b = self._operand(self._visit(n.right, depth + 1), _SYMBOL[op])
        if op == "pow":
            if not isinstance(b, Const):
                raise ExprError("the exponent of ** must be a constant")
            if abs(b.value) > MAX_POW_EXPONENT:
                raise ExprError(f"exponent too large (limit {MAX_POW_EXPONENT:g})")
        if isinstance(a, Const) and isinstance(b, Const):
            return self.make(Const(self._fold(op, a.value, b.value)))
        return self.make(Binary(op, a, b, broadcast_shapes(a.shape, b.shape)))

    def _fold(self, op: str, x: float, y: float) -> float:
        try:
            if op == "add":
                v = x + y
            elif op == "sub":
                v = x - y
            elif op == "mul":
                v = x * y
            elif op == "div":
                v = x / y
            else:
                v = x**y
        except (ZeroDivisionError, OverflowError, ValueError):
            raise ExprError("constant arithmetic is undefined (division by zero?)") from None
        if isinstance(v, complex) or not math.isfinite(v) or abs(v) > MAX_CONST_ABS:
            raise ExprError("constant arithmetic gives a value out of range")
        return float(v)

    def _compare(self, n: ast.Compare, depth: int) -> Node:
        if len(n.ops) != 1:
            raise ExprError("chained comparisons are not allowed; compare two values")
        op = _CMPOPS.get(type(n.ops[0]))
        if op is None:
            raise ExprError(f"comparison {type(n.ops[0]).__name__} is not allowed")
        a = self._operand(self._visit(n.left, depth + 1), "a comparison")
        b = self._operand(self._visit(n.comparators[0], depth + 1), "a comparison")
        return self.make(Compare(op, a, b, broadcast_shapes(a.shape, b.shape)))

    # -- calls ----------------------------------------------------------------------------------

    def _call(self, n: ast.Call, depth: int) -> Node:
        if isinstance(n.func, ast.Attribute):
            raise ExprError("attribute access (a.b) is not allowed")
        if not isinstance(n.func, ast.Name):
            raise ExprError("only the built-in functions may be called, by plain name")
        fname = n.func.id
        if fname.startswith("_") or fname not in FUNCTION_NAMES:
            allowed = ", ".join(sorted(FUNCTION_NAMES))
            raise ExprError(f"unknown function {fname!r}"[:120] + f" (allowed: {allowed})")
        for a in n.args:
            if isinstance(a, ast.Starred):
                raise ExprError("starred arguments are not allowed")
        for k in n.keywords:
            if k.arg is None:
                raise ExprError("**keyword arguments are not allowed")
        nargs = len(n.args)
        keywords = {k.arg: k.value for k in n.keywords}
        if len(keywords) != len(n.keywords):
            raise ExprError(f"{fname}() got a repeated keyword")

        if fname in ATTENTION_FUNCS:
            from factory.spec.attention import parse_call

            return parse_call(self, fname, n, keywords, depth)
        if fname in EXTRA_FUNCS or (
            fname in REDUCE_FUNCS
            and not (fname in ("max", "min") and nargs == 2)
            and _several_axes(keywords.get("axis"))
        ):
            return self._extended(fname, n, keywords, depth)
        if fname in REDUCE_FUNCS and not (fname in ("max", "min") and nargs == 2):
            return self._reduce(fname, n, keywords, depth)
        if keywords:
            raise ExprError(f"{fname}() takes no keyword arguments")
        want = 2 if fname in ("max", "min", "gather", "matmul") else 3 if fname == "where" else 1
        if nargs != want:
            raise ExprError(f"{fname}() takes {want} argument{'s' if want > 1 else ''}")
        args = [self._visit(a, depth + 1) for a in n.args]

        if fname in UNARY_FUNCS:
            x = self._operand(args[0], f"{fname}()")
            return self.make(Unary(fname, x, x.shape))
        if fname in CAST_FUNCS:
            x = self._operand(args[0], f"{fname}()")
            return self.make(Cast(x, CAST_FUNCS[fname], x.shape))
        if fname in ("max", "min"):
            a = self._operand(args[0], f"{fname}()")
            b = self._operand(args[1], f"{fname}()")
            return self.make(Binary(fname, a, b, broadcast_shapes(a.shape, b.shape)))
        if fname == "where":
            c, a, b = args
            if _kind(c) != "mask":
                raise ExprError("the first argument of where() must be a comparison")
            a = self._operand(a, "where()")
            b = self._operand(b, "where()")
            shape = broadcast_shapes(broadcast_shapes(c.shape, a.shape), b.shape)
            return self.make(Where(c, a, b, shape))
        if fname == "matmul":
            return self._matmul(args[0], args[1], "matmul(a, b)")
        return self._gather(args[0], args[1])

    # -- matrix products ---------------------------------------------------------------------

    def _transpose(self, x: Node) -> Node:
        if _kind(x) != "float":
            raise ExprError(".T transposes a floating-point tensor")
        if len(x.shape) != 2:
            raise ExprError(
                f"w.T needs a 2-D tensor (a weight stored [N, K]); this one has shape "
                f"{shape_text(x.shape)}"
            )
        if isinstance(x, Transpose):
            return x.x
        return self.make(Transpose(x, (x.shape[1], x.shape[0])))

    def _matmul(self, a: Node, b: Node, what: str) -> Node:
        for side, x in (("left", a), ("right", b)):
            if _kind(x) != "float":
                kind = "a comparison" if _kind(x) == "mask" else "an index tensor"
                raise ExprError(f"{what}: the {side} operand is {kind}; matmul takes float tensors")
            if len(x.shape) < 2:
                raise ExprError(
                    f"{what}: the {side} operand has shape {shape_text(x.shape)}; matmul takes "
                    "tensors of at least two axes (a vector is a [1, K] or [K, 1] tensor)"
                )
        if a.shape[-1] != b.shape[-2]:
            raise ExprError(
                f"{what}: the left operand has shape {shape_text(a.shape)} and the right "
                f"{shape_text(b.shape)}; the last axis of the left ({a.shape[-1]}) must be the "
                f"second-to-last of the right ({b.shape[-2]}). For a weight stored [N, K] "
                "write a @ w.T"
            )
        try:
            batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ExprError:
            raise ExprError(
                f"{what}: the batch axes of {shape_text(a.shape)} and {shape_text(b.shape)} "
                "do not broadcast"
            ) from None
        return self.make(MatMul(a, b, batch + (a.shape[-2], b.shape[-1])))

    def _reduce(self, fname: str, n: ast.Call, keywords: dict, depth: int) -> Node:
        if len(n.args) != 1:
            raise ExprError(f"{fname}() takes one tensor (or two for elementwise max/min)")
        for k in keywords:
            if k not in REDUCE_KEYWORDS:
                raise ExprError(f"{fname}() got an unexpected keyword {k!r}"[:120])
        axis = self._int_keyword(keywords.get("axis"), -1)
        keepdims = self._bool_keyword(keywords.get("keepdims"), False)
        x = self._operand(self._visit(n.args[0], depth + 1), f"{fname}()")
        rank = len(x.shape)
        if rank == 0:
            raise ExprError(f"{fname}() of a scalar: there is no axis to reduce")
        if not -rank <= axis < rank:
            raise ExprError(f"axis {axis} is out of range for a tensor of rank {rank}")
        axis %= rank
        shape = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1 :]
        return self.make(Reduce(fname, x, axis, keepdims, shape))

    @staticmethod
    def _int_keyword(v: ast.AST | None, default: int) -> int:
        if v is None:
            return default
        sign = 1
        if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub):
            sign, v = -1, v.operand
        if isinstance(v, ast.Constant) and type(v.value) is int and abs(v.value) < 64:
            return sign * v.value
        raise ExprError("axis must be a small integer constant")

    @staticmethod
    def _bool_keyword(v: ast.AST | None, default: bool) -> bool:
        if v is None:
            return default
        if isinstance(v, ast.Constant) and type(v.value) is bool:
            return v.value
        raise ExprError("keepdims must be True or False")

    def _gather(self, x: Node, idx: Node) -> Node:
        if _kind(x) != "float":
            raise ExprError("gather() reads from a floating-point tensor")
        if _kind(idx) != "index" or not isinstance(idx, Input):
            raise ExprError("the second argument of gather() must be an int32/int64 input")
        if len(x.shape) == 0:
            raise ExprError("gather() needs a tensor with at least one axis")
        batch = x.shape[:-1]
        if idx.shape != batch and idx.shape != batch + (1,):
            raise ExprError(
                f"gather(x, idx): idx has shape {shape_text(idx.shape)} but x has shape "
                f"{shape_text(x.shape)}; idx must be {shape_text(batch)} or "
                f"{shape_text(batch + (1,))}"
            )
        return self.make(Gather(x, idx, idx.shape))


# -- reductions over several axes, scans, arg-reductions (issue 50) ------------------------------


def _several_axes(v: ast.AST | None) -> bool:
    """axis=(a, b, ...) or axis=None: a reduction over several axes."""
    return isinstance(v, ast.Tuple) or (isinstance(v, ast.Constant) and v.value is None)


def _axes_keyword(v: ast.AST | None, rank: int, fname: str) -> tuple[int, ...]:
    """The non-negative axes an axis keyword names, in increasing order (default: the last)."""
    if v is None:
        items: list = [-1]
    elif isinstance(v, ast.Constant) and v.value is None:
        items = list(range(rank))
    elif isinstance(v, ast.Tuple):
        if not v.elts:
            raise ExprError(f"{fname}(): axis=() names no axis")
        items = [ExprParser._int_keyword(e, -1) for e in v.elts]
    else:
        items = [ExprParser._int_keyword(v, -1)]
    axes = []
    for a in items:
        if not -rank <= a < rank:
            raise ExprError(f"axis {a} is out of range for a tensor of rank {rank}")
        axes.append(a % rank)
    if len(set(axes)) != len(axes):
        raise ExprError(f"{fname}(): an axis is named twice")
    return tuple(sorted(axes))


def _extended(self, fname: str, n: ast.Call, keywords: dict, depth: int) -> Node:
    allowed = {
        "scan": ("axis", "exclusive", "reverse"),
        "arg": ("axis", "keepdims"),
        "reduce": REDUCE_KEYWORDS,
    }
    if fname in POOL_FUNCS:
        return self._pool(fname, n, keywords, depth)
    kind = "scan" if fname in SCAN_FUNCS else "arg" if fname in ARG_FUNCS else "reduce"
    if len(n.args) != 1:
        raise ExprError(f"{fname}() takes one tensor")
    for k in keywords:
        if k not in allowed[kind]:
            raise ExprError(f"{fname}() got an unexpected keyword {k!r}"[:120])
    x = self._operand(self._visit(n.args[0], depth + 1), f"{fname}()")
    if _kind(x) != "float":
        raise ExprError(f"{fname}() takes a floating-point tensor")
    rank = len(x.shape)
    if rank == 0:
        raise ExprError(f"{fname}() of a scalar: there is no axis to work along")
    if kind == "scan":
        axis = self._int_keyword(keywords.get("axis"), -1)
        if not -rank <= axis < rank:
            raise ExprError(f"axis {axis} is out of range for a tensor of rank {rank}")
        exclusive = self._bool_keyword(keywords.get("exclusive"), False)
        reverse = self._bool_keyword(keywords.get("reverse"), False)
        return self.make(Scan(SCAN_FUNCS[fname], x, axis % rank, exclusive, reverse, x.shape))
    keepdims = self._bool_keyword(keywords.get("keepdims"), False)
    if kind == "arg":
        if _several_axes(keywords.get("axis")):
            raise ExprError(f"{fname}() takes one axis")
        (axis,) = _axes_keyword(keywords.get("axis"), rank, fname)
        shape = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1 :]
        return self.make(ArgReduce(fname, x, axis, keepdims, shape))
    # Over several axes: nested single-axis reductions, the highest axis first (so the lower
    # ones keep their numbers without keepdims). Exact for every op: a mean of means over full
    # axes is the mean over both.
    node = x
    for axis in reversed(_axes_keyword(keywords.get("axis"), rank, fname)):
        shape = node.shape[:axis] + ((1,) if keepdims else ()) + node.shape[axis + 1 :]
        node = self.make(Reduce(fname, node, axis, keepdims, shape))
    return node


ExprParser._extended = _extended


def _ints_keyword(v: ast.AST | None, default, fname: str, what: str) -> tuple[int, ...] | None:
    """A small non-negative integer or a tuple of them; None when absent and no default."""
    if v is None:
        return default
    items = v.elts if isinstance(v, ast.Tuple) else [v]
    out = []
    for e in items:
        if not (isinstance(e, ast.Constant) and type(e.value) is int and 0 <= e.value < 64):
            raise ExprError(f"{fname}(): {what} must be integers in 0..63 (or a tuple of them)")
        out.append(e.value)
    return tuple(out)


def _pool(self, fname: str, n: ast.Call, keywords: dict, depth: int) -> Node:
    if len(n.args) != 1:
        raise ExprError(f"{fname}() takes one tensor")
    for k in keywords:
        if k not in ("window", "stride", "padding"):
            raise ExprError(f"{fname}() got an unexpected keyword {k!r}"[:120])
    window = _ints_keyword(keywords.get("window"), None, fname, "window")
    if not window:
        raise ExprError(f"{fname}() needs window=k (one axis) or window=(kh, kw) (two)")
    nd = len(window)
    if nd > 2:
        raise ExprError(f"{fname}(): one or two pooled axes")
    stride = _ints_keyword(keywords.get("stride"), window, fname, "stride")
    padding = _ints_keyword(keywords.get("padding"), (0,) * nd, fname, "padding")
    if len(stride) == 1 and nd == 2:
        stride = stride * 2
    if len(padding) == 1 and nd == 2:
        padding = padding * 2
    if len(stride) != nd or len(padding) != nd:
        raise ExprError(f"{fname}(): window, stride and padding name the same axes")
    for k, st, p in zip(window, stride, padding, strict=True):
        if k < 1 or st < 1:
            raise ExprError(f"{fname}(): window and stride must be at least 1")
        if 2 * p > k:
            raise ExprError(f"{fname}(): padding {p} is more than half the window {k}")
    x = self._operand(self._visit(n.args[0], depth + 1), f"{fname}()")
    if _kind(x) != "float":
        raise ExprError(f"{fname}() takes a floating-point tensor")
    if len(x.shape) < nd:
        raise ExprError(f"{fname}() of a tensor of rank {len(x.shape)} over {nd} axes")
    pooled = []
    for d, k, st, p in zip(x.shape[-nd:], window, stride, padding, strict=True):
        if isinstance(d, int):
            size = pooled_size(d, k, st, p)
            if size < 1:
                raise ExprError(f"{fname}(): a window of {k} is wider than the axis of {d}")
            pooled.append(size)
            continue
        name = pooled_dim_name(d, k, st, p)
        if len(name) > 16:
            raise ExprError(f"{fname}(): the pooled axis {name!r} needs a dim name of 16 at most")
        pooled.append(name)
    shape = x.shape[:-nd] + tuple(pooled)
    return self.make(Pool(POOL_FUNCS[fname], x, window, stride, padding, shape))


ExprParser._pool = _pool
