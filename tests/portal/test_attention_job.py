"""Issue 49 through the portal: a customer's job for a soft-capped causal attention (the
attention_softcap example, 30 * tanh(s / 30) on the scores) is planned, emitted, compiled and
reviewed by the real agents and reaches the GPU stage in a batch naming the attention family,
its queued kernels the family's rendering of their schedules and the batch asking for the
attention baselines; a results file for those kernels (made up here: no GPU, its environment
says so, timings set from the unmasked FLOPs so that every kernel runs below the card's peak)
is imported, the job goes to review, and its page charts TFLOP/s against the dense peak beside
the baselines."""

import dataclasses
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from factory import families
from factory.families.attention import baselines as attention_baselines
from factory.spec import load_manifest
from factory.spec.types import BaselineUnavailable
from portal.models import Candidate, Job, Workload
from tests.portal.results_files import results_for

EXAMPLE = Path(__file__).resolve().parents[2] / "factory" / "examples" / "attention_softcap.toml"
MADE_UP = "made up by tests/portal/test_attention_job.py, no GPU"


@pytest.fixture
def attention_job(submit_to_gpu_stage):
    return submit_to_gpu_stage(EXAMPLE.read_text())


def test_a_softcap_attention_job_reaches_the_gpu_stage_and_its_page_charts_tflops(
    attention_job, client, customer, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = attention_job
    assert job.status == Job.WAITING_GPU, job.stop_reason
    batch = job.batches.get().batch
    assert batch["family"] == "attention"
    w = load_manifest(job.workload.manifest)
    fam, ir = families.family_for(w)
    assert fam.name == "attention" and ir.score is not None
    # the baselines issue 49 names: eager, SDPA flash and cuDNN, flex attention compiled
    assert batch["baselines"] == ["torch_eager", "sdpa_flash", "sdpa_cudnn", "flex_attention"]
    queued = list(job.candidates.filter(status=Candidate.QUEUED))
    assert queued, "no candidate survived the build"
    for c in queued:
        assert c.schedule["family"] == "attention"
        assert c.compile_report and c.compile_report["ok"]
        assert fam.emit(ir, c.schedule).ptx == c.ptx  # the stored kernel is the family's
        assert "wgmma.mma_async" in c.ptx and "cp.async.bulk.tensor" in c.ptx
        # the soft cap is in the kernel: without the score expression it renders otherwise
        assert fam.emit(dataclasses.replace(ir, score=None), c.schedule).ptx != c.ptx

    # A results file as the worker writes it, for these very kernels (matched by PTX hash), its
    # environment naming this test instead of a GPU; each median 1.5x (and more) the time of
    # the shape's unmasked FLOPs at the 989 TFLOP/s peak, the largest shape setting the base.
    flops = max(fam.roofline_of(w, dict(d)).flops for d in w.shapes)
    base_us = 1.5 * flops / 989e12 * 1e6
    data = results_for(batch, base_us=base_us)
    data["env"]["gpu"] = MADE_UP
    data["env"]["hostname"] = "no-gpu-test"
    # SDPA has no score hook: the worker reports its back ends unavailable, with the reason
    unavailable = {}
    for name in ("sdpa_flash", "sdpa_cudnn"):
        with pytest.raises(BaselineUnavailable) as refused:
            attention_baselines.named(name, w)
        unavailable[name] = str(refused.value)
    for entry in data["baselines"]:
        if entry["name"] in unavailable:
            entry.update(status="unavailable", reason=unavailable[entry["name"]], timing=[])
    results = tmp_path / "results.json"
    results.write_text(json.dumps(data))
    with django_capture_on_commit_callbacks(execute=True):
        call_command("import_results", str(results))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.stop_reason
    assert job.best_candidate.status == Candidate.PASSED

    client.force_login(customer)
    response = client.get(reverse("web-job", args=[job.code]))
    assert response.status_code == 200
    page = response.content.decode()
    assert MADE_UP in page  # the page says where the numbers came from
    charts = response.context["charts"]
    chart = charts.get("throughput")
    assert chart and not charts.get("bandwidth")
    assert "dense peak (989 TFLOP" in chart
    for name in ("torch_eager", "flex_attention"):
        assert name in chart, name  # every measured baseline beside the kernels
    for name in unavailable:
        assert name not in chart, name  # none drawn without a time


@pytest.mark.django_db
@pytest.mark.parametrize("stem", ["attention_softcap", "attention_gqa", "attention_document_mask"])
def test_the_upload_form_takes_an_attention_manifest_as_one_workload(
    stem, client, customer, settings
):
    settings.GPU_DISPATCH = False
    client.force_login(customer)
    text = (EXAMPLE.parent / f"{stem}.toml").read_text()
    # the per-row-length box ticked, as the form offers it: attention splits on nothing
    response = client.post(
        reverse("web-upload"),
        {"mode": "manifest", "manifest": text, "generations": "1", "per_row_length": "on"},
    )
    assert response.status_code == 302, response.context["form"].errors
    workload = Workload.objects.get()
    assert workload.spec().name == stem
    assert [dict(d) for d in workload.spec().shapes] == [
        dict(d) for d in load_manifest(text).shapes
    ]
    assert Job.objects.filter(workload=workload).count() == 1
