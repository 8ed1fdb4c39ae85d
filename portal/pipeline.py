"""The pipeline's transitions: which task follows which state, in one table.

    job_start -> generation_propose -> candidate_build (each) -> gpu_batch_dispatch
      -> [gpu.<arch>: gpu_run_batch] -> results_record -> generation_finish
      -> generation_propose (next) ... or the job to review.

A service that moves a row into a state calls `advance(row)`; the table says what runs next,
and it is queued when the transaction commits, so a worker never sees a row before it exists.
The stuck-work sweep (`resume`) consults the same table for the rows a job has open, so a lost
message is sent again exactly as the service would have sent it. Every task is idempotent (it
claims its row with a conditional UPDATE and gives up when it does not get it), so sending one
twice costs only a little work.

Tasks take the row's integer id; a GPU batch goes to the queue of its architecture, `gpu.<arch>`,
with `results_record` chained after it on `default` (portal/celery.py routes the rest).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from portal.models import Candidate, Generation, GpuBatch, Job

log = logging.getLogger("portal.pipeline")

SEND_TO_GPU = "gpu.<arch>"  # GPU_TASK_NAME on its architecture's queue, then results_record
WITHDRAW_FROM_GPU = "revoke"  # Celery's revoke of the batches still waiting in a GPU queue


def _builds_done(generation: Generation) -> bool:
    return not generation.candidates.filter(status=Candidate.PROPOSED).exists()


def _no_batch_out(generation: Generation) -> bool:
    """Its batch has been recorded, or it had no survivors to send."""
    return not generation.batches.exclude(status=GpuBatch.RECORDED).exists()


@dataclass(frozen=True)
class Step:
    task: str  # a Celery task name, or SEND_TO_GPU / WITHDRAW_FROM_GPU
    when: Callable | None = None  # a guard on the row: the step waits until it holds
    why: str = ""


# (model, its status) -> what moves it on.
TRANSITIONS: dict[tuple[type, str], Step] = {
    (Job, Job.QUEUED): Step("portal.job_start", why="running, with generation 0"),
    (Generation, Generation.PROPOSING): Step(
        "portal.generation_propose", why="the agents write its candidates"
    ),
    (Candidate, Candidate.PROPOSED): Step(
        "portal.candidate_build", why="nvJitLink and the reviewer"
    ),
    (Generation, Generation.BUILDING): Step(
        "portal.gpu_batch_dispatch", _builds_done, "once no candidate is still proposed"
    ),
    (GpuBatch, GpuBatch.DISPATCHED): Step(
        SEND_TO_GPU, why="verified and timed on a GPU; results_record follows"
    ),
    (Generation, Generation.GPU): Step(
        "portal.generation_finish", _no_batch_out, "once its batch is recorded, or it had none"
    ),
    (Job, Job.CANCELLED): Step(WITHDRAW_FROM_GPU, why="its batches still waiting in line"),
}


def next_step(row) -> Step | None:
    """The step the table names for `row` in its current status (None: nothing follows, or its
    guard does not hold yet)."""
    step = TRANSITIONS.get((type(row), row.status))
    if step is None or (step.when is not None and not step.when(row)):
        return None
    return step


def advance(row) -> str | None:
    """Queue what follows `row`'s current status, when the transaction commits (at once outside
    one). Returns the step's task name, or None when nothing follows."""
    step = next_step(row)
    if step is None:
        return None
    pk = row.pk
    if step.task == SEND_TO_GPU:
        transaction.on_commit(lambda: send_to_gpu(pk))
    elif step.task == WITHDRAW_FROM_GPU:
        transaction.on_commit(lambda: withdraw_gpu_batches(row))
    else:
        name = step.task
        transaction.on_commit(lambda: _task(name).delay(pk))
    return step.task


def _task(name: str):
    from portal import tasks  # noqa: F401 - registers the portal's tasks with the app
    from portal.celery import app

    return app.tasks[name]


def resume(job: Job, *, gpu: bool = False) -> int:
    """Send again what follows each open row of an active job that stopped moving: the job
    itself, its current generation and that generation's unbuilt candidates, and (with `gpu`)
    a batch still out to a GPU, which is otherwise left alone: GPU time is dear, and a batch for
    an air-gapped host waits by design. Returns how many were sent."""
    from django.utils import timezone

    if job.status not in Job.ACTIVE:
        return 0
    rows: list = [job]
    generation = job.generations.filter(index=job.current_generation).first()
    if job.status != Job.QUEUED and generation is not None:
        rows.append(generation)
        if generation.status == Generation.BUILDING:
            rows.extend(generation.candidates.filter(status=Candidate.PROPOSED))
        if gpu:
            rows.extend(generation.batches.filter(status=GpuBatch.DISPATCHED))
    sent = sum(1 for row in rows if advance(row) is not None)
    # Touch the job so the next sweep waits a full period before sending again.
    Job.objects.filter(pk=job.pk).update(updated=timezone.now())
    return sent


# --- the GPU queues -----------------------------------------------------------------------------


def gpu_task_id(batch_code) -> str:
    return f"gpu-batch-{batch_code}"


def send_to_gpu(batch_id: int) -> None:
    """Send a batch that is out to the GPU to its architecture's queue, with results_record
    chained after it. The GPU host runs only `gpu_run_batch`; the results travel back as the
    argument of results_record on the default queue. With GPU_DISPATCH off (air-gapped GPU
    hosts) the batch waits for an imported results file."""
    if not settings.GPU_DISPATCH:
        return
    batch = GpuBatch.objects.filter(pk=batch_id, status=GpuBatch.DISPATCHED).first()
    if batch is None:
        return
    from celery import chain

    from portal.celery import GPU_TASK_NAME, app

    # Sent again (requeue_stuck --gpu, or an engineer's resend): whichever worker had it is
    # presumed gone.
    GpuBatch.objects.filter(pk=batch.pk).update(started=None, worker="", error="")
    gpu = app.signature(
        GPU_TASK_NAME,
        args=(batch.batch,),
        queue=f"gpu.{batch.arch}",
        task_id=gpu_task_id(batch.code),  # by the batch, so that a cancel can withdraw it
    )
    chain(gpu, _task("portal.results_record").s().set(queue="default")).apply_async()


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
    from portal.celery import app

    try:
        app.control.revoke([gpu_task_id(code) for code in codes])
    except Exception as exc:  # noqa: BLE001 - the broker unreachable: the batch still runs
        log.info("could not withdraw the GPU batches of job %s: %s", job.code, exc)
        return 0
    return len(codes)


# --- heartbeats of running stages ---------------------------------------------------------------
#
# A stage that works for a while (the agents writing a generation, a candidate's compile, a batch
# on a GPU) says it is alive every HEARTBEAT_EVERY_S seconds by stamping Job.heartbeat (and what it
# is in heartbeat_by); the stamp is cleared when the stage ends, however it ends. A worker killed
# mid-stage (OOM, SIGKILL, a lost host) stops stamping: `sweep_silent`, run by Celery beat every
# 15 s, finds the stamp older than HEARTBEAT_SILENT_S (HEARTBEAT_GPU_SILENT_S for a GPU batch,
# whose beats travel through the broker) and sends the stage's task again (`resume`). A stage that
# falls silent again after HEARTBEAT_REQUEUES re-queues fails the job with the reason, so a job
# whose work kills its worker every time cannot loop forever; a stage that ends normally forgives
# the earlier silences. A stage waiting in a queue has no heartbeat (the stuck-work sweep sees to
# lost messages); a stage that hangs keeps beating only up to its `max_s`, then falls silent too.

GPU_STAGE = "gpu"  # heartbeat_by of a GPU batch starts with this


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def heartbeat_beat(job_id: int, what: str) -> bool:
    """Stamp the job's heartbeat now, as `what`; False when the job is no longer active."""
    from django.utils import timezone

    return bool(
        Job.objects.filter(pk=job_id, status__in=Job.ACTIVE).update(
            heartbeat=timezone.now(), heartbeat_by=what[:200]
        )
    )


def heartbeat_clear(job_id: int, what: str | None = None) -> bool:
    """The stage `what` ended: clear the heartbeat, unless another stage of the job (a parallel
    compile) stamped it since; with `what` None, whatever stamped it. Clears the count of silent
    re-queues too."""
    rows = Job.objects.filter(pk=job_id)
    if what is not None:
        rows = rows.filter(heartbeat_by=what[:200])
    return bool(rows.update(heartbeat=None, heartbeat_by="", silent_requeues=0))


@contextlib.contextmanager
def heartbeat(job_id: int, what: str, *, every_s: float | None = None, max_s: float = 3600):
    """Around a stage's work: stamp the heartbeat now and then every `every_s` seconds from a
    daemon thread while the work runs (for at most `max_s` seconds, so a hung stage falls
    silent), and clear it when the work ends, by return or by exception."""
    every = every_s or _setting("HEARTBEAT_EVERY_S", 10)
    heartbeat_beat(job_id, what)
    stop = threading.Event()

    def beat_until_stopped() -> None:
        import time

        from django.db import connection

        deadline = time.monotonic() + max_s
        try:
            while not stop.wait(every) and time.monotonic() < deadline:
                try:
                    heartbeat_beat(job_id, what)
                except Exception as exc:  # noqa: BLE001 - a missed beat; the next one may land
                    log.warning("heartbeat of job %s (%s) failed: %s", job_id, what, exc)
        finally:
            connection.close()  # this thread's own database connection

    thread = threading.Thread(target=beat_until_stopped, name=f"heartbeat {what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every + 5)
        heartbeat_clear(job_id, what)


def sweep_silent(now=None) -> dict[str, int]:
    """Re-queue the stages that fell silent, or fail their jobs past HEARTBEAT_REQUEUES. Each
    job is claimed with a conditional UPDATE on the heartbeat it was seen with, so two sweeps
    never act twice on one silence. Returns {"requeued": n, "failed": m}."""
    from datetime import timedelta

    from django.db.models import F, Q
    from django.utils import timezone

    from portal import services

    now = now or timezone.now()
    cpu_cutoff = now - timedelta(seconds=_setting("HEARTBEAT_SILENT_S", 45))
    gpu_cutoff = now - timedelta(seconds=_setting("HEARTBEAT_GPU_SILENT_S", 180))
    limit = int(_setting("HEARTBEAT_REQUEUES", 2))
    silent = Job.objects.filter(status__in=Job.ACTIVE, heartbeat__isnull=False).filter(
        Q(heartbeat__lt=gpu_cutoff)
        | (Q(heartbeat__lt=cpu_cutoff) & ~Q(heartbeat_by__startswith=GPU_STAGE))
    )
    done = {"requeued": 0, "failed": 0}
    for job in silent:
        quiet_s = (now - job.heartbeat).total_seconds()
        what = job.heartbeat_by or "a stage"
        claimed = Job.objects.filter(
            pk=job.pk, heartbeat=job.heartbeat, silent_requeues=job.silent_requeues
        ).update(heartbeat=None, heartbeat_by="", silent_requeues=F("silent_requeues") + 1)
        if not claimed:
            continue  # it beat again, ended, or another sweep took it
        if job.silent_requeues >= limit:
            reason = (
                f"{what} fell silent (no heartbeat for {quiet_s:.0f} s) and had been sent again "
                f"{job.silent_requeues} time{'s' if job.silent_requeues != 1 else ''}: its "
                "worker keeps dying or hanging"
            )
            if services.job_fail(job=job, reason=reason):
                log.error("job %s failed: %s", job.code, reason)
                done["failed"] += 1
            continue
        job.refresh_from_db()
        sent = resume(job, gpu=what.startswith(GPU_STAGE))
        log.warning(
            "job %s: %s silent for %.0f s; re-queued %d task(s) (silence %d of %d allowed)",
            job.code, what, quiet_s, sent, job.silent_requeues, limit,
        )  # fmt: skip
        done["requeued"] += 1
    return done
