"""The attention baselines (torch on the CPU) against the float64 reference: the eager formula,
SDPA where it can express the operator, flex_attention's score_mod/mask_mod translation."""

import numpy as np
import pytest

from factory.families.attention import baselines as B
from factory.spec import load_manifest
from factory.spec.reference import random_inputs, reference, to_float64
from factory.spec.types import BaselineUnavailable
from lab.attention.variants import VARIANTS, manifest

torch = pytest.importorskip("torch")

SHAPE = {"B": 2, "H": 4, "HKV": 2, "S": 150}


def setup(variant, causal, lse=True):
    w = load_manifest(manifest(variant, causal, 64, SHAPE, lse=lse, window=40))
    dims = w.shapes[0]
    x = random_inputs(w, dims, seed=4)
    if variant == "document":
        x["doc"] = np.sort(x["doc"], axis=1).astype(np.int32)
    ref = reference(w, x, dims)
    t = {}
    for d in w.inputs:
        if d.dtype == "bf16":
            t[d.name] = torch.from_numpy(x[d.name].view(np.int16)).view(torch.bfloat16)
        else:
            t[d.name] = torch.from_numpy(x[d.name])
    return w, t, ref


def rel(got, want):
    got = got.double().numpy()
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("variant, causal", [(v, c) for v in VARIANTS for c in (False, True)])
def test_eager_and_flex_match_the_reference(variant, causal):
    w, t, ref = setup(variant, causal)
    out = B.eager(w)(t)
    assert rel(out["o"], ref["o"]) < 1e-2
    np.testing.assert_allclose(out["lse"].double().numpy(), ref["lse"], rtol=1e-4, atol=1e-4)
    try:
        fl = B.flex(w, compile_flex=False)(t)
    except Exception as e:  # flex on the CPU needs torch's CPU path; say why when absent
        pytest.skip(f"flex_attention does not run on this CPU build: {str(e)[:200]}")
    assert rel(fl["o"], ref["o"]) < 1e-2
    np.testing.assert_allclose(fl["lse"].double().numpy(), ref["lse"], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("variant, causal", [("plain", False), ("plain", True), ("window", True)])
def test_sdpa_computes_the_plain_and_masked_operators(variant, causal):
    w, t, ref = setup(variant, causal, lse=False)
    out = B.sdpa(w, "math")(t)
    assert rel(out["o"], ref["o"]) < 1e-2


def test_sdpa_refuses_what_it_cannot_express():
    w, _, _ = setup("softcap", True, lse=False)
    with pytest.raises(BaselineUnavailable):
        B.sdpa(w)
    w, _, _ = setup("window", False, lse=False)
    with pytest.raises(BaselineUnavailable):
        B.sdpa(w, "flash")


def test_the_worker_names_map_to_eager_sdpa_and_flex():
    w, _, _ = setup("plain", True, lse=False)
    assert "materialised" in B.idiomatic("torch_eager", w, False)[1]
    assert "flash back end" in B.named("sdpa_flash", w)[1]
    assert "cudnn back end" in B.named("sdpa_cudnn", w)[1]
    w2, _, _ = setup("softcap", True)
    assert "materialised" in B.idiomatic("torch_eager", w2, False)[1]
    assert "flex" in B.idiomatic("torch_compile", w2, True)[1]
    assert "torch.compile" in B.named("flex_attention", w2)[1]
    with pytest.raises(BaselineUnavailable, match="score hook"):
        B.named("sdpa_cudnn", w2)


def test_bench_counts_document_pairs_from_the_ids():
    from factory.families.attention.ir import lower
    from lab.attention.bench import unmasked_pairs

    w, t, _ = setup("document", True)
    ir = lower(w)
    doc = t["doc"].numpy()
    want = 0
    for b in range(2):
        for i in range(150):
            want += int(((doc[b] == doc[b, i]) & (np.arange(150) <= i)).sum())
    assert unmasked_pairs(w, ir, dict(w.shapes[0]), t) == want * 4


def test_to_float64_is_what_the_bench_hands_torch():
    w, t, _ = setup("plain", False)
    x = random_inputs(w, w.shapes[0], seed=4)
    assert np.array_equal(t["q"].double().numpy(), to_float64(x["q"], "bf16"))


def test_bench_compiles_every_checked_kernel_clean(monkeypatch, tmp_path):
    from lab.attention import bench

    class Loaded:  # stands in for the driver's module load, which needs a GPU
        def __init__(self, ir, sched, em, report):
            assert report.ok, report.log[:500]
            assert report.spill_store_bytes == 0 and report.stack_bytes == 0
            self.em = em

    monkeypatch.setattr(bench, "Kernel", Loaded)
    monkeypatch.setattr(bench, "OUT", str(tmp_path))
    kernels = bench.compile_all(["plain", "document"], only=None)
    n_sched = sum(len(s) for s in bench.CHECK_SCHEDULES.values())
    scheds = [(lab, x) for s in bench.CHECK_SCHEDULES.values() for lab, (x, _) in s.items()]
    plain = sum("plain" in bench.ONLY.get(lab, ("plain",)) for lab, _ in scheds)
    # some labels are built for some variants only; the document mask refuses persistent CTAs
    doc = sum(
        "document" in bench.ONLY.get(lab, ("document",)) and not x.persistent for lab, x in scheds
    )
    assert len(kernels) == 2 * (plain + doc) and n_sched == len(scheds)
    assert all(k is not None and len(k.sha) == 64 for k in kernels.values())
    compiled = bench.RESULTS["compile"]
    if bench.find_ptxas() is not None:  # ptxas as a whole program honours setmaxnreg
        assert not any(
            c["setmaxnreg_ignored"] for c in compiled.values() if c["compiler"] == "whole"
        )
    assert all(c["setmaxnreg_ignored"] for c in compiled.values() if c["compiler"] == "jit")
