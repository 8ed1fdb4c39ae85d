"""Baselines the candidates must beat, built from the workload alone.

- "customer": the workload's own kernel (its PTX and binding), run exactly like a candidate.
- "torch_eager", "torch_compile", "torch_compile_max_autotune": the operator in torch. The
  batch's operator family (factory.families) names a baselines module that gives the idiomatic
  torch function a customer would pick (F.softmax, F.rms_norm, a matmul with its epilogue, ...);
  anything else is translated node by node from the expression DAG. torch is optional: without it
  these baselines are reported "unavailable", never an error.
- "triton", "liger": library kernels, from the family's baselines module where it has them
  (the row family: a plain Triton kernel for softmax and RMSNorm, and Liger Kernel's kernels).
  Optional like torch: without the package it is reported "unavailable".
- "sdpa_flash", "sdpa_cudnn", "flex_attention": attention in torch, from the family's baselines
  module (`named`): SDPA under one back end, and flex_attention under torch.compile. A family
  without them, or an operator the back end cannot express, reports "unavailable" with why.

Every torch-side function takes a dict of input tensors in storage dtype (bf16 as torch.bfloat16)
and returns a dict of output tensors; the child copies them into the judged output buffers after
the timed region. Importing this module imports neither torch nor CUDA.
"""

from __future__ import annotations

from factory.spec import expr as E
from factory.spec.types import BaselineUnavailable as Unavailable

# Baselines only a family's baselines module can make (its `named` function): attention's.
NAMED_BASELINES = ("sdpa_flash", "sdpa_cudnn", "flex_attention")
TORCH_BASELINES = (
    "torch_eager",
    "torch_compile",
    "torch_compile_max_autotune",
    "triton",
    "liger",
    *NAMED_BASELINES,
)


def _torch_dtype(torch, dtype: str):
    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "int32": torch.int32,
        "int64": torch.int64,
    }[dtype]


def dag_function(workload):
    """A torch function computing every output from the expression DAG, in float32, with each
    output rounded to its storage dtype. Shared sub-expressions are computed once.

    Constants stay Python numbers, so torch.compile folds them into its kernel as literals, as
    it does with a customer's own `x + 1e-6`. (They used to be tensors made on the first call and
    cached: dynamo traced the first call with a tensor created per call, an extra kernel, then
    saw the cache change and compiled a second graph that read the constant from memory. Two
    compiles per shape, max-autotune tuning both; the timed calls ran the second.)"""
    import operator

    import torch

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
    # Python's operators take a tensor or a number on either side.
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
    reduce = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}

    def scalar(v):
        return torch.tensor(v, dtype=torch.float32)

    def extreme(op, a, b):
        na, nb = not isinstance(a, torch.Tensor), not isinstance(b, torch.Tensor)
        if na and nb:
            return max(a, b) if op == "max" else min(a, b)
        if na or nb:
            t, c = (b, a) if na else (a, b)
            return torch.clamp(t, min=c) if op == "max" else torch.clamp(t, max=c)
        return torch.maximum(a, b) if op == "max" else torch.minimum(a, b)

    def evaluate(node, inputs, memo):
        for n in E.walk(node):
            if n in memo:
                continue
            if isinstance(n, E.Input):
                t = inputs[n.name]
                v = t if n.dtype in ("int32", "int64") else t.float()
            elif isinstance(n, E.Const):
                v = float(n.value)
            elif isinstance(n, E.Unary):
                x = memo[n.x]
                if isinstance(x, torch.Tensor):
                    v = unary[n.op](x)
                else:  # a constant sub-expression: folded once, before any call (below)
                    v = unary[n.op](scalar(x)).item()
            elif isinstance(n, E.Binary):
                a, b = memo[n.a], memo[n.b]
                v = extreme(n.op, a, b) if n.op in ("max", "min") else binary[n.op](a, b)
            elif isinstance(n, E.Compare):
                v = compare[n.op](memo[n.a], memo[n.b])
            elif isinstance(n, E.Where):
                v = torch.where(memo[n.cond], memo[n.a], memo[n.b])
            elif isinstance(n, E.Reduce):
                v = reduce[n.op](memo[n.x], dim=n.axis, keepdim=n.keepdims)
            elif isinstance(n, E.Gather):
                x, idx = memo[n.x], memo[n.idx].long()
                if idx.dim() == x.dim():
                    v = torch.gather(x, -1, idx)
                else:
                    v = torch.gather(x, -1, idx.unsqueeze(-1)).squeeze(-1)
            elif isinstance(n, E.Transpose):
                v = memo[n.x].mT
            elif isinstance(n, E.MatMul):
                v = torch.matmul(memo[n.a], memo[n.b])
            elif isinstance(n, E.Cast):
                x = memo[n.x]
                dt = _torch_dtype(torch, n.to)
                v = x.to(dt).float() if isinstance(x, torch.Tensor) else scalar(x).to(dt).item()
            else:
                raise Unavailable(f"no torch translation for {type(n).__name__}")
            memo[n] = v
        return memo[node]

    # Sub-expressions without an input (exp(c), bf16(c)) are computed here, once, in float32 on
    # the CPU, so that no call (and no compiled trace) computes them again.
    folded: dict = {}
    for o in workload.outputs:
        for n in E.walk(o.expr):  # operands first: a node is constant when all of them are
            if not isinstance(n, E.Input) and all(c in folded for c in E.children(n)):
                evaluate(n, {}, folded)

    def fn(inputs: dict) -> dict:
        memo = dict(folded)
        out = {}
        for o in workload.outputs:
            v = evaluate(o.expr, inputs, memo)
            if not isinstance(v, torch.Tensor):
                raise Unavailable(f"output {o.name!r} is a constant")
            out[o.name] = v.to(_torch_dtype(torch, o.dtype))
        return out

    return fn


def _raise_recompile_limit(torch) -> None:
    """One function object is compiled for every shape, input set and mode of a batch: past
    dynamo's recompile limit (8) it silently runs eager, an unfair baseline. Raised to 256."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for knob in ("recompile_limit", "cache_size_limit"):  # the name before torch 2.6
        if isinstance(getattr(cfg, knob, None), int) and getattr(cfg, knob) < 256:
            setattr(cfg, knob, 256)


def make_torch_baseline(name: str, workload, family: str = "row"):
    """(fn, version, config) for a torch-side baseline of `family` (its baselines module gives
    the idiomatic and library functions; the expression DAG serves the rest). Raises
    Unavailable with the reason."""
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not importable on this host: {e}") from e
    version = torch.__version__
    from factory import families  # the family's baselines module, imported when first asked

    try:
        provider = families.baselines_module(family)
    except KeyError as e:
        raise Unavailable(str(e)) from None
    if name in ("triton", "liger"):
        if provider is None:
            raise Unavailable(f"the {family} family has no {name} baseline")
        fn, how, lib_version = provider.library(name, workload)  # Unavailable, with the reason
        return fn, lib_version, {"kernel": how}
    if name in NAMED_BASELINES:
        named = getattr(provider, "named", None)
        if named is None:
            raise Unavailable(f"the {family} family has no {name} baseline")
        fn, how = named(name, workload)  # Unavailable, with the reason
        config = {"function": how}
        if name == "flex_attention":
            _raise_recompile_limit(torch)
            config["torch_compile"] = {"mode": "default", "of": "flex_attention"}
        return fn, version, config
    fn = how = None
    if provider is not None:
        fn, how = provider.idiomatic(name, workload, compiled=name != "torch_eager")
    if fn is None:
        fn, how = dag_function(workload), "expression DAG translated op by op (float32)"
    config = {"function": how}
    if name == "torch_eager":
        return fn, version, config
    if name in ("torch_compile", "torch_compile_max_autotune"):
        _raise_recompile_limit(torch)
    if name == "torch_compile":
        config["torch_compile"] = {"mode": "default", "dynamic": False}
        return torch.compile(fn, dynamic=False), version, config
    if name == "torch_compile_max_autotune":
        config["torch_compile"] = {"mode": "max-autotune-no-cudagraphs", "dynamic": False}
        return torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False), version, config
    raise Unavailable(f"unknown torch baseline {name!r}")
