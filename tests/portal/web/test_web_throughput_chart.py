"""For the matmul family the job page charts TFLOP/s against the card's dense peak beside the
baselines; memory-bound families keep TB/s against the copy ceiling."""

from pathlib import Path

import pytest
from django.urls import reverse

from portal.models import TimingResult, Workload, sha256_hex
from portal.selectors import throughput_rows
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db

MATMUL = Path(__file__).resolve().parents[3] / "factory" / "examples" / "matmul_relu2_scaled.toml"


def _as_matmul(job):
    """The job's workload made the matmul example, its timings moved to that example's shapes."""
    from factory.spec import load_manifest
    from portal.charts import shape_label
    from portal.models import dims_key

    text = MATMUL.read_text()
    Workload.objects.filter(pk=job.workload_id).update(manifest=text, sha256=sha256_hex(text))
    shapes = [dict(d) for d in load_manifest(text).shapes]
    old = sorted({t.dims_key for t in TimingResult.objects.filter(batch__job=job)})
    for key, dims in zip(old, shapes):
        TimingResult.objects.filter(batch__job=job, dims_key=key).update(
            dims=dims, dims_key=dims_key(dims)
        )
    return shapes, shape_label


def test_a_matmul_job_charts_tflops_against_the_dense_peak(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    _as_matmul(job)
    client.force_login(customer)
    response = client.get(reverse("web-job", args=[job.code]))
    charts = response.context["charts"]
    assert charts.get("throughput") and not charts.get("bandwidth")
    assert "dense peak (989 TFLOP" in charts["throughput"]
    assert "torch_compile" in charts["throughput"]  # the baselines beside the kernel


def test_throughput_is_the_familys_flops_over_the_median_time():
    from factory.spec import load_manifest

    spec = load_manifest(MATMUL.read_text())
    dims = dict(spec.shapes[0])
    from portal.charts import shape_label
    from portal.models import dims_key

    rows, peak = throughput_rows(
        spec,
        "sm_90",
        [
            {
                "name": "candidate",
                "shape": shape_label(dims),
                "dims_key": dims_key(dims),
                "median_us": 100.0,
            }
        ],
    )
    from factory import families

    flops = families.get("matmul").roofline_of(spec, dims).flops
    assert peak == pytest.approx(989.0)
    assert rows[0]["tflops"] == pytest.approx(flops / 100e-6 / 1e12)


def test_a_memory_bound_job_keeps_its_bandwidth_chart(client, orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    client.force_login(customer)
    charts = client.get(reverse("web-job", args=[job.code])).context["charts"]
    assert not charts.get("throughput")
