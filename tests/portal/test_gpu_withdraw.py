"""A cancelled job's batch that still waits in a GPU queue is withdrawn: the GPU workers alive
at the cancel discard it when they reach it, instead of spending GPU time on it. Needs real
PostgreSQL and Redis (PTXF_SERVICES=1) and a real worker on the GPU queue."""

import uuid

import pytest
from django.conf import settings

from portal import pipeline, services
from portal.celery import GPU_TASK_NAME, app
from portal.models import Generation, GpuBatch, Job
from tests.portal.test_redelivery import start_worker, stop_worker, wait_for, worker_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_cancelled_jobs_waiting_batch_is_discarded_by_the_gpu_worker(
    acme_world, customer, tmp_path
):
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL=redis://...")
    job = acme_world["job"]
    Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU, stage=Job.STAGE_GPU)
    generation = Generation.objects.get(job=job)
    code = uuid.uuid4()
    batch = GpuBatch.objects.create(
        code=code,
        job=job,
        generation=generation,
        arch="sm_90",
        status=GpuBatch.DISPATCHED,
        batch={"format": 1, "batch_id": str(code), "shapes": [], "candidates": []},
    )
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("gpu.sm_90")
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = start_worker(
            "gpu-test", worker_env(tmp_path / "unused"), queue="gpu.sm_90", log=log
        )
    try:
        assert wait_for(lambda: "ready." in log_path.read_text(), 60), log_path.read_text()
        job.refresh_from_db()
        assert services.job_cancel(job=job, user=customer)  # withdraws on commit
        task_id = pipeline.gpu_task_id(code)
        heard = lambda: any(  # noqa: E731 - the worker has the revoke in its revoked set
            task_id in ids for ids in (app.control.inspect(timeout=2).revoked() or {}).values()
        )
        assert wait_for(heard, 30), "the worker never heard of the revoke"
        # In service the message waits in the queue behind other batches while the cancel's
        # revoke reaches the worker; here it is sent after: the worker's check is the same.
        pipeline.send_to_gpu(batch.pk)
        discarded = f"Discarding revoked task: {GPU_TASK_NAME}[{task_id}]"
        assert wait_for(lambda: discarded in log_path.read_text(), 30), log_path.read_text()
        assert f"Received task: {GPU_TASK_NAME}[{task_id}]" not in log_path.read_text()
    finally:
        stop_worker(worker)
    batch.refresh_from_db()
    assert batch.started is None and batch.status == GpuBatch.DISPATCHED
