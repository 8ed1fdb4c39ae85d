"""Recording GPU results: idempotent, complete, and what moves a job to review."""

import uuid

import pytest

from portal import services
from portal.models import (
    BaselineMeasurement,
    Candidate,
    Environment,
    Flag,
    Generation,
    GpuBatch,
    Job,
    ReviewDecision,
    TimingResult,
    VerificationResult,
)
from tests.portal.results_files import results_for

SHAPES = [{"M": 64, "N": 1024}, {"M": 4096, "N": 4096}]
HELDOUT = [{"M": 1, "N": 4095}]


@pytest.fixture
def dispatched(acme_world, settings):
    """The Acme job with two queued candidates in a batch out to the GPU."""
    settings.GPU_DISPATCH = False
    job = acme_world["job"]
    generation = acme_world["candidate"].generation
    second = Candidate.objects.create(
        job=job, generation=generation, ptx="// other", ptx_sha256="b" * 64
    )
    Candidate.objects.filter(job=job).update(status=Candidate.QUEUED)
    Generation.objects.filter(pk=generation.pk).update(status=Generation.GPU)
    Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU, max_generations=1)
    code = uuid.uuid4()
    batch = GpuBatch.objects.create(
        code=code,
        job=job,
        generation=generation,
        status=GpuBatch.DISPATCHED,
        batch={
            "format": 1,
            "batch_id": str(code),
            "shapes": SHAPES,
            "heldout_shapes": HELDOUT,
            "candidates": [
                {"id": str(acme_world["candidate"].code)},
                {"id": str(second.code)},
            ],
        },
    )
    return batch


def counts():
    return [
        m.objects.count()
        for m in (VerificationResult, TimingResult, Flag, BaselineMeasurement, Environment)
    ]


def test_a_results_file_records_verification_timing_flags_and_baselines(dispatched):
    failing = {dispatched.batch["candidates"][1]["id"]}
    services.results_record(results=results_for(dispatched.batch, failing=failing))
    dispatched.refresh_from_db()
    assert dispatched.status == GpuBatch.RECORDED
    passed, failed = dispatched.generation.candidates.order_by("pk")
    assert (passed.status, failed.status) == (Candidate.PASSED, Candidate.FAILED)
    assert passed.verifications.count() == 3 and passed.timings.count() == 2
    assert passed.score_us == pytest.approx(10.0)
    assert failed.reason == "wrong at M=1,N=4095" and failed.flags.count() == 1
    assert BaselineMeasurement.objects.get().timings.count() == 2
    assert TimingResult.objects.filter(environment__gpu="NVIDIA H200").count() == 4


def test_recording_the_same_results_twice_makes_nothing_twice(
    dispatched, django_capture_on_commit_callbacks
):
    results = results_for(dispatched.batch)
    services.results_record(results=results)
    before = counts()
    with django_capture_on_commit_callbacks() as callbacks:
        services.results_record(results=results)
    assert counts() == before
    assert callbacks == []  # the second delivery queues nothing either


def test_a_results_file_for_an_unknown_batch_is_refused(dispatched):
    results = results_for(dispatched.batch)
    results["batch_id"] = str(uuid.uuid4())
    with pytest.raises(services.ResultsError, match="no batch"):
        services.results_record(results=results)
    with pytest.raises(services.ResultsError, match="format 1"):
        services.results_record(results={"format": 2})


def test_the_last_generation_sends_the_job_to_review_with_its_best_candidate(dispatched):
    services.results_record(results=results_for(dispatched.batch))
    services.generation_finish(generation=dispatched.generation)
    job = Job.objects.get(pk=dispatched.job_id)
    assert job.status == Job.REVIEW
    assert job.best_candidate.score_us == pytest.approx(10.0)
    assert job.stop_reason.startswith("budget")
    # A redelivered finish does nothing.
    assert services.generation_finish(generation=dispatched.generation) is None


def test_an_engineer_approves_and_a_customer_may_not(dispatched, customer, engineer):
    from django.core.exceptions import PermissionDenied

    services.results_record(results=results_for(dispatched.batch))
    services.generation_finish(generation=dispatched.generation)
    job = Job.objects.get(pk=dispatched.job_id)
    with pytest.raises(PermissionDenied):
        services.review_decide(job=job, reviewer=customer, decision="approve")
    services.review_decide(job=job, reviewer=engineer, decision="approve", comment="ok")
    job.refresh_from_db()
    assert job.status == Job.APPROVED
    assert ReviewDecision.objects.get().reviewer == engineer


def test_evidence_records_come_from_the_database_in_the_loop_format(dispatched):
    from factory.evidence import RECORD_KEYS
    from portal.evidence_store import DbEvidenceStore

    failing = {dispatched.batch["candidates"][1]["id"]}
    services.results_record(results=results_for(dispatched.batch, failing=failing))
    records = DbEvidenceStore().query(job=str(dispatched.job.code))
    assert len(records) == 3  # two timed shapes of the passed one, one record of the other
    assert all(set(r) == set(RECORD_KEYS) for r in records)
    timed = [r for r in records if r["median_us"] is not None]
    assert {r["status"] for r in timed} == {"passed"}
    assert {tuple(sorted(r["dims"].items())) for r in timed} == {
        tuple(sorted(d.items())) for d in SHAPES
    }


def test_the_gpu_task_tells_the_portal_it_took_the_batch_before_running_it(dispatched, monkeypatch):
    """The GPU host's task (run eagerly here; the GPU run itself is replaced, there is no GPU on
    this machine) marks the batch taken before it runs, and given back when the host has none."""
    import gpuworker
    import portal.tasks  # noqa: F401 - registers the portal's tasks, as a worker's start does
    from gpuworker.runner import NoGpu
    from portal.celery import app, gpu_run_batch

    monkeypatch.setattr(app.conf, "task_always_eager", True)
    seen = []

    def run_batch(batch):
        row = GpuBatch.objects.get(code=batch["batch_id"])
        seen.append((row.started is not None, row.worker))
        return {"batch_id": batch["batch_id"]}

    monkeypatch.setattr(gpuworker, "run_batch", run_batch)
    assert gpu_run_batch.apply(args=(dispatched.batch,)).get() == {
        "batch_id": dispatched.batch["batch_id"]
    }
    assert len(seen) == 1 and seen[0][0] and seen[0][1]  # taken, by this worker's hostname

    def no_gpu(batch):
        raise NoGpu("no NVIDIA driver")

    monkeypatch.setattr(gpuworker, "run_batch", no_gpu)
    monkeypatch.setattr(gpu_run_batch, "max_retries", 0)
    with pytest.raises(NoGpu):
        gpu_run_batch.apply(args=(dispatched.batch,)).get()
    dispatched.refresh_from_db()  # no tries left (max_retries 0): it waits for an engineer
    assert dispatched.started is None and dispatched.error.startswith("NoGpu: no NVIDIA driver")
    monkeypatch.setattr(gpu_run_batch, "max_retries", 3)
    from celery.exceptions import Retry

    with pytest.raises(Retry):  # given back, to be tried again
        gpu_run_batch.apply(args=(dispatched.batch,), retries=1)
    dispatched.refresh_from_db()
    assert dispatched.started is None and dispatched.worker == "" and not dispatched.error

    def broken(batch):
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(gpuworker, "run_batch", broken)
    with pytest.raises(RuntimeError):
        gpu_run_batch.apply(args=(dispatched.batch,)).get()
    dispatched.refresh_from_db()  # no results will come: the page must not say "on the GPU"
    assert dispatched.started is None and dispatched.error == "RuntimeError: a bug in the worker"
