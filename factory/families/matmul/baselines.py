"""The matmul family's torch-side baselines: the operator as a customer writes it in torch.

- "torch_eager": cuBLAS through torch: `F.linear(x, w, bias)` for a weight stored [N, K] (bias
  fused by cuBLASLt), `torch.addmm(bias, x, w)` / `torch.matmul(x, w)` for one stored [K, N],
  `torch.addmm(r, x, w.T)` for a residual of the product's shape (added in cuBLAS's epilogue),
  then the activation by its library call (`F.gelu(h, approximate="tanh")`, `F.silu`, `F.relu`,
  `torch.sigmoid`, ...) recognised from the expression, whatever formula the manifest wrote,
  and the rest (a residual, a gate's product, a scale) as torch operators on the storage dtype.
- "torch_compile", "torch_compile_max_autotune": the same function; the GPU worker compiles it
  (gpuworker.baselines.make_torch_baseline).
- "triton": a plain Triton matmul (triton_matmul.py), autotuned over a few tile configurations,
  with a bias and a recognised activation fused into its epilogue where the expression is just
  that; anything more runs after it in torch.

Every function takes a dict of input tensors in storage dtype (bf16 as torch.bfloat16) and returns
a dict of output tensors in their dtypes. Importing this module imports neither torch nor CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from factory.spec import expr as E
from factory.spec.reference import erf as _erf64
from factory.spec.types import BaselineUnavailable as Unavailable

# -- recognising activations ---------------------------------------------------------------------

_PROBE = np.concatenate([np.linspace(-8.0, 8.0, 161), [-0.37, 0.013, 0.61, 2.9, -3.3]])


def _gelu_tanh(h):
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))


ACTIVATIONS = {
    "identity": lambda h: h,
    "gelu_tanh": _gelu_tanh,
    "gelu": lambda h: 0.5 * h * (1.0 + _erf64(h / math.sqrt(2.0))),
    "silu": lambda h: h / (1.0 + np.exp(-h)),
    "relu": lambda h: np.maximum(h, 0.0),
    "relu2": lambda h: np.maximum(h, 0.0) ** 2,
    "sigmoid": lambda h: 1.0 / (1.0 + np.exp(-h)),
    "tanh": np.tanh,
}


def _eval_scalar(node: E.Node, h_node: E.Node, h: np.ndarray, memo: dict) -> np.ndarray:
    """float64 value of an elementwise node that depends on nothing but `h_node` (= h)."""
    if node is h_node or node == h_node:
        return h
    if node in memo:
        return memo[node]
    if isinstance(node, E.Const):
        v = np.full_like(h, node.value)
    elif isinstance(node, E.Unary):
        x = _eval_scalar(node.x, h_node, h, memo)
        v = {
            "neg": np.negative,
            "exp": np.exp,
            "log": np.log,
            "sqrt": np.sqrt,
            "rsqrt": lambda t: 1.0 / np.sqrt(t),
            "tanh": np.tanh,
            "sigmoid": lambda t: 1.0 / (1.0 + np.exp(-t)),
            "erf": _erf64,
            "abs": np.abs,
        }[node.op](x)
    elif isinstance(node, E.Binary):
        a = _eval_scalar(node.a, h_node, h, memo)
        b = _eval_scalar(node.b, h_node, h, memo)
        v = {
            "add": np.add,
            "sub": np.subtract,
            "mul": np.multiply,
            "div": np.divide,
            "max": np.maximum,
            "min": np.minimum,
            "pow": np.power,
        }[node.op](a, b)
    elif isinstance(node, E.Compare):
        a = _eval_scalar(node.a, h_node, h, memo)
        b = _eval_scalar(node.b, h_node, h, memo)
        v = {
            "lt": np.less,
            "le": np.less_equal,
            "gt": np.greater,
            "ge": np.greater_equal,
            "eq": np.equal,
            "ne": np.not_equal,
        }[node.op](a, b)
    elif isinstance(node, E.Where):
        v = np.where(
            _eval_scalar(node.cond, h_node, h, memo),
            _eval_scalar(node.a, h_node, h, memo),
            _eval_scalar(node.b, h_node, h, memo),
        )
    elif isinstance(node, E.Cast):
        v = _eval_scalar(node.x, h_node, h, memo)  # rounding is the storage's business
    else:
        raise TypeError(type(node).__name__)
    memo[node] = v
    return v


def identify_activation(node: E.Node, h_node: E.Node) -> str | None:
    """The name of the activation `node` computes of `h_node` (probed numerically on a grid, so
    0.5*h*(1+tanh(...)), h*sigmoid(h) or max(h, 0) ** 2 are found however they are written), or
    None."""
    try:
        with np.errstate(all="ignore"):
            got = _eval_scalar(node, h_node, _PROBE, {})
    except (TypeError, KeyError):
        return None
    for name, fn in ACTIVATIONS.items():
        with np.errstate(all="ignore"):
            want = fn(_PROBE)
        if np.all(np.abs(got - want) <= 1e-6 * (1.0 + np.abs(want))):
            return name
    return None


# -- the plan: which nodes become library calls ---------------------------------------------------


@dataclass(frozen=True)
class Linear:
    """A matmul with (optionally) its per-column bias: x @ w.T + bias or x @ w + bias."""

    node: E.Node  # the MatMul, or the add of the MatMul and the bias
    x: str
    w: str
    w_layout: str  # "col": w stored [N, K]; "row": [K, N]
    bias: str | None
    residual: str | None = None  # x @ w.T + r, r of the product's shape: torch.addmm(r, x, w.T)


@dataclass(frozen=True)
class Activation:
    node: E.Node
    name: str
    of: E.Node  # the Linear's node (or any node) it applies to


def _inputs_in(node: E.Node) -> set[E.Node]:
    return {n for n in E.walk(node) if isinstance(n, E.Input)}


def plan(workload) -> tuple[dict, dict]:
    """({node: Linear}, {node: Activation}) for the workload's matrix products and the
    activations applied to them."""
    linears: dict[E.Node, Linear] = {}
    acts: dict[E.Node, Activation] = {}
    nodes: list[E.Node] = []
    seen: set = set()
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if n not in seen:
                seen.add(n)
                nodes.append(n)
    vectors = {t.name for t in workload.inputs if len(t.shape) == 1}
    for n in nodes:
        if not isinstance(n, E.MatMul) or not isinstance(n.a, E.Input):
            continue
        if isinstance(n.b, E.Transpose) and isinstance(n.b.x, E.Input):
            w, layout = n.b.x.name, "col"
        elif isinstance(n.b, E.Input):
            w, layout = n.b.name, "row"
        else:
            continue
        linears[n] = Linear(n, n.a.name, w, layout, None)
    # a bias add: add(mm, b) or add(b, mm) with b a vector input of the output's columns
    for n in nodes:
        if isinstance(n, E.Binary) and n.op == "add":
            for mm, other in ((n.a, n.b), (n.b, n.a)):
                lin = linears.get(mm)
                if (
                    lin is not None
                    and lin.bias is None
                    and isinstance(other, E.Input)
                    and other.name in vectors
                    and other.shape == (mm.shape[-1],)
                ):
                    linears[n] = Linear(n, lin.x, lin.w, lin.w_layout, other.name)
                    break
    # a residual add: add(mm, r) with r of the product's 2-D shape and the operands' dtype, which
    # cuBLAS adds in its epilogue (torch.addmm(r, x, w.T): beta * C)
    dtypes = {t.name: t.dtype for t in workload.inputs}
    for n in nodes:
        if isinstance(n, E.Binary) and n.op == "add":
            for mm, other in ((n.a, n.b), (n.b, n.a)):
                lin = linears.get(mm)
                if (
                    lin is not None
                    and isinstance(mm, E.MatMul)
                    and isinstance(other, E.Input)
                    and len(mm.shape) == 2
                    and other.shape == mm.shape
                    and dtypes.get(other.name) == dtypes.get(lin.x)
                ):
                    linears[n] = Linear(n, lin.x, lin.w, lin.w_layout, None, other.name)
                    break
    # activations: the largest node computed from a linear's result alone
    heads = sorted(linears, key=lambda n: len(E.walk(n)), reverse=True)
    for n in nodes:
        if n in linears or isinstance(n, E.Input | E.Const):
            continue
        for h in heads:
            if h in E.walk(n) and _inputs_in(n) == _inputs_in(h):
                name = identify_activation(n, h)  # None where n reads more than h
                if name is not None and name != "identity":
                    acts[n] = Activation(n, name, h)
                break
    # keep only the outermost activation over each linear
    outer = {}
    for n, a in acts.items():
        if not any(n is not m and n in E.walk(m) and acts[m].of == a.of for m in acts):
            outer[n] = a
    return linears, outer


# -- torch ----------------------------------------------------------------------------------------


def _torch_dtype(torch, dtype: str):
    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8e4m3": torch.float8_e4m3fn,
        "int32": torch.int32,
        "int64": torch.int64,
    }[dtype]


def _act_text(name: str, inner: str) -> str:
    return {
        "gelu_tanh": f'F.gelu({inner}, approximate="tanh")',
        "gelu": f"F.gelu({inner})",
        "silu": f"F.silu({inner})",
        "relu": f"F.relu({inner})",
        "relu2": f"F.relu({inner}).square()",
        "sigmoid": f"torch.sigmoid({inner})",
        "tanh": f"torch.tanh({inner})",
    }[name]


def _torch_act(torch, F, name: str):
    return {
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "gelu": F.gelu,
        "silu": F.silu,
        "relu": F.relu,
        "relu2": lambda t: torch.square(F.relu(t)),
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
    }[name]


def torch_function(workload, linear_fn=None):
    """(fn, how): the workload in torch as a customer writes it (see the module docstring).
    `linear_fn(x, w, w_layout, bias, act) -> tensor` replaces the library call of each linear
    (the Triton baseline); it returns None where it cannot take `act`, which is then applied by
    torch."""
    import operator

    import torch
    import torch.nn.functional as F

    linears, acts = plan(workload)
    if not linears and not any(
        isinstance(n, E.MatMul) for o in workload.outputs for n in E.walk(o.expr)
    ):
        raise Unavailable(f"{workload.name!r} has no matrix product")
    unary = {
        "neg": torch.neg,
        "exp": torch.exp,
        "log": torch.log,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "erf": torch.erf,
        "abs": torch.abs,
    }
    binary = {
        "add": operator.add,
        "sub": operator.sub,
        "mul": operator.mul,
        "div": operator.truediv,
        "pow": operator.pow,
    }
    compare = {
        "lt": operator.lt,
        "le": operator.le,
        "gt": operator.gt,
        "ge": operator.ge,
        "eq": operator.eq,
        "ne": operator.ne,
    }

    def linear(d, lin: Linear, act: str | None):
        x, w = d[lin.x], d[lin.w]
        b = d[lin.bias] if lin.bias else None
        r = d[lin.residual] if lin.residual else None
        if linear_fn is not None:
            if r is None:
                out = linear_fn(x, w, lin.w_layout, b, act)
                if out is not None:
                    return out, True
            out = linear_fn(x, w, lin.w_layout, b, None)
            if out is not None:
                return (out + r if r is not None else out), False
        if r is not None:
            return torch.addmm(r, x, w.t() if lin.w_layout == "col" else w), False
        if lin.w_layout == "col":
            return F.linear(x, w, b), False
        if b is not None and x.dim() == 2:
            return torch.addmm(b, x, w), False
        out = torch.matmul(x, w)
        return (out + b if b is not None else out), False

    def text(n: E.Node, names: dict) -> str:
        if n in names:
            return names[n]
        if n in linears:
            lin = linears[n]
            if lin.residual:
                wt = f"{lin.w}.T" if lin.w_layout == "col" else lin.w
                t = f"torch.addmm({lin.residual}, {lin.x}, {wt})"
            elif lin.w_layout == "col":
                t = f"F.linear({lin.x}, {lin.w}" + (f", {lin.bias})" if lin.bias else ")")
            elif lin.bias:
                t = f"torch.addmm({lin.bias}, {lin.x}, {lin.w})"
            else:
                t = f"{lin.x} @ {lin.w}"
        elif n in acts:
            t = _act_text(acts[n].name, text(acts[n].of, names))
        elif isinstance(n, E.Input):
            t = n.name
        elif isinstance(n, E.Const):
            t = f"{n.value:g}"
        elif isinstance(n, E.Unary):
            t = f"-{text(n.x, names)}" if n.op == "neg" else f"torch.{n.op}({text(n.x, names)})"
        elif isinstance(n, E.Binary):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}.get(n.op)
            a, b = text(n.a, names), text(n.b, names)
            t = f"({a} {sym} {b})" if sym else f"torch.{n.op}imum({a}, {b})"
        elif isinstance(n, E.Cast):
            t = f"{text(n.x, names)}.to({n.to})"
        elif isinstance(n, E.MatMul):
            t = f"({text(n.a, names)} @ {text(n.b, names)})"
        elif isinstance(n, E.Transpose):
            t = f"{text(n.x, names)}.mT"
        else:
            t = type(n).__name__.lower()
        names[n] = t
        return t

    def evaluate(node: E.Node, d: dict, memo: dict):
        if node in memo:
            return memo[node]
        if node in acts:
            a = acts[node]
            lin = linears.get(a.of)
            if lin is not None and a.of not in memo:
                v, fused = linear(d, lin, a.name)
                if fused:
                    memo[node] = v
                    return v
                memo[a.of] = v
            v = _torch_act(torch, F, a.name)(evaluate(a.of, d, memo))
        elif node in linears:
            v, _ = linear(d, linears[node], None)
        elif isinstance(node, E.Input):
            v = d[node.name]
        elif isinstance(node, E.Const):
            v = float(node.value)
        elif isinstance(node, E.Unary):
            x = evaluate(node.x, d, memo)
            v = unary[node.op](x if isinstance(x, torch.Tensor) else torch.tensor(x)).to(
                x.dtype if isinstance(x, torch.Tensor) else torch.float32
            )
        elif isinstance(node, E.Binary):
            a, b = evaluate(node.a, d, memo), evaluate(node.b, d, memo)
            if node.op in ("max", "min"):
                if not isinstance(a, torch.Tensor):
                    a, b = b, a
                if not isinstance(b, torch.Tensor):
                    v = torch.clamp(a, min=b) if node.op == "max" else torch.clamp(a, max=b)
                else:
                    v = torch.maximum(a, b) if node.op == "max" else torch.minimum(a, b)
            else:
                v = binary[node.op](a, b)
        elif isinstance(node, E.Compare):
            v = compare[node.op](evaluate(node.a, d, memo), evaluate(node.b, d, memo))
        elif isinstance(node, E.Where):
            v = torch.where(
                evaluate(node.cond, d, memo),
                evaluate(node.a, d, memo),
                evaluate(node.b, d, memo),
            )
        elif isinstance(node, E.Cast):
            x = evaluate(node.x, d, memo)
            v = x.to(_torch_dtype(torch, node.to)) if isinstance(x, torch.Tensor) else x
        elif isinstance(node, E.Transpose):
            v = evaluate(node.x, d, memo).mT
        elif isinstance(node, E.MatMul):
            v = torch.matmul(evaluate(node.a, d, memo), evaluate(node.b, d, memo))
        elif isinstance(node, E.Reduce):
            x = evaluate(node.x, d, memo)
            fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}
            v = fn[node.op](x, dim=node.axis, keepdim=node.keepdims)
        else:
            raise Unavailable(f"no torch translation for {type(node).__name__}")
        memo[node] = v
        return v

    def fn(d: dict) -> dict:
        memo: dict = {}
        out = {}
        for o in workload.outputs:
            v = evaluate(o.expr, d, memo)
            out[o.name] = v.to(_torch_dtype(torch, o.dtype))
        return out

    names: dict = {}
    how = "; ".join(f"{o.name} = {text(o.expr, names)}" for o in workload.outputs)
    return fn, how[:400]


# -- the registry's interface ---------------------------------------------------------------------


def idiomatic(name: str, workload, compiled: bool):
    """(fn, how) of the torch function a customer would write for `workload` (the same for eager
    and for torch.compile to compile), or (None, None) where there is no matrix product."""
    del name, compiled
    try:
        return torch_function(workload)
    except Unavailable:
        return None, None


def library(name: str, workload):
    """(fn, how, version) of a library baseline ("triton"); raises Unavailable with the reason."""
    if name != "triton":
        raise Unavailable(f"no {name!r} baseline in the matmul family")
    try:
        import triton

        from factory.families.matmul import triton_matmul
    except ImportError as e:
        raise Unavailable(f"triton is not importable: {e}") from e
    fn, how = torch_function(workload, linear_fn=triton_matmul.linear)
    return fn, "Triton matmul (autotuned) with torch for the rest: " + how, triton.__version__
