"""lab/memfamilies/bench.py builds worker batches (format 1) that the GPU worker's own parser
accepts: every case lowers to its family, every seed emits and compiles, params and launch
(clusters included) are well formed. Run here so a GPU session spends no time on a bad batch."""

from __future__ import annotations

import pytest

from lab.memfamilies import bench


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_every_bench_case_builds_a_batch_the_worker_parses(case):
    from factory.compile import compile_ptx
    from gpuworker.batch import parse_batch

    batch, fam, labels = bench.build_batch(bench.CASES[case], seeds=3)
    assert fam in (
        "colreduce", "segreduce", "allreduce", "scan", "argreduce", "pool", "segnorm",
        "rowsplit", "flat",
    )  # fmt: skip
    b = parse_batch(batch)
    assert len(b.candidates) == len(labels) >= 1
    assert b.family == fam and set(b.baselines) >= {"torch_eager", "torch_compile"}
    for c in b.candidates:
        r = compile_ptx(c.ptx, "sm_90")
        assert r.ok, r.log[:1000]


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_every_bench_case_reads_at_least_256_mib(case):
    """At its largest shape (the few-long-row cases also time 1 row of 1M elements)."""
    import math

    from factory.spec import load_manifest
    from factory.spec.expr import DTYPE_BYTES

    w = load_manifest(bench.CASES[case])
    read = max(
        sum(
            math.prod(dims[d] if isinstance(d, str) else d for d in t.shape) * DTYPE_BYTES[t.dtype]
            for t in w.inputs
        )
        for dims in w.shapes
    )
    assert read >= 256 * 2**20, read


def test_the_summary_gives_the_geomean_over_torch_compile_beside_the_bound():
    def rec(us, dims, status="passed"):
        return {"dims": dims, "median_us": us, "p20_us": us, "p80_us": us, "tbps": 1.0,
                "bytes": 2e6 * 100}  # fmt: skip

    dims = {"M": 1, "N": 8}
    results = {
        "copy_ceiling_tbps": 2.0,
        "candidates": [
            {"id": "c0", "status": "passed", "timing": [rec(150.0, dims)]},
            {"id": "c1", "status": "passed", "timing": [rec(120.0, dims)]},
            {"id": "c2", "status": "failed", "timing": [rec(1.0, dims)]},
        ],
        "baselines": [
            {"name": "torch_compile", "status": "passed", "timing": [rec(240.0, dims)]},
            {"name": "torch_eager", "status": "passed", "timing": [rec(200.0, dims)]},
        ],
    }
    rows = bench.summary_rows("x", results)
    assert len(rows) == 1 and rows[0]["ours_us"] == 120.0  # the failed one never counts
    assert rows[0]["best_baseline"] == ("torch_eager", 200.0)
    assert rows[0]["copy_us"] == 100.0  # 200 MB at 2 TB/s
    last = bench.geomeans(rows)[-1]
    assert "2.000x" in last and "2.400x" in last


def test_a_run_writes_each_case_and_the_summary_and_keeps_to_its_budget(tmp_path, monkeypatch):
    """The run path without a GPU: a fake worker answers each batch; the cases that would
    overrun the budget are skipped and named; summary.json holds the rows and the geomean."""
    import json

    import gpuworker

    clock = {"t": 0.0}

    def fake_run(batch):
        clock["t"] += 50.0  # each case takes 50 s of the budget

        def timing(us, dims):
            return {"dims": dims, "median_us": us, "p20_us": us, "p80_us": us, "tbps": 2.0,
                    "bytes": 4e8}  # fmt: skip

        shapes = batch["shapes"]
        return {
            "copy_ceiling_tbps": 3.0,
            "family": batch["family"],
            "candidates": [
                {"id": c["id"], "status": "passed", "timing": [timing(200.0, d) for d in shapes]}
                for c in batch["candidates"]
            ],
            "baselines": [
                {"name": n, "status": "passed", "timing": [timing(300.0, d) for d in shapes]}
                for n in batch["baselines"]
            ],
        }

    monkeypatch.setattr(gpuworker, "run_batch", fake_run)
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock["t"])
    cases = ["flat_scale_fp32", "flat_add_bf16_short_rows", "bias_grad_fp32", "sumsq_fp32"]
    argv = ["--out", str(tmp_path), "--budget-s", "120", "--seeds", "1"]
    assert bench.main([*argv, *sum((["--case", c] for c in cases), [])]) == 0
    # 0 s + 1.3 x 0 fits, 50 + 65 fits, 100 + 65 does not: two cases ran
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "flat_add_bf16_short_rows.json", "flat_scale_fp32.json", "summary.json",
    ]  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["skipped"] == ["bias_grad_fp32", "sumsq_fp32"]
    assert len(summary["rows"]) == 3  # two shapes of flat_scale_fp32, one of the other
    assert "1.500x" in summary["lines"][-1]  # 300 us against 200 us
