"""lab/probes/loop_run.py end to end on a CPU, with the real generator and a fake GPU (invented
times): checks the plumbing and the write-up, not performance."""

import argparse
import dataclasses
import json

from factory.spec.expr import Binary, Input, Reduce, Unary
from factory.spec.types import OutputDecl, Tolerance
from lab.probes import loop_run
from tests.factory.test_agents_ptx import customer_baseline
from tests.factory.test_loop_fakes import make_workload


def softmax_workload():
    x = Input("x", ("M", "N"), "fp32")
    m = Reduce("max", x, 1, True, ("M", 1))
    e = Unary("exp", Binary("sub", x, m, ("M", "N")), ("M", "N"))
    s = Reduce("sum", e, 1, True, ("M", 1))
    y = Binary("div", e, s, ("M", "N"))
    w = make_workload("softmax", dims={"M": 8192, "N": 4096})
    return dataclasses.replace(
        w,
        outputs=(OutputDecl("y", ("M", "N"), "fp32", y),),
        tolerance={"fp32": Tolerance(1e-5, 1e-5, 1e-5)},
    )


def fake_run_args(tmp_path, **over) -> argparse.Namespace:
    """lab.probes.loop_run's arguments for a small run on the fake GPU."""
    args = dict(
        out=str(tmp_path),
        ops=["softmax"],
        generations=3,
        warm_generations=1,
        customer_generations=2,
        population=4,
        prune_factor=2,
        sweep_limit=24,
        budget_s=300,
        seed=0,
        fake=True,
        render=None,
        prior="",
    )
    return argparse.Namespace(**(args | over))


def test_the_loop_run_writes_results_and_a_report_with_a_fake_gpu(tmp_path):
    args = fake_run_args(tmp_path, ops=["softmax", "missing_op"])
    customer = dataclasses.replace(softmax_workload(), baseline=customer_baseline())
    result = loop_run.run(
        args, catalogue={"softmax": softmax_workload()}, customer=(customer, "rowsoftmax.cu")
    )
    loop_run.render(result, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    sm = saved["operators"]["softmax"]
    assert sm["dims"] == {"M": 4096, "N": 4096}  # halved to fit the byte budget
    assert sm["sweep"]["swept"] == 24 and sm["sweep"]["space_size"] > 1000
    assert len(sm["cold"]["best_so_far_by_generation"]) == 3 and sm["cold"]["monotone"]
    assert sm["warm"]["warm"]["strategies"][0] == "warm_start"
    assert any("missing_op" in s for s in saved["skipped"])
    report = (tmp_path / "report.md").read_text()
    assert "FAKE RUN" in report and "| softmax |" in report
    assert (tmp_path / "evidence.jsonl").exists()
    cust = saved["customer"]
    assert cust["customer_us"] == 120.0 and cust["edits_tried"] > 0
    assert cust["job"]["baselines"] == {"customer": 120.0}
    assert (tmp_path / "charts.html").stat().st_size > 1000


def test_a_job_seeded_with_recorded_h200_sweeps_starts_from_their_winners(tmp_path):
    args = fake_run_args(
        tmp_path,
        generations=2,
        customer_generations=1,
        sweep_limit=12,
        prior="bench/results/2026-12-02-h200-sweep/run2-shape0.json",
    )
    from factory.spec import load_catalogue

    softmax = load_catalogue()["softmax"]  # the operator the recorded sweep timed
    result = loop_run.run(args, catalogue={"softmax": softmax}, customer=None)
    sm = result["operators"]["softmax"]
    seeded = sm["seeded"]
    assert seeded["prior_records"] >= 40  # the recorded softmax schedules of that sweep
    assert seeded["seeded"]["strategies"][0] == "warm_start"
    assert seeded["seeded_generation0_us"] is not None
    assert "spearman_on_sweep_fitted_on_prior" in sm["costmodel"]
    assert "spearman_on_sweep_fitted_on_prior_and_job" in sm["costmodel"]
    loop_run.render(result, tmp_path)
    assert "Jobs seeded with recorded evidence" in (tmp_path / "report.md").read_text()
