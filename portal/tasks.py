"""The job pipeline as thin Celery tasks: each takes an id, loads its row and calls one service.
What runs after what is not written here: the services consult the transitions table in
`portal.pipeline` as they move a row on.

Every task is safe to run twice (acks are late, so a killed worker's task comes back): the
services claim state with conditional UPDATEs and write rows under natural unique keys. A task
that finds its row gone or already past its step simply returns.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from portal import pipeline, services
from portal.models import Candidate, Generation, GpuBatch, Job

log = logging.getLogger("portal.tasks")


@shared_task(name="portal.job_start")
def job_start(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    if job is not None:
        services.job_start(job=job)


PROPOSE_RETRIES = 2


@shared_task(name="portal.generation_propose", bind=True, max_retries=PROPOSE_RETRIES)
def generation_propose(self, generation_id: int) -> None:
    generation = Generation.objects.select_related("job__workload").filter(pk=generation_id)
    generation = generation.first()
    if generation is None:
        return
    try:
        with pipeline.heartbeat(
            generation.job_id,
            f"agents: generation {generation.index}",
            max_s=settings.HEARTBEAT_MAX_AGENTS_S,
        ):
            services.generation_propose(generation=generation)
    except services.StageUnavailable as exc:
        services.job_fail(job=generation.job, reason=f"the agents are not installed: {exc}")
    except Exception as exc:
        # An agent backend can fail for a while (rate limits, a network blip): try again with
        # a pause, then give the job up with the reason rather than leave it running forever.
        if self.request.retries < PROPOSE_RETRIES and not self.request.is_eager:
            raise self.retry(exc=exc, countdown=15 * (self.request.retries + 1)) from exc
        log.exception("proposing generation %s failed", generation_id)
        services.job_fail(
            job=generation.job, reason=f"the agents failed: {type(exc).__name__}: {exc}"
        )


@shared_task(name="portal.candidate_build")
def candidate_build(candidate_id: int) -> None:
    candidate = Candidate.objects.select_related("job__workload", "generation").filter(
        pk=candidate_id
    )
    candidate = candidate.first()
    if candidate is not None:
        what = f"compile: candidate {str(candidate.code)[:8]}"
        with pipeline.heartbeat(candidate.job_id, what, max_s=settings.HEARTBEAT_MAX_BUILD_S):
            services.candidate_build(candidate=candidate)


@shared_task(name="portal.gpu_batch_dispatch")
def gpu_batch_dispatch(generation_id: int) -> None:
    generation = Generation.objects.select_related("job__workload").filter(pk=generation_id)
    generation = generation.first()
    if generation is not None:
        services.gpu_batch_dispatch(generation=generation)


@shared_task(name="portal.gpu_batch_taken")
def gpu_batch_taken(batch_id: str, worker: str, error: str = "") -> None:
    """Sent by the GPU worker as it starts a batch, with no worker when it gives it back, and
    with an error when it stopped without results, so the job page can tell a batch on the GPU
    from one waiting in line or one that needs an engineer."""
    services.gpu_batch_taken(code=batch_id, worker=worker, error=error)
    job_id = _job_of_batch(batch_id)
    if job_id is None:
        return
    if worker and not error:  # it starts: the batch's heartbeat begins
        pipeline.heartbeat_beat(job_id, _gpu_what(batch_id, worker))
    else:  # given back or stopped: no GPU stage runs for the job now
        pipeline.heartbeat_clear(job_id)


def _job_of_batch(batch_id) -> int | None:
    try:
        rows = GpuBatch.objects.filter(code=uuid.UUID(str(batch_id)))
    except ValueError:  # not a batch id at all
        return None
    return rows.values_list("job_id", flat=True).first()


def _gpu_what(batch_id: str, worker: str) -> str:
    # (not the worker's host name: customers read this line; engineers see the host beside it)
    return f"{pipeline.GPU_STAGE}: batch {str(batch_id)[:8]}"


@shared_task(name="portal.gpu_batch_alive")
def gpu_batch_alive(batch_id: str, worker: str) -> None:
    """Sent by the GPU worker every GPU_HEARTBEAT_EVERY_S seconds while it runs a batch: the
    batch's job hears that its GPU stage is alive (only while the batch is still out)."""
    job_id = _job_of_batch(batch_id)
    if (
        job_id is not None
        and GpuBatch.objects.filter(code=batch_id, status=GpuBatch.DISPATCHED).exists()
    ):
        pipeline.heartbeat_beat(job_id, _gpu_what(batch_id, worker))


@shared_task(name="portal.results_record")
def results_record(results: dict) -> None:
    try:
        services.results_record(results=results, source="worker")
    except services.ResultsError as exc:
        log.error("results refused: %s", exc)
    batch_id = results.get("batch_id") if isinstance(results, dict) else None
    if batch_id is not None:  # the GPU stage is over, whatever became of its results
        job_id = _job_of_batch(batch_id)
        if job_id is not None:
            Job.objects.filter(pk=job_id, heartbeat_by__startswith=pipeline.GPU_STAGE).update(
                heartbeat=None, heartbeat_by="", silent_requeues=0
            )


@shared_task(name="portal.generation_finish")
def generation_finish(generation_id: int) -> None:
    generation = Generation.objects.select_related("job").filter(pk=generation_id).first()
    if generation is not None:
        services.generation_finish(generation=generation)


@shared_task(name="portal.requeue_stuck")
def requeue_stuck(older_than_s: int | None = None) -> int:
    """Send again what follows every active job that has not moved for STUCK_AFTER_S seconds
    (`pipeline.resume`, from the transitions table).

    The embedded filesystem transport is at-most-once: a message taken by a worker that died is
    lost. Every task is idempotent, so sending one twice costs only a little work. A batch out
    to a GPU is not re-sent here (GPU time is dear, and an air-gapped batch waits by design);
    `manage.py requeue_stuck --gpu` re-sends those."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s or settings.STUCK_AFTER_S)
    stuck = Job.objects.filter(status__in=Job.ACTIVE, updated__lt=cutoff)
    return sum(pipeline.resume(job) for job in stuck)


@shared_task(name="portal.heartbeat_sweep")
def heartbeat_sweep() -> dict:
    """Every 15 s (Celery beat): re-queue the running stages that fell silent, or fail their
    jobs past the limit (`pipeline.sweep_silent`)."""
    return pipeline.sweep_silent()
