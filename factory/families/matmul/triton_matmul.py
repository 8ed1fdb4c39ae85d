"""A plain Triton matmul for the matmul family's "triton" baseline: C = act(A @ B + bias), A
[M, K] row-major, B either [K, N] or a weight stored [N, K] (read through its strides), fp32
accumulation, grouped tile order, autotuned over a few tile configurations per (M, N, K).

Imported only by `baselines.library("triton", ...)`, where triton is importable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Activation codes fused in the epilogue; any other activation runs after the kernel in torch.
ACT_CODES = {None: 0, "identity": 0, "gelu_tanh": 1, "silu": 2, "relu": 3, "relu2": 4,
             "sigmoid": 5, "tanh": 6}  # fmt: skip


def _config(bm, bn, bk, stages, warps, group_m=8):
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m},
        num_stages=stages,
        num_warps=warps,
    )


CONFIGS = [
    _config(128, 256, 64, 3, 8),
    _config(128, 256, 64, 4, 8),
    _config(256, 128, 64, 3, 8),
    _config(128, 128, 64, 4, 8),
    _config(128, 128, 64, 4, 4),
    _config(64, 256, 64, 4, 4),
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
    _config(64, 64, 64, 5, 4),
]


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACT == 1:
        acc = 0.5 * acc * (1.0 + _tanh(0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)))
    elif ACT == 2:
        acc = acc * tl.sigmoid(acc)
    elif ACT == 3:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 4:
        acc = tl.maximum(acc, 0.0)
        acc = acc * acc
    elif ACT == 5:
        acc = tl.sigmoid(acc)
    elif ACT == 6:
        acc = _tanh(acc)
    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def linear(x, w, w_layout: str, bias=None, act: str | None = None):
    """act(x @ w.T + bias) for w stored [N, K] (w_layout "col"), act(x @ w + bias) for [K, N]
    ("row"), in x's dtype; None where this kernel does not take `act` or the shapes (a batched
    weight) — the caller then uses torch."""
    if act not in ACT_CODES or w.dim() != 2:
        return None
    k = x.shape[-1]
    a = x.reshape(-1, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    if w_layout == "col":
        n = w.shape[0]
        stride_bk, stride_bn = w.stride(1), w.stride(0)
    else:
        n = w.shape[1]
        stride_bk, stride_bn = w.stride(0), w.stride(1)
    m = a.shape[0]
    c = torch.empty((m, n), device=x.device, dtype=x.dtype)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _matmul_kernel[grid](
        a, w, c, bias if bias is not None else c,
        m, n, k,
        a.stride(0), a.stride(1), stride_bk, stride_bn, c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, ACT=ACT_CODES[act],
    )  # fmt: skip
    return c.reshape(*x.shape[:-1], n)
