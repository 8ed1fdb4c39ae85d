"""A worker SIGKILLed in the middle of a compile: its heartbeat stops, the sweep sends the build
again, and another worker finishes it, long before the broker would hand the message back (its
visibility timeout is an hour here). Needs real PostgreSQL and Redis (PTXF_SERVICES=1)."""

import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from portal import pipeline
from portal.models import Candidate, Job, Workload
from tests.portal.test_redelivery import (
    building_candidate,
    start_worker,
    stop_worker,
    wait_for,
    worker_env,
)

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_compile_whose_worker_was_killed_is_sent_again_by_the_heartbeat_sweep(
    acme_world, tmp_path, settings
):
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL=redis://...")
    from portal import tasks
    from portal.celery import app

    marker = tmp_path / "calls"
    marker.write_text("")
    env = {
        **worker_env(marker),
        "CELERY_VISIBILITY_TIMEOUT_S": "3600",  # the broker gives nothing back in this test
        "HEARTBEAT_EVERY_S": "1",
    }
    workload: Workload = acme_world["workload"]
    candidate = building_candidate(workload)
    job = candidate.job
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("build")

    first = start_worker("doomed", env)
    second = None
    try:
        tasks.candidate_build.delay(candidate.pk)
        assert wait_for(lambda: marker.read_text().count("start") == 1, 120), "never started"
        what = f"compile: candidate {str(candidate.code)[:8]}"
        assert Job.objects.get(pk=job.pk).heartbeat_by == what  # the stage beats
        os.killpg(first.pid, signal.SIGKILL)  # the whole worker, parent and child, mid-compile
        first.wait(timeout=10)

        settings.HEARTBEAT_SILENT_S = 3
        assert wait_for(
            lambda: timezone.now() - Job.objects.get(pk=job.pk).heartbeat > timedelta(seconds=3),
            30,
        )
        assert pipeline.sweep_silent() == {"requeued": 1, "failed": 0}
        assert Job.objects.get(pk=job.pk).silent_requeues == 1

        second = start_worker("rescuer", env)
        assert wait_for(
            lambda: Candidate.objects.get(pk=candidate.pk).status != Candidate.PROPOSED, 120
        ), "the build was not sent again"
        assert wait_for(lambda: Job.objects.get(pk=job.pk).heartbeat is None, 30)
    finally:
        for proc in (first, second):
            stop_worker(proc)
    candidate.refresh_from_db()
    assert candidate.status in (Candidate.COMPILED, Candidate.REJECTED)
    assert marker.read_text().count("start") == 2  # the killed try and the rescuer's
    assert Job.objects.get(pk=job.pk).silent_requeues == 0  # the stage ended normally
