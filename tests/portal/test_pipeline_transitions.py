"""The transitions table in portal/pipeline.py decides which task follows which state: the
services move a row and ask the table, and the stuck-work sweep asks the same table."""

import pytest

from portal import pipeline, services
from portal.models import Candidate, Generation, GpuBatch, Job, Workload, sha256_hex
from tests.portal.conftest import SIMPLE_PTX

pytestmark = pytest.mark.django_db


@pytest.fixture
def committed(django_capture_on_commit_callbacks):
    """Call a function as if in a transaction that then commits: what it queued on commit runs."""

    def run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    return run


@pytest.fixture
def sent(monkeypatch):
    """What the pipeline queued, as (task name, row id), instead of sending it to a broker."""
    log: list[tuple[str, int]] = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def delay(self, pk):
            log.append((self.name, pk))

    monkeypatch.setattr(pipeline, "_task", Recorder)
    monkeypatch.setattr(pipeline, "send_to_gpu", lambda pk: log.append((pipeline.SEND_TO_GPU, pk)))
    monkeypatch.setattr(
        pipeline,
        "withdraw_gpu_batches",
        lambda job: log.append((pipeline.WITHDRAW_FROM_GPU, job.pk)),
    )
    return log


@pytest.fixture
def job(orgs, customer):
    manifest = 'name = "softmax"\n'
    workload = Workload.objects.create(
        org=orgs[0], name="softmax", manifest=manifest, sha256=sha256_hex(manifest)
    )
    return Job.objects.create(workload=workload, status=Job.RUNNING, current_generation=0)


def _candidate(generation, n, status=Candidate.PROPOSED):
    ptx = SIMPLE_PTX.replace("//", f"// {n}", 1)
    return Candidate.objects.create(
        job=generation.job,
        generation=generation,
        ptx=ptx,
        ptx_sha256=sha256_hex(ptx),
        status=status,
    )


def test_every_task_the_table_names_is_a_registered_task_or_a_gpu_send():
    from portal import tasks  # noqa: F401 - registers the tasks
    from portal.celery import app

    for step in pipeline.TRANSITIONS.values():
        assert step.task in app.tasks or step.task in (
            pipeline.SEND_TO_GPU,
            pipeline.WITHDRAW_FROM_GPU,
        ), step


def test_a_new_job_queues_the_task_the_table_names_for_a_queued_job(
    orgs, customer, sent, monkeypatch, django_capture_on_commit_callbacks
):
    manifest = 'name = "softmax"\n'
    workload = Workload.objects.create(
        org=orgs[0], name="softmax", manifest=manifest, sha256=sha256_hex(manifest)
    )
    with django_capture_on_commit_callbacks(execute=True):
        first = services.job_create(workload=workload, user=customer)
    assert sent == [("portal.job_start", first.pk)]

    # The table, not the service, decides: name another task and the service follows it.
    sent.clear()
    monkeypatch.setitem(
        pipeline.TRANSITIONS, (Job, Job.QUEUED), pipeline.Step("portal.generation_finish")
    )
    with django_capture_on_commit_callbacks(execute=True):
        second = services.job_create(workload=workload, user=customer)
    assert sent == [("portal.generation_finish", second.pk)]


def test_nothing_is_queued_before_the_transaction_commits(
    job, sent, django_capture_on_commit_callbacks
):
    generation = Generation.objects.create(job=job, index=0)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert pipeline.advance(generation) == "portal.generation_propose"
    assert sent == [] and len(callbacks) == 1
    callbacks[0]()
    assert sent == [("portal.generation_propose", generation.pk)]


def test_a_generation_goes_to_its_batch_only_when_no_candidate_is_still_proposed(
    job, sent, committed
):
    generation = Generation.objects.create(job=job, index=0, status=Generation.BUILDING)
    waiting = _candidate(generation, 0)
    _candidate(generation, 1, status=Candidate.COMPILED)
    assert committed(pipeline.advance, generation) is None
    assert committed(pipeline.advance, waiting) == "portal.candidate_build"
    Candidate.objects.filter(pk=waiting.pk).update(status=Candidate.REJECTED)
    assert committed(pipeline.advance, generation) == "portal.gpu_batch_dispatch"
    assert sent == [
        ("portal.candidate_build", waiting.pk),
        ("portal.gpu_batch_dispatch", generation.pk),
    ]


def test_a_generation_on_the_gpu_finishes_only_once_its_batch_is_recorded(job, sent, committed):
    generation = Generation.objects.create(job=job, index=0, status=Generation.GPU)
    batch = GpuBatch.objects.create(job=job, generation=generation, status=GpuBatch.DISPATCHED)
    assert committed(pipeline.advance, generation) is None
    assert committed(pipeline.advance, batch) == pipeline.SEND_TO_GPU
    GpuBatch.objects.filter(pk=batch.pk).update(status=GpuBatch.RECORDED)
    assert committed(pipeline.advance, generation) == "portal.generation_finish"
    assert sent == [(pipeline.SEND_TO_GPU, batch.pk), ("portal.generation_finish", generation.pk)]


def test_a_cancelled_job_withdraws_its_batches_and_a_job_in_review_queues_nothing(
    job, sent, committed
):
    assert committed(services.job_cancel, job=job, user=None)
    assert sent == [(pipeline.WITHDRAW_FROM_GPU, job.pk)]
    assert pipeline.next_step(Job(status=Job.REVIEW)) is None


def test_the_sweep_sends_what_the_table_names_for_each_open_row_of_a_stuck_job(
    job, sent, committed
):
    generation = Generation.objects.create(job=job, index=0, status=Generation.BUILDING)
    a, b = _candidate(generation, 0), _candidate(generation, 1)
    assert committed(pipeline.resume, job) == 2
    assert sorted(sent) == sorted(
        [("portal.candidate_build", a.pk), ("portal.candidate_build", b.pk)]
    )

    sent.clear()
    Generation.objects.filter(pk=generation.pk).update(status=Generation.GPU)
    generation.candidates.update(status=Candidate.QUEUED)
    batch = GpuBatch.objects.create(job=job, generation=generation, status=GpuBatch.DISPATCHED)
    assert committed(pipeline.resume, job) == 0  # a batch out to a GPU waits unless asked
    assert committed(pipeline.resume, job, gpu=True) == 1
    assert sent == [(pipeline.SEND_TO_GPU, batch.pk)]


def test_the_sweep_leaves_a_job_that_stopped_alone(job, sent, committed):
    Job.objects.filter(pk=job.pk).update(status=Job.CANCELLED)
    job.refresh_from_db()
    assert committed(pipeline.resume, job, gpu=True) == 0
    assert sent == []
