"""The row family's torch-side baselines: the idiomatic library call a customer would make for
each catalogue operator (F.softmax, F.rms_norm, ...), a plain Triton kernel where one is easy,
and Liger Kernel's Triton kernels for the operators it has. The GPU worker asks this module
(through factory.families) before it falls back to the expression DAG translated op by op.
Importing it imports neither torch nor CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.spec import expr as E
from factory.spec.types import BaselineUnavailable as Unavailable

FUSED_ADD_RMSNORM = ("add_rmsnorm", "fused_add_rmsnorm", "residual_add_rmsnorm")


def _torch_dtype(torch, dtype: str):
    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "int32": torch.int32,
        "int64": torch.int64,
    }[dtype]


def _find_eps(workload) -> float | None:
    """The small positive constant in a norm's expression (its epsilon), if there is one."""
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Const) and 0 < n.value < 1e-2:
                return float(n.value)
    return None


def _has_op(workload, cls, op: str) -> bool:
    return any(
        isinstance(n, cls) and getattr(n, "op", None) == op
        for o in workload.outputs
        for n in E.walk(o.expr)
    )


@dataclass(frozen=True)
class OpRoles:
    """A catalogue operator recognised in a workload: which one (`kind`), the name of each input
    and output by its role, and the constants the library calls take. Every baseline that calls
    a library function (torch, Triton, Liger) reads this one classification, so they agree on
    what an operator is.

    kind: "add_rmsnorm" (inputs x, r, w; outputs h = x + r, y = the norm of h), "softmax",
    "log_softmax" (x), "rmsnorm" (x, w), "layernorm" (x, w, b), "silu_mul" (a, b), "gelu" (x;
    `approximate` "tanh" or "none"), "relu2" (x), "cross_entropy" (logits, target); every kind
    but add_rmsnorm has one output, role "y"."""

    kind: str
    inputs: dict
    outputs: dict
    eps: float | None = None
    approximate: str | None = None


_KIND_NAMES = {
    "softmax": ("softmax", "softmax_lastdim"),
    "log_softmax": ("log_softmax", "logsoftmax"),
    "rmsnorm": ("rmsnorm", "rms_norm"),
    "layernorm": ("layernorm", "layer_norm"),
    "silu_mul": ("silu_mul", "swiglu", "silu_and_mul"),
    "relu2": ("relu2", "relu_squared"),
    "cross_entropy": ("cross_entropy", "crossentropy", "cross_entropy_fwd"),
}


def op_roles(workload) -> OpRoles | None:
    """The catalogue operator this workload is, by its name and the shapes of its tensors; None
    where it is none of them (then the baselines translate the expression instead)."""
    name = workload.name.lower().replace("-", "_")
    ins, outs = workload.inputs, workload.outputs
    if not ins:
        return None
    x = ins[0].name
    vectors = [t.name for t in ins[1:] if len(t.shape) == 1]
    eps = _find_eps(workload)
    if name in FUSED_ADD_RMSNORM:
        if len(ins) != 3 or len(vectors) != 1 or len(outs) != 2 or not eps:
            return None
        normed = [o for o in outs if any(isinstance(n, E.Reduce) for n in E.walk(o.expr))]
        if len(normed) != 1:
            return None
        y = normed[0]
        h = next(o for o in outs if o is not y)
        w = vectors[0]
        r = next(t.name for t in ins[1:] if t.name != w)
        return OpRoles("add_rmsnorm", {"x": x, "r": r, "w": w}, {"h": h, "y": y}, eps)
    if len(outs) != 1:
        return None
    y = {"y": outs[0]}
    kind = next((k for k, names in _KIND_NAMES.items() if name in names), None)
    if name.startswith("gelu") and len(ins) == 1:
        approx = "tanh" if _has_op(workload, E.Unary, "tanh") else "none"
        return OpRoles("gelu", {"x": x}, y, approximate=approx)
    if kind in ("softmax", "log_softmax", "relu2") and len(ins) == 1:
        return OpRoles(kind, {"x": x}, y)
    if kind == "rmsnorm" and len(ins) == 2 and len(vectors) == 1 and eps:
        return OpRoles(kind, {"x": x, "w": vectors[0]}, y, eps)
    if kind == "layernorm" and len(ins) == 3 and len(vectors) == 2 and eps:
        return OpRoles(kind, {"x": x, "w": vectors[0], "b": vectors[1]}, y, eps)
    if kind == "silu_mul" and len(ins) == 2 and not vectors:
        return OpRoles(kind, {"a": x, "b": ins[1].name}, y)
    if kind == "cross_entropy" and len(ins) == 2:
        return OpRoles(kind, {"logits": x, "target": ins[1].name}, y)
    return None


def idiomatic_function(workload, compiled: bool = False):
    """The torch function a customer would call for a catalogue operator, or (None, None).
    `compiled`: for torch.compile. Where a composition of library calls compiles to slower code
    than the expression, which inductor fuses whole (add+RMSNorm), that is None, and the caller
    compiles the expression."""
    import torch
    import torch.nn.functional as F

    op = op_roles(workload)
    if op is None or op.kind == "relu2":
        return None, None
    i, eps = op.inputs, op.eps
    if op.kind == "add_rmsnorm":
        if compiled:
            # Compiled, the two calls stay two kernels (265 us at 16384x8192 in suite run 7)
            # where the expression fuses into one (249 us, run 6).
            return None, None
        # h = x + r (the new residual, rounded to its dtype), y = rms_norm(h) * w: the two calls
        # a model makes, rather than the expression translated op by op in float32 (13x slower
        # on the H200).
        h, y = op.outputs["h"], op.outputs["y"]
        hdt, ydt = _torch_dtype(torch, h.dtype), _torch_dtype(torch, y.dtype)
        x, r, w = i["x"], i["r"], i["w"]

        def add_rms(d):
            hv = (d[x] + d[r]).to(hdt)
            return {h.name: hv, y.name: F.rms_norm(hv, (hv.shape[-1],), d[w], eps).to(ydt)}

        return add_rms, f"h = x + r; F.rms_norm(h, (N,), w, eps={eps})"
    out = op.outputs["y"].name
    odt = _torch_dtype(torch, op.outputs["y"].dtype)
    if op.kind == "softmax":
        x = i["x"]
        return (lambda d: {out: F.softmax(d[x], dim=-1).to(odt)}), "F.softmax(x, dim=-1)"
    if op.kind == "log_softmax":
        x = i["x"]
        return (lambda d: {out: F.log_softmax(d[x], dim=-1).to(odt)}), "F.log_softmax"
    if op.kind == "rmsnorm":
        x, w = i["x"], i["w"]
        return (
            lambda d: {out: F.rms_norm(d[x], (d[x].shape[-1],), d[w], eps).to(odt)}
        ), f"F.rms_norm(x, (N,), w, eps={eps})"
    if op.kind == "layernorm":
        x, w, b = i["x"], i["w"], i["b"]
        return (
            lambda d: {out: F.layer_norm(d[x], (d[x].shape[-1],), d[w], d[b], eps).to(odt)}
        ), f"F.layer_norm(x, (N,), w, b, eps={eps})"
    if op.kind == "silu_mul":
        a, b = i["a"], i["b"]
        return (lambda d: {out: (F.silu(d[a]) * d[b]).to(odt)}), "F.silu(a) * b"
    if op.kind == "gelu":
        x, approx = i["x"], op.approximate
        return (
            lambda d: {out: F.gelu(d[x], approximate=approx).to(odt)}
        ), f"F.gelu(x, approximate={approx!r})"
    if op.kind == "cross_entropy":
        logits, target = i["logits"], i["target"]
        # Losses are computed from float32 logits in practice (bf16 logsumexp loses the fp32
        # output's precision), so that is what a customer would call.
        return (
            lambda d: {
                out: F.cross_entropy(d[logits].float(), d[target].long(), reduction="none").to(odt)
            }
        ), 'F.cross_entropy(logits.float(), target, reduction="none")'
    return None, None


def _triton_function(workload):
    """A plain Triton kernel, one row per program, for softmax and RMSNorm; else Unavailable."""
    try:
        import torch
        import triton

        from factory.families.row import triton_kernels as tk
    except ImportError as e:
        raise Unavailable(f"triton is not importable: {e}") from e
    op = op_roles(workload)
    if op is None or op.kind not in ("softmax", "rmsnorm"):
        raise Unavailable(f"no plain Triton kernel for {workload.name!r}")
    out = op.outputs["y"].name
    odt = _torch_dtype(torch, op.outputs["y"].dtype)
    xname = op.inputs["x"]

    if op.kind == "softmax":

        def fn(d):
            xt = d[xname]
            n = xt.shape[-1]
            y = torch.empty(xt.shape, dtype=odt, device=xt.device)
            block = triton.next_power_of_2(n)
            tk.softmax_row[(xt.numel() // n,)](xt, y, n, BLOCK=block, num_warps=tk.num_warps(block))
            return {out: y}

        return fn, "softmax_row: one row per program, BLOCK = next_pow2(N), fp32 math"

    wname, eps = op.inputs["w"], op.eps

    def fn(d):
        xt = d[xname]
        n = xt.shape[-1]
        y = torch.empty(xt.shape, dtype=odt, device=xt.device)
        block = triton.next_power_of_2(n)
        tk.rmsnorm_row[(xt.numel() // n,)](
            xt, d[wname], y, n, eps, BLOCK=block, num_warps=tk.num_warps(block)
        )
        return {out: y}

    return fn, "rmsnorm_row: one row per program, BLOCK = next_pow2(N), fp32 math"


def _liger_function(workload):
    """Liger Kernel's forward for a catalogue operator it has, called as a customer would; else
    Unavailable. Norms take casting_mode="gemma" (everything in float32, one rounding at the
    end), which is the catalogue's arithmetic; Liger's default ("llama") rounds x * rstd to
    bf16 before the weight, a second rounding the float64 check may reject."""
    try:
        import torch
        from liger_kernel.ops import cross_entropy as lce
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.relu_squared import LigerReLUSquaredFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError as e:
        raise Unavailable(f"liger-kernel is not importable: {e}") from e
    op = op_roles(workload)
    if op is None or op.kind in ("gelu", "log_softmax"):
        raise Unavailable(f"Liger Kernel has no kernel for {workload.name!r}")
    i, eps = op.inputs, op.eps
    if op.kind == "add_rmsnorm":
        x, r, w = i["x"], i["r"], i["w"]
        h, normed = op.outputs["h"].name, op.outputs["y"].name

        def add_rms(d):
            y, hv = LigerFusedAddRMSNormFunction.apply(d[x], d[r], d[w], eps, 0.0, "gemma", False)
            return {normed: y, h: hv}

        return add_rms, f"LigerFusedAddRMSNormFunction(x, r, w, eps={eps}, casting_mode=gemma)"
    out = op.outputs["y"].name
    odt = _torch_dtype(torch, op.outputs["y"].dtype)
    if op.kind == "softmax":
        x = i["x"]
        return (
            lambda d: {out: LigerSoftmaxFunction.apply(d[x]).to(odt)}
        ), "LigerSoftmaxFunction(x)"
    if op.kind == "rmsnorm":
        x, w = i["x"], i["w"]
        return (
            lambda d: {
                out: LigerRMSNormFunction.apply(d[x], d[w], eps, 0.0, "gemma", False).to(odt)
            }
        ), f"LigerRMSNormFunction(x, w, eps={eps}, casting_mode=gemma)"
    if op.kind == "layernorm":
        x, w, b = i["x"], i["w"], i["b"]
        return (
            lambda d: {out: LigerLayerNormFunction.apply(d[x], d[w], d[b], eps).to(odt)}
        ), f"LigerLayerNormFunction(x, w, b, eps={eps})"
    if op.kind == "silu_mul":
        a, b = i["a"], i["b"]
        return (lambda d: {out: LigerSiLUMulFunction.apply(d[a], d[b]).to(odt)}), (
            "LigerSiLUMulFunction(a, b)"
        )
    if op.kind == "relu2":
        x = i["x"]
        return (lambda d: {out: LigerReLUSquaredFunction.apply(d[x]).to(odt)}), (
            "LigerReLUSquaredFunction(x)"
        )
    # cross_entropy
    logits, target = i["logits"], i["target"]

    # LigerCrossEntropyFunction.forward checks the targets on the host (.item()), which
    # waits for the GPU inside the timed interval, and stores the loss in the logits' dtype
    # (bf16, too coarse for the fp32 loss). Its kernel is launched here as that forward
    # launches it, minus those two: every target is a class (no ignore_index), and the
    # loss buffer is fp32. That is Liger at its fastest and most precise.
    def ce(d):
        lg, tg = d[logits], d[target]
        m, v = lg.shape
        loss = torch.empty(m, dtype=odt, device=lg.device)
        lce.liger_cross_entropy_kernel[(m,)](
            X_ptr=lg,
            X_stride=lg.stride(-2),
            Y_ptr=tg,
            Y_stride=tg.stride(-1),
            weight_ptr=None,
            loss_ptr=loss,
            z_loss_ptr=None,
            loss_stride=loss.stride(-1),
            token_accuracy_ptr=None,
            token_accuracy_stride=0,
            predicted_tokens_ptr=None,
            predicted_tokens_stride=0,
            n_cols=v,
            n_non_ignore=m,
            sum_non_ignore_weight=m,
            ignore_index=-100,
            weight_sum=0.0,
            lse_square_scale=0.0,
            label_smoothing=0.0,
            reduction="none",
            softcap=None,
            RETURN_Z_LOSS=False,
            RETURN_TOKEN_ACCURACY=False,
            RETURN_PREDICTED_TOKENS=False,
            BLOCK_SIZE=min(lce.MAX_FUSED_SIZE, 1 << (v - 1).bit_length()),
            HAS_WEIGHT=False,
            HAS_SOFTCAPPING=False,
            HAS_GRADIENTS=False,
            num_warps=32,  # what the forward picks on Hopper
        )
        return {out: loss}

    return ce, "liger_cross_entropy_kernel as LigerCrossEntropyFunction launches it, fp32 loss"


def idiomatic(name: str, workload, compiled: bool):
    """(fn, how) for torch_eager (compiled False) or the torch.compile modes, or (None, None)
    where the expression DAG serves better."""
    return idiomatic_function(workload, compiled=compiled)


def library(name: str, workload):
    """(fn, how, version) of a library baseline ("triton", "liger"); raises Unavailable."""
    if name == "triton":
        fn, how = _triton_function(workload)
        import triton

        return fn, how, triton.__version__
    if name == "liger":
        from importlib.metadata import version as dist_version

        fn, how = _liger_function(workload)
        return fn, how, dist_version("liger-kernel")
    raise Unavailable(f"no {name!r} baseline in the row family")
