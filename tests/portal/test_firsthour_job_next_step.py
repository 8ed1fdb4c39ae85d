"""Issue 52 page review: a job that ends without a kernel (failed, cancelled, rejected) says what
to do next, and a job that will never be timed does not promise charts."""

import pytest
from django.urls import reverse

from portal import services
from portal.delivery import decide_and_deliver
from portal.models import Generation, Job, Workload, sha256_hex
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db


def _page(client, user, job) -> str:
    client.force_login(user)
    return client.get(reverse("web-job", args=[job.code])).content.decode()


def _failed_while_proposing(org, user) -> Job:
    manifest = 'name = "bias_add"\n'
    workload = Workload.objects.create(
        org=org, name="bias_add", manifest=manifest, sha256=sha256_hex(manifest), created_by=user
    )
    job = Job.objects.create(
        workload=workload, status=Job.RUNNING, stage=Job.STAGE_PROPOSING, created_by=user
    )
    Generation.objects.create(job=job, index=0)
    assert services.job_fail(job=job, reason="the agents failed: RateLimitError: 429")
    return job


def test_a_failed_job_says_why_and_links_another_job_and_promises_no_charts(client, orgs, customer):
    job = _failed_while_proposing(orgs[0], customer)
    page = _page(client, customer, job)
    assert 'id="next-step"' in page and "This job failed (the agents failed" in page
    assert reverse("web-workload", args=[job.workload.code]) in page.split('id="next-step"')[1]
    assert "No charts: no generation of this job was timed" in page
    assert "appear once the first generation has been timed" not in page


def test_a_cancelled_job_links_another_job(client, orgs, customer):
    job, _ = job_on_the_gpu(orgs[0], customer, name="silu")
    services.job_cancel(job=job, user=customer)
    page = _page(client, customer, job)
    assert "This job was cancelled: nothing goes to review." in page
    assert reverse("web-workload", args=[job.workload.code]) in page.split('id="next-step"')[1]


def test_a_rejected_job_says_nothing_is_delivered_and_what_next(
    client, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    decide_and_deliver(
        job=job, reviewer=engineer, decision="reject", comment="slower", checklist={}
    )
    page = _page(client, customer, job)
    assert "Nothing is delivered for this job." in page
    assert reverse("web-workload", args=[job.workload.code]) in page.split('id="next-step"')[1]


def test_a_job_still_searching_or_approved_shows_no_next_step(
    client, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    waiting, _ = job_on_the_gpu(orgs[0], customer)
    assert 'id="next-step"' not in _page(client, customer, waiting)
    approved = job_in_review(orgs[0], customer, name="layernorm")
    decide_and_deliver(
        job=approved, reviewer=engineer, decision="approve", comment="", checklist={}
    )
    assert 'id="next-step"' not in _page(client, customer, approved)


def test_a_queued_job_says_no_kernel_is_written_yet_not_where_they_came_from(
    client, orgs, customer
):
    manifest = 'name = "cumsum_rows"\n'
    workload = Workload.objects.create(
        org=orgs[0], name="cumsum_rows", manifest=manifest, sha256=sha256_hex(manifest),
        created_by=customer,
    )  # fmt: skip
    queued = Job.objects.create(workload=workload, status=Job.QUEUED, created_by=customer)
    page = _page(client, customer, queued)
    assert "none is written yet" in page and "kernels came from" not in page
    waiting, _ = job_on_the_gpu(orgs[0], customer)
    page = _page(client, customer, waiting)
    assert "kernels came from the offline generator" in page and "none is written yet" not in page
