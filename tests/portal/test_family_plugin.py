"""A family registered at run time goes through the whole portal: the copy family of
tests/families/copy (known to nothing but the registry) is uploaded, searched, compiled, sent to
the GPU queue in a batch that names it, recorded from a results file, and shown on the pages."""

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from factory import families
from portal import services
from portal.celery import app
from portal.models import Candidate, Job
from tests.families import copy as copy_family
from tests.portal.results_files import results_for


@pytest.fixture
def copy_job(customer, orgs, settings, django_capture_on_commit_callbacks):
    settings.GPU_DISPATCH = False
    app.conf.task_always_eager = True
    families.register(copy_family.FAMILY)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            workload = services.workload_create(
                org=orgs[0], user=customer, manifest=copy_family.MANIFEST
            )
            job = services.job_create(
                workload=workload, user=customer, max_generations=1, population=3, seed=3
            )
        job.refresh_from_db()
        yield job
    finally:
        families.unregister("copy")
        app.conf.task_always_eager = False


def test_a_job_of_a_registered_family_reaches_the_gpu_queue_with_its_family(copy_job):
    assert copy_job.status == Job.WAITING_GPU, copy_job.stop_reason
    batch = copy_job.batches.get().batch
    assert batch["family"] == "copy"
    assert set(batch["baselines"]) <= {"customer", *copy_family.FAMILY.baselines}
    for c in copy_job.candidates.all():
        assert c.schedule["family"] == "copy"
        assert c.compile_report is not None and c.compile_report["ok"]


def test_its_results_are_recorded_and_its_pages_show_its_labels(
    copy_job, client, customer, engineer, tmp_path, django_capture_on_commit_callbacks
):
    batch = copy_job.batches.get().batch
    results = tmp_path / "results.json"
    results.write_text(json.dumps(results_for(batch)))
    with django_capture_on_commit_callbacks(execute=True):
        call_command("import_results", str(results))
    copy_job.refresh_from_db()
    assert copy_job.status == Job.REVIEW, copy_job.stop_reason
    best = copy_job.best_candidate
    assert best.status == Candidate.PASSED

    client.force_login(customer)
    assert client.get(reverse("web-job", args=[copy_job.code])).status_code == 200
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert "family = copy" in page

    client.force_login(engineer)
    evidence = client.get(reverse("web-evidence")).content.decode()
    family = "plain-copy"
    assert family in evidence
    view = client.get(reverse("web-evidence"), {"family": family, "gpu": "sm_90"})
    assert view.status_code == 200
    assert "copy: " in view.content.decode()  # the family's own label for its schedules
