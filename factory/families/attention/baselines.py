"""The attention family's torch-side baselines: the operator as a customer writes it in torch.

- `sdpa(backend)`: F.scaled_dot_product_attention under one SDPA back end ("flash", "cudnn",
  "efficient", "math"), for the plain operator (causal through is_causal); the masked variants
  pass their mask as a boolean attn_mask (flash takes none: Unavailable), a score expression
  other than s is Unavailable (SDPA has no score hook), and so is a log-sum-exp output.
- `eager`: the textbook formula, materialised: S = Q K^T * scale in fp32, the score expression
  and the mask as torch operators over broadcast index tensors, softmax, P V. A shape whose
  fp32 score tensor is over EAGER_SCORE_BYTES is Unavailable when called (a few copies of it
  are live at once).
- `flex`: torch's flex_attention with a score_mod and a mask_mod translated from the same
  expressions (the mask also as a BlockMask, so flex skips whole blocks); compiled by the caller.

For the GPU worker's names (`WORKER_BASELINES`, what an attention batch asks for): "torch_eager"
is `eager`; "sdpa_flash" and "sdpa_cudnn" are `sdpa` under that back end; "flex_attention" is
`flex` under torch.compile. "torch_compile" and "torch_compile_max_autotune" still give `flex`
(the worker wraps it in torch.compile) for a batch that asks for them. Every function takes a
dict of input tensors in storage dtype and returns {output name: tensor}. Importing this module
imports neither torch nor CUDA.
"""

from __future__ import annotations

import math

from factory.spec import expr as E
from factory.spec.types import BaselineUnavailable as Unavailable

SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")
# The baselines issue 49 names, by the GPU worker's names (gpuworker/baselines.py).
WORKER_BASELINES = ("torch_eager", "sdpa_flash", "sdpa_cudnn", "flex_attention")
# The largest fp32 score tensor (B x Hq x S x Skv x 4 bytes) the eager formula materialises:
# the score, its modified copy, the softmax and its temporaries are live together.
EAGER_SCORE_BYTES = 8 << 30


def _ir(workload):
    from factory.families.attention.ir import lower

    return lower(workload)


def term(node: E.Node, env: dict, tensors: dict):
    """node as torch operations: env maps s, i, j, h, b to tensors (broadcastable, or 0-d
    inside flex's mods); tensors the extra inputs by name."""
    import torch

    if isinstance(node, E.Const):
        return float(node.value) if math.isfinite(node.value) else node.value
    if isinstance(node, E.Input):
        return env[node.name]
    if isinstance(node, E.Gather):
        x = tensors[node.x.name]
        idx = env[node.idx.name]
        return x[env["b"], idx] if x.dim() == 2 else x[idx]
    if isinstance(node, E.Unary):
        x = term(node.x, env, tensors)
        if not isinstance(x, torch.Tensor):
            x = torch.tensor(x)
        if node.op == "neg":
            return -x
        fn = {
            "exp": torch.exp,
            "log": torch.log,
            "sqrt": torch.sqrt,
            "rsqrt": torch.rsqrt,
            "tanh": torch.tanh,
            "sigmoid": torch.sigmoid,
            "erf": torch.erf,
            "abs": torch.abs,
        }[node.op]
        return fn(x)
    if isinstance(node, E.Binary):
        a, b = term(node.a, env, tensors), term(node.b, env, tensors)
        if node.op in ("max", "min"):
            a = a if isinstance(a, torch.Tensor) else torch.tensor(a)
            b = b if isinstance(b, torch.Tensor) else torch.tensor(b)
            return torch.maximum(a, b) if node.op == "max" else torch.minimum(a, b)
        return {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "div": lambda: a / b,
            "pow": lambda: a**b,
        }[node.op]()
    if isinstance(node, E.Compare):
        a, b = term(node.a, env, tensors), term(node.b, env, tensors)
        return {
            "lt": lambda: a < b,
            "le": lambda: a <= b,
            "gt": lambda: a > b,
            "ge": lambda: a >= b,
            "eq": lambda: a == b,
            "ne": lambda: a != b,
        }[node.op]()
    if isinstance(node, E.Where):
        return torch.where(
            term(node.cond, env, tensors), term(node.a, env, tensors), term(node.b, env, tensors)
        )
    if isinstance(node, E.Cast):
        x = term(node.x, env, tensors)
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[node.to]
        return x.to(dt).float()
    raise Unavailable(f"no torch translation for {type(node).__name__} in a score or mask")


def _index_env(torch, q, k, device):
    bsz, hq, sq, _ = q.shape
    skv = k.shape[2]
    return {
        "b": torch.arange(bsz, device=device).view(bsz, 1, 1, 1),
        "h": torch.arange(hq, device=device).view(1, hq, 1, 1),
        "i": torch.arange(sq, device=device).view(1, 1, sq, 1),
        "j": torch.arange(skv, device=device).view(1, 1, 1, skv),
    }


def _mask_tensor(torch, ir, inputs):
    """The boolean (B or 1, Hq or 1, S, Skv) mask of every term, or None."""
    if not ir.mask:
        return None
    q, k = inputs[ir.q], inputs[ir.k]
    env = _index_env(torch, q, k, q.device)
    keep = None
    for t in ir.mask:
        m = term(t, env, inputs)
        keep = m if keep is None else keep & m
    return keep


def eager(workload):
    """The materialised formula (fp32 scores); Unavailable when called at a shape whose score
    tensor is over EAGER_SCORE_BYTES, or when the GPU runs out of memory."""
    ir = _ir(workload)

    def run(torch, q, k, v, inputs):
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * ir.scale
        if ir.score is not None:
            env = _index_env(torch, q, k, q.device)
            env["s"] = s
            s = term(ir.score, env, inputs)
        keep = _mask_tensor(torch, ir, inputs)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out = {ir.out: torch.matmul(p, v.float()).to(q.dtype)}
        if ir.lse:
            out[ir.lse] = lse
        return out

    def fn(inputs: dict) -> dict:
        import torch

        q, k, v = inputs[ir.q], inputs[ir.k], inputs[ir.v]
        score_bytes = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        if score_bytes > EAGER_SCORE_BYTES:
            raise Unavailable(
                f"eager attention would materialise {score_bytes / 2**30:.0f} GiB of fp32 "
                f"scores at {tuple(q.shape)} (at most {EAGER_SCORE_BYTES / 2**30:.0f} GiB)"
            )
        try:
            return run(torch, q, k, v, inputs)
        except torch.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            raise Unavailable(f"eager attention ran out of GPU memory: {str(e)[:160]}") from None

    return fn


def sdpa(workload, backend: str | None = None):
    """F.scaled_dot_product_attention under `backend` (None: torch's choice). Raises
    Unavailable where SDPA cannot compute this operator."""
    ir = _ir(workload)
    if ir.score is not None:
        raise Unavailable("SDPA has no score hook: only s itself")
    if ir.lse:
        raise Unavailable("SDPA returns no log-sum-exp")
    causal = ir.band_lo is None and ir.band_hi == 0 and not ir.elementwise
    masked = bool(ir.mask) and not causal
    if masked and backend == "flash":
        raise Unavailable("SDPA's flash back end takes no attn_mask")

    def fn(inputs: dict) -> dict:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = inputs[ir.q], inputs[ir.k], inputs[ir.v]
        mask = _mask_tensor(torch, ir, inputs) if masked else None
        kw = {"scale": ir.scale, "enable_gqa": q.shape[1] != k.shape[1]}
        if causal:
            kw["is_causal"] = True
        if backend is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
        else:
            which = {
                "flash": SDPBackend.FLASH_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH,
            }[backend]
            with sdpa_kernel([which]):
                try:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
                except RuntimeError as e:
                    # the back end is absent, or refuses these inputs (dtype, head grouping)
                    said = str(e).lower()
                    if "no available kernel" not in said and "no viable backend" not in said:
                        raise
                    raise Unavailable(f"SDPA's {backend} back end: {str(e)[:160]}") from None
        return {ir.out: o}

    return fn


def flex(workload, compile_flex: bool = True):
    """flex_attention with the score and mask as score_mod / mask_mod (and a BlockMask built
    once per shape). With `compile_flex` the flex_attention call is torch.compile'd here."""
    ir = _ir(workload)
    state: dict = {}

    def fn(inputs: dict) -> dict:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if "flex" not in state:
            state["flex"] = torch.compile(flex_attention) if compile_flex else flex_attention
        q, k, v = inputs[ir.q], inputs[ir.k], inputs[ir.v]
        tensors = {x.name: inputs[x.name] for x in ir.extra}
        # The mods and the BlockMask are made once per (shapes, extra tensors): torch.compile
        # guards on the mods' identity, so a fresh closure every call would recompile every call
        # and, past dynamo's recompile limit, fall back to the unfused (materialising) flex.
        key = (tuple(q.shape), tuple(k.shape), q.device, *(id(t) for t in tensors.values()))
        if state.get("key") != key:
            score_mod = mask_mod = None
            if ir.score is not None:

                def score_mod(score, b, h, q_idx, kv_idx):
                    env = {"s": score, "b": b, "h": h, "i": q_idx, "j": kv_idx}
                    return term(ir.score, env, tensors)

            block_mask = None
            if ir.mask:

                def mask_mod(b, h, q_idx, kv_idx):
                    env = {"b": b, "h": h, "i": q_idx, "j": kv_idx}
                    keep = None
                    for t in ir.mask:
                        m = term(t, env, tensors)
                        keep = m if keep is None else keep & m
                    return keep

                per_b = q.shape[0] if any(x.batched for x in ir.extra) else None
                block_mask = create_block_mask(
                    mask_mod, per_b, None, q.shape[2], k.shape[2], device=q.device
                )
            state.update(key=key, score_mod=score_mod, mask=block_mask)
        score_mod, block_mask = state["score_mod"], state["mask"]
        kw = {"scale": ir.scale, "enable_gqa": q.shape[1] != k.shape[1]}
        if ir.lse:
            try:  # torch >= 2.9 asks for the log-sum-exp through an AuxRequest
                from torch.nn.attention.flex_attention import AuxRequest

                o, aux = state["flex"](
                    q, k, v, score_mod=score_mod, block_mask=block_mask,
                    return_aux=AuxRequest(lse=True), **kw,
                )  # fmt: skip
                lse = aux.lse
            except ImportError:
                o, lse = state["flex"](
                    q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True, **kw
                )
            return {ir.out: o, ir.lse: lse.float()}
        o = state["flex"](q, k, v, score_mod=score_mod, block_mask=block_mask, **kw)
        return {ir.out: o}

    return fn


def idiomatic(name: str, workload, compiled: bool):
    """(fn, description) for the GPU worker's torch baselines (see the module docstring)."""
    if name == "torch_eager":
        return eager(workload), "materialised attention in fp32 (the score as torch ops)"
    return (
        flex(workload, compile_flex=False),
        "flex_attention with the score and mask as score_mod / mask_mod, BlockMask",
    )


def named(name: str, workload):
    """(fn, description) for the worker's attention baselines "sdpa_flash", "sdpa_cudnn" and
    "flex_attention" (torch.compile'd here). Raises Unavailable, with the reason, where the
    back end cannot express the operator."""
    if name in ("sdpa_flash", "sdpa_cudnn"):
        backend = name.removeprefix("sdpa_")
        fn = sdpa(workload, backend)
        return fn, f"F.scaled_dot_product_attention, {backend} back end only"
    if name == "flex_attention":
        how = "flex_attention under torch.compile, the score and mask as score_mod / mask_mod"
        return flex(workload, compile_flex=True), how + ", BlockMask"
    raise Unavailable(f"the attention family has no {name} baseline")


def library(name: str, workload):
    raise Unavailable(f"the attention family has no {name} baseline")
