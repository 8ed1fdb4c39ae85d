"""Torch-side baselines for the reduction, scan and arg-reduction families (colreduce, allreduce,
scan, argreduce): the workload as a customer writes it in torch, one idiomatic call a node
(`torch.sum(x, dim=(0, 1))` for a reduction over several axes, `torch.cumsum`, `torch.argmax`),
elementwise work in float32, each output rounded to its storage dtype. The GPU worker's
expression translation (gpuworker.baselines.dag_function) does not know Scan, ArgReduce, Pool nodes
or prod, so these families name this module.

Every function takes a dict of input tensors in storage dtype (bf16 as torch.bfloat16) and
returns a dict of output tensors. Importable without torch (torch is imported when called)."""

from __future__ import annotations

from factory.spec import expr as E
from factory.spec.types import BaselineUnavailable as Unavailable

_UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs")


def reduction_axes(node: E.Reduce) -> tuple[str, E.Node, tuple[int, ...], bool]:
    """(op, operand, dims, keepdim) of nested same-op reductions: one torch call."""
    chain = []
    while isinstance(node, E.Reduce) and (not chain or node.op == chain[0].op):
        chain.append(node)
        node = node.x
    keep = {r.keepdims for r in chain}
    if len(keep) > 1:
        # mixed keepdims: one call a node
        return chain[0].op, chain[0].x, (chain[0].axis,), chain[0].keepdims
    orig = list(range(len(node.shape)))
    axes = []
    for r in reversed(chain):
        axes.append(orig[r.axis])
        if not r.keepdims:
            orig.pop(r.axis)
    return chain[0].op, node, tuple(sorted(axes)), chain[0].keepdims


def torch_function(workload):
    """(fn, how): the workload in idiomatic torch calls."""
    import operator

    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
              "int32": torch.int32, "int64": torch.int64}  # fmt: skip
    binary = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "div": operator.truediv, "pow": operator.pow}  # fmt: skip
    compare = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
               "eq": operator.eq, "ne": operator.ne}  # fmt: skip
    calls: list[str] = []

    def reduce(op, x, dims, keep):
        if op == "prod":
            for d in sorted(dims, reverse=True):  # torch.prod takes one dim
                x = torch.prod(x, dim=d, keepdim=keep)
            return x
        fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[op]
        return fn(x, dim=dims, keepdim=keep)

    def scan(n: E.Scan, x):
        fn = torch.cumsum if n.op == "sum" else torch.cumprod
        if n.reverse:
            x = torch.flip(x, dims=(n.axis,))
        r = fn(x, dim=n.axis)
        if n.exclusive:
            head = torch.full_like(r.narrow(n.axis, 0, 1), 0.0 if n.op == "sum" else 1.0)
            r = torch.cat([head, r.narrow(n.axis, 0, r.shape[n.axis] - 1)], dim=n.axis)
        if n.reverse:
            r = torch.flip(r, dims=(n.axis,))
        return r

    def pool(n: E.Pool, x):
        """F.max_pool1d/2d, F.avg_pool1d/2d (count_include_pad, torch's default) over the
        trailing axes, the leading ones folded into channels."""
        import torch.nn.functional as F  # noqa: N812

        nd = len(n.window)
        lead = x.shape[:-nd]
        fn = {("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d,
              ("avg", 1): F.avg_pool1d, ("avg", 2): F.avg_pool2d}[(n.op, nd)]  # fmt: skip
        y = fn(x.reshape(-1, *x.shape[-nd:]), n.window, n.stride, n.padding)
        return y.reshape(*lead, *y.shape[-nd:])

    def evaluate(node, inputs, memo):
        if node in memo:
            return memo[node]
        n = node
        if isinstance(n, E.Input):
            t = inputs[n.name]
            v = t if n.dtype in E.INDEX_DTYPES else t.float()
        elif isinstance(n, E.Const):
            v = n.value
        elif isinstance(n, E.Unary):
            x = evaluate(n.x, inputs, memo)
            v = torch.rsqrt(x) if n.op == "rsqrt" else getattr(torch, n.op)(x)
        elif isinstance(n, E.Binary):
            a, b = evaluate(n.a, inputs, memo), evaluate(n.b, inputs, memo)
            if n.op in ("max", "min"):
                t = a if isinstance(a, torch.Tensor) else b
                c = b if t is a else a
                if isinstance(c, torch.Tensor):
                    v = torch.maximum(a, b) if n.op == "max" else torch.minimum(a, b)
                else:
                    v = torch.clamp(t, min=c) if n.op == "max" else torch.clamp(t, max=c)
            else:
                v = binary[n.op](a, b)
        elif isinstance(n, E.Compare):
            v = compare[n.op](evaluate(n.a, inputs, memo), evaluate(n.b, inputs, memo))
        elif isinstance(n, E.Where):
            c, a, b = (evaluate(x, inputs, memo) for x in (n.cond, n.a, n.b))
            v = torch.where(c, a, b)
        elif isinstance(n, E.Cast):
            v = evaluate(n.x, inputs, memo).to(dtypes[n.to]).float()
        elif isinstance(n, E.Reduce):
            op, operand, dims, keep = reduction_axes(n)
            v = reduce(op, evaluate(operand, inputs, memo), dims, keep)
        elif isinstance(n, E.Scan):
            v = scan(n, evaluate(n.x, inputs, memo))
        elif isinstance(n, E.Pool):
            v = pool(n, evaluate(n.x, inputs, memo))
        elif isinstance(n, E.ArgReduce):
            fn = torch.argmax if n.op == "argmax" else torch.argmin
            v = fn(evaluate(n.x, inputs, memo), dim=n.axis, keepdim=n.keepdims)
        else:
            raise Unavailable(f"no torch translation for {type(n).__name__}")
        memo[node] = v
        return v

    for o in workload.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Reduce):
                op, _, dims, keep = reduction_axes(n)
                calls.append(f"torch.{ {'max': 'amax', 'min': 'amin'}.get(op, op) }(dim={dims})")
            elif isinstance(n, E.Scan):
                calls.append(f"torch.cum{n.op}(dim={n.axis})")
            elif isinstance(n, E.ArgReduce):
                calls.append(f"torch.{n.op}(dim={n.axis})")
            elif isinstance(n, E.Pool):
                calls.append(f"F.{n.op}_pool{len(n.window)}d({n.window}, {n.stride}, {n.padding})")

    def fn(inputs):
        memo: dict = {}
        out = {}
        for o in workload.outputs:
            v = evaluate(o.expr, inputs, memo)
            if not isinstance(v, torch.Tensor):
                raise Unavailable(f"output {o.name!r} is a constant")
            out[o.name] = v.to(dtypes[o.dtype])
        return out

    how = "idiomatic torch: " + (", ".join(dict.fromkeys(calls)) or "elementwise")
    return fn, how


def idiomatic(name: str, workload, compiled: bool):
    del name, compiled
    return torch_function(workload)


def library(name: str, workload):
    raise Unavailable(f"no {name!r} baseline for this family")
