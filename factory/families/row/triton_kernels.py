"""Plain Triton kernels used as baselines: one row per program, the whole row in registers,
fp32 math. Imported only when the "triton" baseline is asked for (triton is optional), and kept
at module level because Triton resolves a kernel's names through its module's globals."""

import triton
import triton.language as tl


@triton.jit
def softmax_row(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    v = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf")).to(tl.float32)
    v = v - tl.max(v, axis=0)
    e = tl.exp(v)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rmsnorm_row(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    v = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(v * v, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * n_cols + offs, (v * r * w).to(y_ptr.dtype.element_ty), mask=mask)


def num_warps(block: int) -> int:
    """More warps for longer rows: a 16K-element row in 4 warps would spill."""
    return 4 if block <= 1024 else 8 if block <= 4096 else 16
