"""The TMA-store kernels' register-store fallback for output rows that are not a multiple of 16
bytes (schedule.TMA_STORE_FALLBACK_VERIFIED): off, the staged kernels are emitted as verified and
is_valid refuses such N; on, the output map's rows are padded so the GPU worker can encode it at
any N (exact where the rows are 16-byte multiples), the epilogue branches on N to the register
stores, every staged kernel compiles without spills or serialised wgmmas, and the default serves
such shapes staged."""

from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import importlib  # noqa: E402

gemm_emit = importlib.import_module("factory.families.matmul.emit")
from test_matmul_helpers import nvjitlink_available  # noqa: E402

from factory.families.matmul import schedule as sched_mod  # noqa: E402
from factory.families.matmul import space  # noqa: E402
from factory.families.matmul.ir import plain  # noqa: E402
from factory.families.matmul.schedule import is_valid, staged_bytes  # noqa: E402
from factory.spec import eval_dim_expr  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

TS_NAMES = [sn for sn, s in schedules().items() if s.tma_store]


@pytest.fixture
def fallback(monkeypatch):
    monkeypatch.setattr(sched_mod, "TMA_STORE_FALLBACK_VERIFIED", True)
    monkeypatch.setattr(sched_mod, "CP_ASYNC_VERIFIED", True)  # the cp.async-loaded ones
    monkeypatch.setattr(sched_mod, "WIDE_K_VERIFIED", True)
    space._SPACES.clear()
    yield
    space._SPACES.clear()


def _c_map(e):
    return [p for p in e.params if p.kind == "tmap"][-1]


def test_off_the_staged_kernel_is_as_verified():
    assert not sched_mod.TMA_STORE_FALLBACK_VERIFIED
    e = gemm_emit.emit(plain(), schedules()["w256s4t128"])
    assert _c_map(e).dims == ("N", "M")
    assert "st.global" not in e.ptx and "ereg" not in e.ptx
    assert "16 bytes" in is_valid(plain(), schedules()["w256s4t128"], {"M": 9, "N": 250, "K": 8})


@pytest.mark.parametrize(("op", "sn"), [("plain", "w256s4t128"), ("rowq_fp8", "w256s4t256")])
def test_on_the_map_encodes_at_any_n_and_is_exact_where_used(op, sn, fallback):
    from gpuworker import tensormap

    ir = epilogue_irs()[op]
    e = gemm_emit.emit(ir, schedules()[sn])
    cmap = _c_map(e)
    elem = staged_bytes(ir)
    for n in (8, 16, 248, 250, 4097, 4099, 4100, 4104, 5000):
        dims = {"M": 333, "N": n, "K": 72}
        cols = int(eval_dim_expr(cmap.dims[0], dims))
        aligned = (n * elem) % 16 == 0
        # the map's row in 16-bit elements: the output's exactly where the kernel uses the map
        if aligned:
            assert cols * 2 == n * elem
        assert cols * 2 >= n * elem and (cols * 2) % 16 == 0
        plan = tensormap.plan(
            {"dims": list(cmap.dims), "box": list(cmap.box), "swizzle": cmap.swizzle},
            dims,
            "bf16",
        )
        assert plan["strides"][0] % 16 == 0
        assert is_valid(ir, schedules()[sn], dims) is None


@pytest.mark.parametrize(("op", "mask"), [("plain", 7), ("bias_gelu", 7), ("groupq_fp8", 15)])
def test_on_the_epilogue_branches_on_n_to_register_stores(op, mask, fallback):
    ir = epilogue_irs()[op]
    sn = "w256s4t128"
    e = gemm_emit.emit(ir, schedules()[sn])
    # the staged rows-are-16-byte-multiples test is N & (16 / element bytes - 1) == 0
    assert staged_bytes(ir) * (mask + 1) == 16
    m = re.search(r"and\.b32 (%r\d+), %N, (\d+);\n\s*setp\.ne\.u32 (%p\d+), \1, 0;\n", e.ptx)
    assert m and int(m[2]) == mask
    branch = re.search(rf"@{re.escape(m[3])} bra (\$?\w+);", e.ptx)
    assert branch
    staged, fallback_part = e.ptx.split(branch[1] + ":", 1)
    staged = staged[m.end() :]
    # the staged epilogue first (box stores, no global store of the output: a group-scaled
    # output's scales are st.global.f32 in both), then the register one
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in staged
    assert "st.global.b" not in staged
    reg = fallback_part.split("cp.async.bulk.wait_group 0", 1)[0]
    assert "st.global.b" in reg and "cp.async.bulk.tensor" not in reg
    # both epilogues keep their whole-tile and tail paths
    assert staged.count("eslow") >= 2 and reg.count("eslow") >= 2


def test_on_the_default_serves_unaligned_n_staged(fallback):
    for dims in ({"M": 4095, "N": 4097, "K": 4096}, {"M": 777, "N": 4099, "K": 1024}):
        d = space.default_schedule(plain(), dims)
        assert d.tma_store == 128, d.label()


@pytest.mark.skipif(not nvjitlink_available(), reason="nvJitLink is not installed")
@pytest.mark.parametrize("op", ["plain", "bias_gelu", "residual", "swiglu", "groupq_fp8"])
@pytest.mark.parametrize("sn", TS_NAMES)
def test_on_every_staged_kernel_compiles_clean(op, sn, fallback):
    from factory.compile import compile_ptx

    ir, s = epilogue_irs()[op], schedules()[sn]
    if is_valid(ir, s) is not None:
        return
    e = gemm_emit.emit(ir, s)
    assert "ereg" in e.ptx
    r = compile_ptx(e.ptx, "sm_90a", cache=False)
    assert r.ok, r.log[-2000:]
    assert r.spill_store_bytes == 0, r.spill_store_bytes
    assert r.registers <= 255
    assert not re.search(r"\(C75(09|11|15)\)", r.log), r.log[-2000:]
