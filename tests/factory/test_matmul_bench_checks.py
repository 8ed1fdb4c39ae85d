"""The GPU benches' verdict, run here on the CPU with torch: each op computed as the kernels do
(the product of the bf16 inputs in fp32, the epilogue in fp32, one rounding to the stored
format: bf16, e4m3 bits, e4m3 bits with group scales) passes gemm_bench.compare against the
float64 reference, and a wrong answer of each kind fails, so the bounds the GPU run applies are
neither too tight for a right kernel nor too loose. Eager torch's own outputs (the baselines)
round the product to bf16 before the epilogue; their error is recorded by the bench, and
checked here against a looser bound."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

torch = pytest.importorskip("torch")

from lab.matmul import gemm_bench as gb  # noqa: E402
from lab.matmul import issue48_bench as ib  # noqa: E402

OPS = ["plain", "bias_gelu", "bias_silu", "residual", "relu2", "swiglu", "rowq_fp8", "groupq_fp8"]


def _inputs(op, m, n, k, seed=3):
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gb.make_inputs(torch, op, m, n, k, gen, dev="cpu")


def _as_kernel_writes(op, t, out):
    """The eager output in the kernel's storage: t["c"] (and t["cs"]) filled, two runs."""
    if op == "groupq_fp8":
        q, s = out
        t["c"].copy_(q.contiguous().view(torch.uint8))
        t["cs"].copy_(s)
    elif op == "rowq_fp8":
        t["c"].copy_(out.view(torch.uint8))
    else:
        t["c"].copy_(out)
    return [t["c"].clone(), t["c"].clone()]


def _kernel_like(op, t):
    """The op with fp32 arithmetic throughout and one rounding at the store, as the kernel."""
    args = [x.float() for x in ib.fn_args(op, t)]
    out = ib.torch_fn(torch, op)(*args)
    return out if op in gb.FP8_OPS else out.to(torch.bfloat16)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("m", "n", "k"), [(130, 300, 136), (64, 256, 1024)])
def test_a_kernel_like_answer_passes_the_bench_check(op, m, n, k):
    t = _inputs(op, m, n, k)
    outs = _as_kernel_writes(op, t, _kernel_like(op, t))
    ref = gb.reference(torch, op, t)
    v = gb.compare(torch, op, outs, t, ref, m, n, k)
    assert v["ok"], v
    # eager torch (the product rounded to bf16 first): the error the bench records for it
    out = ib.torch_fn(torch, op)(*ib.fn_args(op, t))
    assert ib.rel_err(torch, out, ref, op, t) < (7e-2 if op in gb.FP8_OPS else 2e-2)


@pytest.mark.parametrize("op", OPS)
def test_a_wrong_answer_fails_the_bench_check(op):
    m, n, k = 130, 300, 136
    t = _inputs(op, m, n, k)
    outs = _as_kernel_writes(op, t, _kernel_like(op, t))
    ref = gb.reference(torch, op, t)
    # one tile's worth of a column block written for the wrong row: swap two rows
    wrong = [o.clone() for o in outs]
    for w in wrong:
        w[[0, 77]] = w[[77, 0]]
    assert not gb.compare(torch, op, wrong, t, ref, m, n, k)["ok"]
    # a run that differs from the other (a race)
    racy = [outs[0], outs[0].clone()]
    racy[1][5, 5] = racy[1][5, 5] + (1 if racy[1].dtype == torch.uint8 else 0.5)
    assert not gb.compare(torch, op, racy, t, ref, m, n, k)["ok"]
    if op == "groupq_fp8":
        t["cs"][3, 1] = float("nan")  # a scale not written
        assert not gb.compare(torch, op, outs, t, ref, m, n, k)["ok"]


def test_e4m3_decoding_is_torchs():
    codes = torch.arange(256, dtype=torch.uint8)
    mine = gb.decode(torch, "rowq_fp8", codes)
    theirs = codes.view(torch.float8_e4m3fn).double()
    same = (mine == theirs) | (mine.isnan() & theirs.isnan())
    assert bool(same.all())
