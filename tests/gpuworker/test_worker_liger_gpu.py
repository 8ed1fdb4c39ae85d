"""On the GPU, where Liger Kernel is installed: its baseline for every catalogue operator it
covers passes the worker's float64 check (held-out shapes included) and is timed. A baseline
that fails verification would drop out of "best baseline" and flatter us."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.gpu

LIGER_OPS = ("softmax", "rmsnorm", "add_rmsnorm", "layernorm", "silu_mul", "relu2", "cross_entropy")


@pytest.mark.parametrize("name", LIGER_OPS)
def test_liger_baseline_is_verified_and_timed(name):
    pytest.importorskip("liger_kernel")
    from bench.suite import _catalogue, build_batch
    from gpuworker import run_batch

    w, manifest, ir = _catalogue()[name]
    shapes = [{d: (96 if d == "M" else v) for d, v in dict(s).items()} for s in w.shapes[:1]]
    batch, _ = build_batch(name, manifest, ir, shapes, ["liger"], 0.05, w.heldout_shapes)
    batch["candidates"] = batch["candidates"][:1]
    res = run_batch(batch)
    (b,) = res["baselines"]
    assert b["name"] == "liger" and b["version"], b
    assert b["status"] == "passed", b["reason"]
    assert b["verification"] and all(v["passed"] for v in b["verification"])
    assert any(v["heldout"] for v in b["verification"])
    assert b["timing"] and b["timing"][0]["median_us"] > 0
