"""The job pipeline as thin Celery tasks: each takes ids, loads its row and calls one service.

Every task is safe to run twice (acks are late, so a killed worker's task comes back): the
services claim state with conditional UPDATEs and write rows under natural unique keys. A task
that finds its row gone or already past its step simply returns.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import chain, shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal import services
from portal.celery import GPU_TASK_NAME, app
from portal.models import Candidate, Generation, GpuBatch, Job

log = logging.getLogger("portal.tasks")


@shared_task(name="portal.job_start")
def job_start(job_id: int) -> None:
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return
    generation = services.job_start(job=job)
    if generation is not None:
        generation_propose.delay_on_commit(generation.pk)


PROPOSE_RETRIES = 2


@shared_task(name="portal.generation_propose", bind=True, max_retries=PROPOSE_RETRIES)
def generation_propose(self, generation_id: int) -> None:
    generation = Generation.objects.select_related("job__workload").filter(pk=generation_id)
    generation = generation.first()
    if generation is None:
        return
    try:
        candidate_ids = services.generation_propose(generation=generation)
    except services.StageUnavailable as exc:
        _fail(generation.job, f"the agents are not installed: {exc}")
        return
    except Exception as exc:
        # An agent backend can fail for a while (rate limits, a network blip): try again with
        # a pause, then give the job up with the reason rather than leave it running forever.
        if self.request.retries < PROPOSE_RETRIES and not self.request.is_eager:
            raise self.retry(exc=exc, countdown=15 * (self.request.retries + 1)) from exc
        log.exception("proposing generation %s failed", generation_id)
        _fail(generation.job, f"the agents failed: {type(exc).__name__}: {exc}")
        return
    for candidate_id in candidate_ids:
        candidate_build.delay_on_commit(candidate_id)


@shared_task(name="portal.candidate_build")
def candidate_build(candidate_id: int) -> None:
    candidate = Candidate.objects.select_related("job__workload", "generation").filter(
        pk=candidate_id
    )
    candidate = candidate.first()
    if candidate is None:
        return
    services.candidate_build(candidate=candidate)
    # The last build of a generation sends the batch; if two builders both see "all built",
    # the dispatch claim lets only one of them through.
    if services.generation_builds_done(generation=candidate.generation):
        gpu_batch_dispatch.delay_on_commit(candidate.generation_id)


@shared_task(name="portal.gpu_batch_dispatch")
def gpu_batch_dispatch(generation_id: int) -> None:
    generation = Generation.objects.select_related("job__workload").filter(pk=generation_id)
    generation = generation.first()
    if generation is not None:
        services.gpu_batch_dispatch(generation=generation)


def send_to_gpu(batch_id: int) -> None:
    """Send a recorded batch to its architecture's queue, with results_record chained after it.
    The GPU host runs only `gpuworker.run_batch`; the results travel back as the argument of
    results_record on the default queue. With GPU_DISPATCH off (air-gapped GPU hosts) the batch
    waits for an imported results file."""
    if not settings.GPU_DISPATCH:
        return
    batch = GpuBatch.objects.filter(pk=batch_id, status=GpuBatch.DISPATCHED).first()
    if batch is None:
        return
    # Sent again (requeue_stuck --gpu): whichever worker had it is presumed gone.
    GpuBatch.objects.filter(pk=batch.pk).update(started=None, worker="", error="")
    gpu = app.signature(
        GPU_TASK_NAME,
        args=(batch.batch,),
        queue=f"gpu.{batch.arch}",
        task_id=gpu_task_id(batch.code),  # by the batch, so that a cancel can withdraw it
    )
    chain(gpu, results_record.s().set(queue="default")).apply_async()


def gpu_task_id(batch_code) -> str:
    return f"gpu-batch-{batch_code}"


def withdraw_gpu_batches(job: Job) -> int:
    """Ask the GPU workers to drop the job's batches that wait in a GPU queue (a cancelled job):
    Celery's revoke, broadcast to the workers alive now, which then discard the message when
    they reach it (tests/portal/test_gpu_withdraw.py, on Redis). Best effort: a batch already
    on a GPU runs to the end (its results are kept as evidence), and a worker that joins later
    has not heard of the revoke. Returns how many batches were asked to be withdrawn."""
    codes = list(
        GpuBatch.objects.filter(
            job=job, status=GpuBatch.DISPATCHED, started__isnull=True
        ).values_list("code", flat=True)
    )
    if not codes or not settings.GPU_DISPATCH:
        return 0
    try:
        app.control.revoke([gpu_task_id(code) for code in codes])
    except Exception as exc:  # noqa: BLE001 - the broker unreachable: the batch still runs
        log.info("could not withdraw the GPU batches of job %s: %s", job.code, exc)
        return 0
    return len(codes)


@shared_task(name="portal.gpu_batch_taken")
def gpu_batch_taken(batch_id: str, worker: str, error: str = "") -> None:
    """Sent by the GPU worker as it starts a batch, with no worker when it gives it back, and
    with an error when it stopped without results, so the job page can tell a batch on the GPU
    from one waiting in line or one that needs an engineer."""
    services.gpu_batch_taken(code=batch_id, worker=worker, error=error)


@shared_task(name="portal.results_record")
def results_record(results: dict) -> None:
    try:
        services.results_record(results=results, source="worker")
    except services.ResultsError as exc:
        log.error("results refused: %s", exc)


@shared_task(name="portal.generation_finish")
def generation_finish(generation_id: int) -> None:
    generation = Generation.objects.select_related("job").filter(pk=generation_id).first()
    if generation is not None:
        services.generation_finish(generation=generation)


def _fail(job: Job, reason: str) -> None:
    with transaction.atomic():
        job.claim(Job.ACTIVE, Job.FAILED, stop_reason=reason[:300], finished=timezone.now())


@shared_task(name="portal.requeue_stuck")
def requeue_stuck(older_than_s: int | None = None) -> int:
    """Send again the task of every active job that has not moved for STUCK_AFTER_S seconds.

    The embedded filesystem transport is at-most-once: a message taken by a worker that died is
    lost. Every task is idempotent, so sending one twice costs only a little work. A batch out
    to a GPU is not re-sent here (GPU time is dear, and an air-gapped batch waits by design);
    `manage.py requeue_stuck --gpu` re-sends those."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s or settings.STUCK_AFTER_S)
    sent = 0
    stuck = Job.objects.filter(status__in=Job.ACTIVE, updated__lt=cutoff)
    for job in stuck:
        sent += requeue_job(job)
    return sent


def requeue_job(job: Job, *, gpu: bool = False) -> int:
    if job.status == Job.QUEUED:
        job_start.delay(job.pk)
        return 1
    generation = job.generations.filter(index=job.current_generation).first()
    if generation is None:
        return 0
    sent = 0
    if generation.status == Generation.PROPOSING:
        generation_propose.delay(generation.pk)
        sent += 1
    elif generation.status == Generation.BUILDING:
        for candidate_id in generation.candidates.filter(status=Candidate.PROPOSED).values_list(
            "pk", flat=True
        ):
            candidate_build.delay(candidate_id)
            sent += 1
        if not sent:
            gpu_batch_dispatch.delay(generation.pk)
            sent += 1
    elif generation.status == Generation.GPU:
        batch = generation.batches.first()
        if batch is None or batch.status == GpuBatch.RECORDED:
            generation_finish.delay(generation.pk)
            sent += 1
        elif gpu:
            send_to_gpu(batch.pk)
            sent += 1
    # Touch the job so the next sweep waits a full period before sending again.
    Job.objects.filter(pk=job.pk).update(updated=timezone.now())
    return sent
