"""A worker killed mid-task does not lose the job on Redis: the task comes back to another
worker and nothing is made twice. Needs real PostgreSQL and Redis (PTXF_SERVICES=1)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.db import connection

from portal.models import Candidate, Generation, Job, Workload, sha256_hex
from tests.portal.conftest import SIMPLE_PTX

ROOT = settings.BASE_DIR

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def worker_env(marker):
    db = connection.settings_dict
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the worker subprocess needs the PostgreSQL test database")
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    if db["PASSWORD"]:
        url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return {
        **os.environ,
        "DATABASE_URL": url,
        "FACTORY_REVIEW": "tests.portal.stages:slow_review",
        "PTXF_TEST_MARKER": str(marker),
        "PTXF_TEST_PAUSE_S": "60",
        # Short, so the killed worker's message is restored within seconds in this test.
        "CELERY_VISIBILITY_TIMEOUT_S": "3",
    }


def start_worker(name, env, *, queue="build", log=None):
    """A prefork worker with one child on `queue`; its log (at info with `log`, a file) is
    where a test reads what the worker did with a message."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "-Q",
            queue,
            "-P",
            "prefork",
            "-c",
            "1",
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info" if log else "warning",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT if log else None,
    )


def stop_worker(proc) -> None:
    """SIGTERM to the worker's process group (a warm shutdown), SIGKILL after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def wait_for(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return False


def building_candidate(workload: Workload) -> Candidate:
    """A queued build of SIMPLE_PTX in generation 0 of a new running job of `workload`."""
    job = Job.objects.create(workload=workload, status=Job.RUNNING, current_generation=0)
    generation = Generation.objects.create(job=job, index=0, status=Generation.BUILDING)
    return Candidate.objects.create(
        job=job,
        generation=generation,
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex(SIMPLE_PTX),
        entry="copy_k",
        params=[
            {"kind": "tensor", "ptx_type": "u64", "name": "x"},
            {"kind": "tensor", "ptx_type": "u64", "name": "y"},
            {"kind": "dim", "ptx_type": "u32", "name": "N"},
        ],
        launch={"grid": ["ceildiv(N, 256)", 1, 1], "block": [256, 1, 1], "smem_bytes": 0},
    )


def test_a_task_of_a_worker_killed_mid_task_is_redelivered_and_nothing_is_duplicated(
    acme_world, tmp_path
):
    broker = settings.CELERY_BROKER_URL
    if not broker.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL=redis://...")
    from portal import tasks
    from portal.celery import app

    marker = tmp_path / "calls"
    marker.write_text("")
    env = worker_env(marker)
    workload: Workload = acme_world["workload"]
    candidate = building_candidate(workload)
    job = candidate.job
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("build")

    first = start_worker("doomed", env)
    second = None
    try:
        tasks.candidate_build.delay(candidate.pk)
        assert wait_for(lambda: marker.read_text().count("start") == 1, 60), "never started"
        os.killpg(first.pid, signal.SIGKILL)  # the whole worker, parent and child, mid-task
        first.wait(timeout=10)
        candidate.refresh_from_db()
        assert candidate.status == Candidate.PROPOSED  # the first delivery died unfinished

        second = start_worker("rescuer", env)
        assert wait_for(
            lambda: Candidate.objects.get(pk=candidate.pk).status != Candidate.PROPOSED, 90
        ), "the task was not redelivered"
        time.sleep(2)  # give a duplicate delivery, if any, the chance to show itself
    finally:
        for proc in (first, second):
            stop_worker(proc)

    candidate.refresh_from_db()
    assert marker.read_text().count("start") == 2  # ran, was killed, ran again
    assert candidate.status in (Candidate.COMPILED, Candidate.REJECTED)
    assert candidate.compile_report["ok"] is True
    assert Candidate.objects.filter(job=job).count() == 1
