"""Per-organisation quota on jobs queued or searching: past it a new job is refused with a
sentence that says why and what to do, through the service, the API and a re-run alike."""

import json

import pytest
from django.urls import reverse

from factory.spec import catalogue_manifest
from portal import quotas, services
from portal.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def full(acme_world, settings):
    """Acme at its limit of active jobs (the world's running job is one of them)."""
    active = Job.objects.filter(workload__org=acme_world["job"].workload.org, status__in=Job.ACTIVE)
    settings.ORG_MAX_ACTIVE_JOBS = active.count()
    return acme_world


def test_a_job_past_the_organisations_limit_is_refused_with_the_reason(full, customer):
    with pytest.raises(quotas.QuotaExceeded) as refused:
        services.job_create(workload=full["job"].workload, user=customer, start=False)
    assert "the limit is" in refused.value.messages[0]
    assert "stop or cancel one" in refused.value.messages[0]


def test_the_api_answers_the_quota_in_json_with_its_message(full, client, customer):
    key, _ = services.api_token_create(user=customer, name="t")
    response = client.post(
        reverse("api-jobs"),
        json.dumps({"manifest": catalogue_manifest("softmax")}),
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code in (400, 409, 429), response.content
    assert "the limit is" in response.json()["error"]


def test_another_organisation_is_not_held_back(full, orgs, outsider, settings):
    from tests.portal.conftest import make_world_for

    theirs = make_world_for(orgs[1], outsider, "theirs")
    settings.ORG_MAX_ACTIVE_JOBS += 0
    Job.objects.filter(workload__org=orgs[1]).update(status=Job.APPROVED)
    assert services.job_create(workload=theirs["job"].workload, user=outsider, start=False)


def test_no_limit_when_set_to_zero(full, customer, settings):
    settings.ORG_MAX_ACTIVE_JOBS = 0
    assert services.job_create(workload=full["job"].workload, user=customer, start=False)


def test_a_job_past_the_organisations_gpu_time_is_refused_with_the_reason(
    acme_world, customer, settings
):
    from datetime import timedelta

    from django.utils import timezone

    from portal.models import GpuBatch

    settings.ORG_MAX_ACTIVE_JOBS = 0
    settings.ORG_GPU_SECONDS_PER_DAY = 3600
    job = acme_world["job"]
    now = timezone.now()
    batch = GpuBatch.objects.create(
        job=job,
        generation=acme_world["candidate"].generation,
        status=GpuBatch.RECORDED,
        batch={},
        started=now - timedelta(hours=2),
        finished=now - timedelta(minutes=30),
    )
    assert quotas.gpu_seconds_used(org=job.workload.org) == pytest.approx(5400, abs=5)
    with pytest.raises(quotas.QuotaExceeded, match="GPU-hours in the last 24 hours"):
        services.job_create(workload=job.workload, user=customer, start=False)
    # a day later the batch has left the window
    GpuBatch.objects.filter(pk=batch.pk).update(
        started=now - timedelta(hours=27), finished=now - timedelta(hours=25)
    )
    assert services.job_create(workload=job.workload, user=customer, start=False)
