"""Downloads: only approved candidates, only the customer's organisation, checked every time,
and the zip's checksums verify."""

import io
import json
import zipfile

import pytest
from django.urls import reverse

from portal.artifacts import verify_checksums
from portal.delivery import decide_and_deliver
from portal.models import Artifact, AuditEvent, Job, ReviewDecision
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(orgs, customer, engineer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    decide_and_deliver(job=job, reviewer=engineer, decision="approve", comment="good", checklist={})
    job.refresh_from_db()
    return job


def _body(response):
    return b"".join(response.streaming_content)


def test_a_customer_downloads_the_approved_artifact_and_its_checksums_verify(
    client, customer, approved
):
    client.force_login(customer)
    response = client.get(reverse("web-artifact-download", args=[approved.code]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    data = _body(response)
    assert verify_checksums(data) == []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.read("kernel.ptx").decode() == approved.best_candidate.ptx
        assert "cubin/sm_90.cubin" in z.namelist()
        manifest = json.loads(z.read("manifest.json"))
        report = json.loads(z.read("report/report.json"))
    assert manifest["entry"] == "copy_k" and manifest["review"]["by"] == "erin"
    assert manifest["versions"]["driver"] == "580.159.04"
    assert manifest["versions"]["harness"] == "gpuworker, results format 1"
    assert manifest["launch_per_shape"][0]["grid"] == [64, 1, 1]
    assert report["copy_ceiling_tbps"] == 4.28 and len(report["timing"][0]["samples_us"]) == 5
    assert AuditEvent.objects.filter(verb="artifact.download", actor=customer).exists()


def test_downloads_refuse_a_job_that_is_not_approved(client, customer, orgs, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    client.force_login(customer)
    assert client.get(reverse("web-artifact-download", args=[job.code])).status_code == 404


def test_downloads_refuse_an_artifact_whose_approval_was_superseded(client, customer, approved):
    # Every download checks the approval again: an artifact row alone is not enough.
    Job.objects.filter(pk=approved.pk).update(status=Job.REJECTED)
    client.force_login(customer)
    assert client.get(reverse("web-artifact-download", args=[approved.code])).status_code == 404


def test_downloads_refuse_an_artifact_of_a_candidate_that_was_not_the_approved_one(
    client, customer, approved
):
    other = approved.candidates.exclude(pk=approved.best_candidate_id).first()
    Artifact.objects.filter(job=approved).update(candidate=other)
    client.force_login(customer)
    assert client.get(reverse("web-artifact-download", args=[approved.code])).status_code == 404


def test_a_customer_of_another_organisation_cannot_download(client, outsider, approved):
    client.force_login(outsider)
    assert client.get(reverse("web-artifact-download", args=[approved.code])).status_code == 404


def test_an_approval_whose_artifact_cannot_be_built_is_not_recorded(
    orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    best = job.best_candidate
    best.ptx = ".version 8.0\n.target sm_90\nthis is not ptx"
    best.save()
    with pytest.raises(ValueError, match="does not compile"):
        decide_and_deliver(job=job, reviewer=engineer, decision="approve", comment="", checklist={})
    job.refresh_from_db()
    assert job.status == Job.REVIEW
    assert not ReviewDecision.objects.filter(job=job).exists()
    assert not Artifact.objects.filter(job=job).exists()
