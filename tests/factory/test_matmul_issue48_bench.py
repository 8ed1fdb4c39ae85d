"""The issue-48 bench's plan without a GPU: every (op, shape) has candidates, each one valid and
compiled for sm_90a (the --dry-run path), split-K only where the wide tiles leave SMs idle, and
the summary computes the issue's criteria from records."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lab.matmul import issue48_bench as ib  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402


def test_plan_covers_the_issue_shapes_and_ops():
    assert len(ib.ISSUE_SHAPES) == 8
    assert set(ib.OPS) <= set(epilogue_irs())
    for m, n, k in ib.ISSUE_SHAPES + ib.HELDOUT_SHAPES:
        for op in ib.OPS:
            names = ib.candidates(op, m, n, k, allow_splitk=True, extra=[])
            assert names and all(x in schedules() for x in names)
            sk = [x for x in names if schedules()[x].split_k > 1]
            if sk:  # split-K only where the 128 x 256 tiles leave most SMs idle
                assert math.ceil(m / 128) * math.ceil(n / 256) * 2 <= 132 or op == "swiglu"
            assert not ib.candidates(op, m, n, k, allow_splitk=False, extra=[]) or all(
                schedules()[x].split_k == 1
                for x in ib.candidates(op, m, n, k, allow_splitk=False, extra=[])
            )
    assert "sk2w256s4" in ib.candidates("plain", 128, 8192, 8192, True, [])


def test_tma_store_candidates_only_when_allowed_and_where_n_fits(monkeypatch):
    from factory.families.matmul import schedule as sched_mod

    # as before the H100 run verified it: the preflight's pass is what lets the schedules in
    monkeypatch.setattr(sched_mod, "TMA_STORE_VERIFIED", False)
    plain = ib.candidates("plain", 4096, 4096, 4096, False, [], allow_tma_store=True)
    assert {"w256s4t128", "w256s3t256"} <= set(plain) and "w256s4" in plain
    assert not any(
        schedules()[x].tma_store for x in ib.candidates("plain", 4096, 4096, 4096, False, [])
    )
    glu = ib.candidates("swiglu", 4096, 4096, 4096, False, [], allow_tma_store=True)
    assert "glu128s4t128" in glu
    # N = 4097: the output's tensor map needs 16-byte rows
    assert not any(
        schedules()[x].tma_store
        for x in ib.candidates("plain", 4095, 4097, 4000, False, [], allow_tma_store=True)
    )
    # fp8 outputs are staged in 128-column boxes (their own gate, opened by allow_tma_store)
    monkeypatch.setattr(sched_mod, "TMA_STORE_FP8_VERIFIED", False)
    fp8 = ib.candidates("rowq_fp8", 4096, 4096, 4096, False, [], allow_tma_store=True)
    assert "w256s4t256" in fp8 and "w256s4t128" in fp8
    assert not any(
        schedules()[x].tma_store for x in ib.candidates("rowq_fp8", 4096, 4096, 4096, False, [])
    )
    assert not sched_mod.TMA_STORE_VERIFIED  # candidates() put the flags back
    assert not sched_mod.TMA_STORE_FP8_VERIFIED


def test_dry_run_compiles_every_planned_kernel(monkeypatch, capsys):
    pytest.importorskip("cuda.bindings.nvjitlink")
    from factory.families.matmul import schedule as sched_mod

    monkeypatch.setattr(sched_mod, "SPLITK_VERIFIED", sched_mod.SPLITK_VERIFIED)
    monkeypatch.setattr(
        sys, "argv", ["issue48_bench", "--dry-run", "--allow-splitk", "--heldout", "1x4096x4096"]
    )
    assert ib.main() == 0
    out = capsys.readouterr().out
    assert "COMPILE FAILED" not in out and "refused" not in out
    assert out.count("\n") == len(ib.OPS) * 9  # ops x (8 issue shapes + 1 held out)
    assert len(ib.OPS) == 8


def _rec(op, shape, vs_eager, vs_best, heldout=False, share=0.7):
    rows = {"eager": {"median_us": 1.0}, "ours": {"share_of_peak": share}}
    return {
        "op": op,
        "shape": list(shape),
        "heldout": heldout,
        "rows": rows,
        "best": "ours",
        "vs_eager": vs_eager,
        "vs_best_baseline": vs_best,
    }


def test_summary_is_the_issues_criteria():
    recs = [
        _rec("plain", (8192, 8192, 8192), 0.97, 0.97, share=0.66),
        _rec("plain", (4096, 4096, 4096), 1.0 / 0.97, 1.0),
        _rec("plain", (1, 4096, 4096), 0.5, 0.5, heldout=True),  # held out: not in the criteria
        _rec("bias_gelu", (4096, 4096, 4096), 1.2, 1.1),
        _rec("swiglu", (4096, 4096, 4096), 1.3, 0.9),
    ]
    s = ib.summarize(recs)
    assert s["plain_vs_cublas_min"] == pytest.approx(0.97)
    assert s["plain_vs_cublas_geomean"] == pytest.approx(1.0)
    assert s["fused_vs_best_min"] == pytest.approx(0.9)
    assert s["fused_vs_best_geomean"] == pytest.approx(math.sqrt(1.1 * 0.9))
    assert s["plain_8192_share_of_peak"] == pytest.approx(0.66)


def test_rate_picks_our_fastest_verified_kernel_and_its_ratios():
    flops = 2.0 * 4096**3
    samples = {"eager": [200.0] * 5, "wgmma a": [190.0, 180.0, 180.0], "wgmma b": [250.0]}
    rec = {"rows": {}}
    ib.rate(rec, samples, {"wgmma a", "wgmma b"}, flops, 989.0)
    assert rec["best"] == "wgmma a"
    assert rec["vs_eager"] == pytest.approx(200 / 180)
    assert "vs_max_autotune" not in rec  # not compiled: the best baseline is eager
    assert rec["vs_best_baseline"] == pytest.approx(200 / 180)
    assert rec["rows"]["wgmma a"]["tflops"] == pytest.approx(flops / 180e-6 / 1e12)
    assert not rec["rows"]["wgmma a"]["implausible"]
    samples["max_autotune"] = [150.0]
    samples["wgmma b"] = [1.0]  # 137 PFLOP/s: above the peak
    rec = {"rows": {}}
    ib.rate(rec, samples, {"wgmma a", "wgmma b"}, flops, 989.0)
    assert rec["best"] == "wgmma b" and rec["rows"]["wgmma b"]["implausible"]
    assert rec["vs_best_baseline"] == pytest.approx(150.0)
    rec = {"rows": {}}
    ib.rate(rec, {"eager": [1.0]}, set(), flops, 989.0)  # nothing verified: no best
    assert "best" not in rec
