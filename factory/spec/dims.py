"""Shape arithmetic over dim names: ints, names, + - * // %, ceildiv(a, b), min(a, b, ...),
max(a, b, ...). Parsed with `ast` and interpreted by hand; never eval'ed."""

from __future__ import annotations

import ast
import functools
import re
import warnings

from factory.spec.limits import MAX_DIM_EXPR_ABS, MAX_DIM_EXPR_CHARS, MAX_DIM_EXPR_DEPTH
from factory.spec.types import SpecError

_PRINTABLE = re.compile(r"^[ -~]*$")
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_FUNCS = {"ceildiv": 2, "min": None, "max": None}

# The parsed program is a tuple tree: ("int", v) | ("dim", name) | ("neg", p) | (op, a, b)
# | ("call", fname, (args...)).


class _DimExprError(Exception):
    pass


@functools.lru_cache(maxsize=4096)
def _compile(text: str) -> tuple:
    if len(text) > MAX_DIM_EXPR_CHARS:
        raise _DimExprError(f"longer than {MAX_DIM_EXPR_CHARS} characters")
    if not _PRINTABLE.match(text):
        raise _DimExprError("only printable ASCII characters are allowed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, SyntaxWarning, ValueError, RecursionError, MemoryError):
        raise _DimExprError("not a valid shape expression") from None
    return _build(tree.body, 0)


def _build(node: ast.AST, depth: int) -> tuple:
    if depth > MAX_DIM_EXPR_DEPTH:
        raise _DimExprError(f"nested deeper than {MAX_DIM_EXPR_DEPTH}")
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise _DimExprError("only integer constants are allowed")
        if abs(node.value) > MAX_DIM_EXPR_ABS:
            raise _DimExprError("constant too large")
        return ("int", node.value)
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise _DimExprError(f"name {node.id!r} is not allowed")
        return ("dim", node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _build(node.operand, depth + 1)
        return ("neg", inner) if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return (
            _BINOPS[type(node.op)],
            _build(node.left, depth + 1),
            _build(node.right, depth + 1),
        )
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            raise _DimExprError("only ceildiv(a, b), min(...) and max(...) may be called")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _DimExprError("functions take plain positional arguments only")
        want = _FUNCS[node.func.id]
        n = len(node.args)
        if (want is not None and n != want) or (want is None and not 2 <= n <= 8):
            raise _DimExprError(f"wrong number of arguments to {node.func.id}()")
        args = tuple(_build(a, depth + 1) for a in node.args)
        return ("call", node.func.id, args)
    raise _DimExprError(f"{type(node).__name__} is not allowed in shape arithmetic")


def _check(v: int) -> int:
    if abs(v) > MAX_DIM_EXPR_ABS:
        raise _DimExprError("value out of range")
    return v


def _run(p: tuple, dims: dict[str, int]) -> int:
    kind = p[0]
    if kind == "int":
        return p[1]
    if kind == "dim":
        if p[1] not in dims:
            raise _DimExprError(f"unknown dim {p[1]!r}")
        v = dims[p[1]]
        if type(v) is not int:
            raise _DimExprError(f"dim {p[1]!r} is not an integer")
        return _check(v)
    if kind == "neg":
        return -_run(p[1], dims)
    if kind == "call":
        args = [_run(a, dims) for a in p[2]]
        if p[1] == "ceildiv":
            if args[1] == 0:
                raise _DimExprError("ceildiv by zero")
            return _check(-(-args[0] // args[1]))
        return min(args) if p[1] == "min" else max(args)
    a = _run(p[1], dims)
    b = _run(p[2], dims)
    if kind == "+":
        return _check(a + b)
    if kind == "-":
        return _check(a - b)
    if kind == "*":
        return _check(a * b)
    if b == 0:
        raise _DimExprError("division by zero")
    return _check(a // b if kind == "//" else a % b)


def dim_expr_names(expr: int | str) -> set[str]:
    """The dim names a shape expression uses (raises SpecError when it does not parse)."""
    if type(expr) is int:
        return set()
    names: set[str] = set()
    try:
        stack = [_compile(expr)] if isinstance(expr, str) else []
    except _DimExprError as e:
        raise SpecError([("expr", str(e))]) from None
    if not isinstance(expr, str):
        raise SpecError([("expr", "must be an integer or a string")])
    while stack:
        p = stack.pop()
        if p[0] == "dim":
            names.add(p[1])
        elif p[0] == "neg":
            stack.append(p[1])
        elif p[0] == "call":
            stack.extend(p[2])
        elif p[0] != "int":
            stack.extend((p[1], p[2]))
    return names


def eval_dim_expr(expr: int | str, dims: dict[str, int]) -> int:
    """Evaluate shape arithmetic such as ``"ceildiv(M, 4)"`` or ``"N * 4"`` over `dims`.

    Returns an int. Raises SpecError (field ``expr``) for anything outside the grammar, an
    unknown dim, division by zero or a value beyond 2**62. Never calls eval."""
    if type(expr) is int:
        return _check_public(expr)
    if not isinstance(expr, str):
        raise SpecError([("expr", "must be an integer or a string")])
    try:
        return _run(_compile(expr), dims)
    except _DimExprError as e:
        raise SpecError([("expr", str(e))]) from None


def _check_public(v: int) -> int:
    if abs(v) > MAX_DIM_EXPR_ABS:
        raise SpecError([("expr", "value out of range")])
    return v
