"""Review: engineers only, a checklist built from the evidence, decisions in the audit trail,
the customer told, and an artifact built on approval."""

import pytest
from django.core import mail
from django.urls import reverse

from portal.models import Artifact, AuditEvent, Job, ReviewDecision
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    customer.email = "alice@acme.example"
    customer.save()
    return job_in_review(orgs[0], customer)


def test_the_queue_lists_jobs_whose_best_candidate_awaits_a_decision(client, engineer, review_job):
    client.force_login(engineer)
    response = client.get(reverse("web-review-queue"))
    assert response.status_code == 200
    assert reverse("web-review", args=[review_job.code]) in response.content.decode()


def test_the_checklist_passes_when_the_evidence_is_clean(client, engineer, review_job):
    client.force_login(engineer)
    response = client.get(reverse("web-review", args=[review_job.code]))
    assert response.status_code == 200
    checks = {c.key: c.ok for c in response.context["checks"]}
    assert checks == {"correct": True, "red_team": True, "no_flags": True, "speedup": True}
    assert response.context["chosen_baseline"] == "torch_compile"


def test_a_flag_fails_the_checklist_and_blocks_approval_without_an_override(
    client, engineer, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, flagged=True)
    client.force_login(engineer)
    url = reverse("web-review", args=[job.code])
    checks = {c.key: c for c in client.get(url).context["checks"]}
    assert not checks["no_flags"].ok and "above_copy_ceiling" in checks["no_flags"].detail
    response = client.post(url, {"decision": "approve", "comment": ""})
    assert response.status_code == 400
    assert "override" in response.content.decode()
    job.refresh_from_db()
    assert job.status == Job.REVIEW and not ReviewDecision.objects.filter(job=job).exists()
    response = client.post(
        url, {"decision": "approve", "override": "on", "comment": "flag explained: L2-resident"}
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == Job.APPROVED


def test_a_speedup_interval_that_touches_one_fails_the_checklist(
    client, engineer, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    # The baseline takes 2 x base_us; at base_us=10 every candidate is ~2x faster. Make the
    # chosen baseline the candidate's own speed by comparing against a fast customer kernel.
    job = job_in_review(orgs[0], customer)
    from portal.models import TimingResult

    TimingResult.objects.filter(baseline_measurement__job=job).update(
        median_us=10.0, ci_low_us=9.9, ci_high_us=10.1
    )
    client.force_login(engineer)
    checks = {
        c.key: c for c in client.get(reverse("web-review", args=[job.code])).context["checks"]
    }
    assert not checks["speedup"].ok


def test_approving_records_the_decision_builds_the_artifact_and_tells_the_customer(
    client, engineer, customer, review_job
):
    client.force_login(engineer)
    response = client.post(
        reverse("web-review", args=[review_job.code]),
        {"decision": "approve", "comment": "verified and 2x faster than torch.compile"},
    )
    assert response.status_code == 302
    review_job.refresh_from_db()
    assert review_job.status == Job.APPROVED
    decision = ReviewDecision.objects.get(job=review_job)
    assert decision.reviewer == engineer and decision.checklist["correct"]["ok"]
    assert AuditEvent.objects.filter(
        verb="review.approve", target=f"job:{review_job.code}"
    ).exists()
    artifact = Artifact.objects.get(job=review_job)
    assert artifact.candidate_id == review_job.best_candidate_id
    assert len(mail.outbox) == 1 and "approved" in mail.outbox[0].subject
    assert mail.outbox[0].to == ["alice@acme.example"]
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[review_job.code])).content.decode()
    assert "Approved" in page and "verified and 2x faster" in page
    assert reverse("web-artifact-download", args=[review_job.code]) in page


def test_rejecting_needs_a_comment_and_tells_the_customer(client, engineer, review_job):
    client.force_login(engineer)
    url = reverse("web-review", args=[review_job.code])
    assert client.post(url, {"decision": "reject", "comment": ""}).status_code == 400
    assert (
        client.post(url, {"decision": "reject", "comment": "too close to torch"}).status_code == 302
    )
    review_job.refresh_from_db()
    assert review_job.status == Job.REJECTED
    assert not Artifact.objects.filter(job=review_job).exists()
    assert AuditEvent.objects.filter(verb="review.reject").exists()
    assert "rejected" in mail.outbox[0].subject


def test_a_customer_cannot_approve(client, customer, review_job):
    client.force_login(customer)
    response = client.post(
        reverse("web-review", args=[review_job.code]), {"decision": "approve", "comment": "mine"}
    )
    assert response.status_code == 404
    review_job.refresh_from_db()
    assert review_job.status == Job.REVIEW and not ReviewDecision.objects.exists()


def test_a_second_decision_on_a_decided_job_is_refused(client, engineer, review_job):
    client.force_login(engineer)
    url = reverse("web-review", args=[review_job.code])
    client.post(url, {"decision": "approve", "comment": "ok"})
    response = client.post(url, {"decision": "reject", "comment": "changed my mind"})
    assert response.status_code == 409
    assert ReviewDecision.objects.filter(job=review_job).count() == 1
