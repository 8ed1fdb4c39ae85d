"""Issue 48 through the portal: a customer's job for a fused operator (x @ w.T + bias, then
GELU: the matmul_bias_gelu example) is planned, emitted, compiled and reviewed by the real agents
and reaches the GPU stage in a batch naming the matmul family, its queued kernels the family's
wgmma rendering of their schedules; a results file for that batch (made up: no GPU here, timings
set from the shapes' FLOPs so that every kernel runs below the card's peak) is imported, the job
goes to review, and its page charts TFLOP/s against the dense peak beside the baselines."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from factory import families
from factory.spec import load_manifest
from portal.models import Candidate, Job
from tests.portal.results_files import results_for

EXAMPLE = Path(__file__).resolve().parents[2] / "factory" / "examples" / "matmul_bias_gelu.toml"


@pytest.fixture
def matmul_job(submit_to_gpu_stage):
    return submit_to_gpu_stage(EXAMPLE.read_text())


def test_a_fused_matmul_job_reaches_the_gpu_stage_and_its_page_charts_tflops(
    matmul_job, client, customer, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = matmul_job
    assert job.status == Job.WAITING_GPU, job.stop_reason
    batch = job.batches.get().batch
    assert batch["family"] == "matmul"
    # the family's baselines go to the worker beside the kernels
    assert {"torch_eager", "torch_compile_max_autotune"} <= set(batch["baselines"])
    w = load_manifest(job.workload.manifest)
    fam, ir = families.family_for(w)
    assert fam.name == "matmul"
    queued = list(job.candidates.filter(status=Candidate.QUEUED))
    assert queued, "no candidate survived the build"
    for c in queued:
        assert c.schedule["family"] == "matmul"
        assert c.compile_report and c.compile_report["ok"]
        assert fam.emit(ir, c.schedule).ptx == c.ptx  # the stored kernel is the family's
        # tensor cores fed by the tensor memory accelerator, or by cp.async (a schedule of the
        # space since it was verified on an H100, never the default)
        assert "wgmma.mma_async" in c.ptx
        loads = "cp.async.bulk.tensor" if c.schedule.get("load", "tma") == "tma" else "cp.async.cg"
        assert loads in c.ptx
    assert any(c.schedule.get("load", "tma") == "tma" for c in queued)

    # a results file as the worker writes it; each median 1.5x (and more) the time of the
    # shape's FLOPs at the 989 TFLOP/s peak, the largest shape setting the base
    flops = max(fam.roofline_of(w, dict(d)).flops for d in w.shapes)
    base_us = 1.5 * flops / 989e12 * 1e6
    results = tmp_path / "results.json"
    results.write_text(json.dumps(results_for(batch, base_us=base_us)))
    with django_capture_on_commit_callbacks(execute=True):
        call_command("import_results", str(results))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.stop_reason
    assert job.best_candidate.status == Candidate.PASSED

    client.force_login(customer)
    response = client.get(reverse("web-job", args=[job.code]))
    assert response.status_code == 200
    charts = response.context["charts"]
    chart = charts.get("throughput")
    assert chart and not charts.get("bandwidth")
    assert "dense peak (989 TFLOP" in chart
    for name in batch["baselines"]:
        if name != "customer":
            assert name in chart, name  # every baseline beside the kernels
