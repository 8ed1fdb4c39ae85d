"""Management commands: the demo seed, the stuck-work sweep."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command
from django.utils import timezone

from portal import services
from portal.celery import app
from portal.models import Generation, GpuBatch, Job, Membership, Organisation
from tests.portal.results_files import results_for


def test_seed_demo_creates_the_demo_logins_and_prints_them(db, settings, rf):
    settings.DEMO_ACCOUNTS = True  # the embedded default (tests/portal/test_hardening_login.py)
    out = StringIO()
    call_command("seed_demo", stdout=out)
    call_command("seed_demo", stdout=StringIO())  # twice is harmless
    assert "demo / demo-pass-2026" in out.getvalue()
    login = rf.post("/accounts/login/")  # django-axes wants the request
    assert authenticate(login, username="demo", password="demo-pass-2026") is not None
    assert Membership.objects.get(user__username="demo").org.name == "Acme"
    assert Membership.objects.get(user__username="engineer").role == Membership.ROLE_ENGINEER
    assert Membership.objects.get(user__username="outsider").org.name != "Acme"
    assert Organisation.objects.count() == 2


@pytest.fixture
def eager():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_the_sweep_finishes_a_generation_whose_finish_message_was_lost(
    acme_world, eager, django_capture_on_commit_callbacks
):
    job = acme_world["job"]
    generation = acme_world["candidate"].generation
    Job.objects.filter(pk=job.pk).update(
        status=Job.WAITING_GPU, max_generations=1, current_generation=0
    )
    Generation.objects.filter(pk=generation.pk).update(status=Generation.GPU)
    acme_world["candidate"].claim([acme_world["candidate"].status], "queued")
    batch = GpuBatch.objects.create(
        job=job,
        generation=generation,
        status=GpuBatch.DISPATCHED,
        batch={"shapes": [{"N": 8}], "heldout_shapes": [], "candidates": []},
    )
    batch.batch = {**batch.batch, "batch_id": str(batch.code)}
    batch.batch["candidates"] = [{"id": str(acme_world["candidate"].code)}]
    batch.save()
    # The results were recorded but the generation_finish message was lost with its worker.
    services.results_record(results=results_for(batch.batch))
    Job.objects.filter(pk=job.pk).update(updated=timezone.now() - timedelta(hours=1))

    with django_capture_on_commit_callbacks(execute=True):
        call_command("requeue_stuck", stdout=StringIO())
    job.refresh_from_db()
    assert job.status == Job.REVIEW


def test_the_sweep_leaves_jobs_that_are_moving_alone(acme_world, eager):
    out = StringIO()
    call_command("requeue_stuck", stdout=out)
    assert "re-sent 0 task(s)" in out.getvalue()
