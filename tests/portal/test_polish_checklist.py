"""The review checklist says what ran the candidate: the GPU worker on a named GPU, or the CPU
PTX interpreter (results whose environment names it), never "the GPU worker" for the latter."""

from __future__ import annotations

import pytest
from django.urls import reverse

from portal import services
from portal.models import Job
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db

CPU_ENV = {
    "gpu": "CPU PTX interpreter factory.ptxsim, no GPU",
    "sm": "sm_90 emulated",
    "driver": "none",
}


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


def _red_team(client, job) -> object:
    checks = client.get(reverse("web-review", args=[job.code])).context["checks"]
    return next(c for c in checks if c.key == "red_team")


def _reviewed_on_the_cpu(org, user):
    job, results = job_on_the_gpu(org, user)
    results["env"] = dict(CPU_ENV)
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.status
    return job


def test_results_from_the_interpreter_are_not_credited_to_the_gpu_worker(
    client, orgs, customer, engineer, media
):
    job = _reviewed_on_the_cpu(orgs[0], customer)
    client.force_login(engineer)
    check = _red_team(client, job)

    assert check.ok
    assert check.detail.startswith("passed by the CPU PTX interpreter, not the GPU worker")
    assert "factory.ptxsim, no GPU (sm_90 emulated, driver none)" in check.detail
    assert "GPU worker passed" not in check.detail


def test_results_from_a_gpu_name_the_gpu_worker_and_its_gpu(
    client, orgs, customer, engineer, media
):
    job = job_in_review(orgs[0], customer)
    client.force_login(engineer)
    check = _red_team(client, job)

    assert check.ok
    assert check.detail == "passed by the GPU worker on NVIDIA H200 (sm_90, driver 580.159.04)"
    assert "interpreter" not in check.detail


def test_a_failed_candidate_names_what_failed_it(client, orgs, customer, engineer, media):
    job = _reviewed_on_the_cpu(orgs[0], customer)
    best = job.best_candidate
    best.gpu_status, best.reason = "failed", "wrong at n=16"
    best.save(update_fields=["gpu_status", "reason"])
    client.force_login(engineer)
    check = _red_team(client, job)

    assert not check.ok
    assert check.detail.startswith("the CPU PTX interpreter, not the GPU worker (")
    assert check.detail.endswith("reports failed: wrong at n=16")
