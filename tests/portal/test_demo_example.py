"""A fresh install's finished example: after seed_demo the demo organisation has one approved
job whose results are a real H200 recording of exactly its kernels, labelled as such, with
charts, a review and an artifact."""

import pytest
from django.core.management import call_command
from django.urls import reverse

from portal.models import Artifact, Candidate, GpuBatch, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.DEMO_ACCOUNTS = True
    settings.GPU_DISPATCH = False
    call_command("seed_demo")
    return Job.objects.get(workload__name="softmax_example")


def test_seed_demo_makes_an_approved_example_job_from_the_recording(seeded):
    assert seeded.status == Job.APPROVED
    assert seeded.workload.org.name == "Acme"
    assert Artifact.objects.filter(job=seeded).count() == 1
    batch = GpuBatch.objects.get(job=seeded)
    assert batch.source == "recording" and batch.status == GpuBatch.RECORDED
    # The recording answers exactly these kernels: each candidate's hash is the recorded one.
    for entry in batch.results["candidates"]:
        c = Candidate.objects.get(code=entry["id"])
        assert entry["ptx_sha256"] == c.ptx_sha256
    assert Candidate.objects.filter(job=seeded, status=Candidate.PASSED).count() == 4


def test_a_second_seed_changes_nothing(seeded):
    call_command("seed_demo")
    assert Job.objects.filter(workload__name="softmax_example").count() == 1


def test_the_example_job_page_has_charts_and_says_it_is_a_recording(client, seeded):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="demo"))
    response = client.get(reverse("web-job", args=[seeded.code]))
    page = response.content.decode()
    charts = response.context["charts"]
    for key in ("generations", "baselines", "bandwidth", "correctness"):
        assert charts.get(key), key
    assert 'id="recording"' in page and "NVIDIA H200" in page and "2026-12-02" in page
    assert 'id="download"' in page
    home = client.get(reverse("web-home")).content.decode()
    assert "softmax_example" in home and "recorded example" in home
    assert client.get(reverse("web-artifact-download", args=[seeded.code])).status_code == 200
