"""The job pipeline end to end without a GPU: a catalogue operator goes from upload to "waiting
for GPU results", then to review once a results file is imported. Tasks run eagerly here (the
same task functions the workers run, in order, on commit); the real agents, generator, compiler
and reviewer do the work."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command

from portal import services, tasks
from portal.celery import app
from portal.models import (
    Candidate,
    Generation,
    GpuBatch,
    Job,
    TimingResult,
    VerificationResult,
)
from tests.portal.results_files import rebase_recorded, results_for

# Recorded on an H200 with `python -m gpuworker run fixtures/softmax_batch.json` (the batch this
# pipeline makes for softmax with population 4 and seed 7, baselines cut to torch eager/compile).
RECORDED = Path(__file__).resolve().parent / "fixtures" / "softmax_h200.json"


@pytest.fixture
def eager(settings):
    settings.GPU_DISPATCH = False  # no GPU here: batches wait for an imported results file
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def catalogue_manifest(name):
    spec = pytest.importorskip("factory.spec")
    if not hasattr(spec, "catalogue_manifest"):
        pytest.skip("factory.spec has no catalogue yet")
    return spec.catalogue_manifest(name)


@pytest.fixture
def upload(customer, orgs, eager, django_capture_on_commit_callbacks):
    def upload(name="softmax", **budget):
        manifest = catalogue_manifest(name)
        with django_capture_on_commit_callbacks(execute=True):
            workload = services.workload_create(org=orgs[0], user=customer, manifest=manifest)
            job = services.job_create(
                workload=workload,
                user=customer,
                max_generations=budget.get("max_generations", 1),
                population=budget.get("population", 4),
                seed=7,
            )
        job.refresh_from_db()
        return job

    return upload


def pipeline_counts(job):
    return (
        Generation.objects.filter(job=job).count(),
        Candidate.objects.filter(job=job).count(),
        GpuBatch.objects.filter(job=job).count(),
        VerificationResult.objects.filter(candidate__job=job).count(),
        TimingResult.objects.filter(candidate__job=job).count(),
    )


def test_a_catalogue_job_reaches_waiting_for_gpu_results_without_a_gpu(upload):
    job = upload()
    assert job.status == Job.WAITING_GPU, job.stop_reason
    batch = job.batches.get()
    assert batch.status == GpuBatch.DISPATCHED
    assert batch.batch["format"] == 1 and batch.batch["batch_id"] == str(batch.code)
    queued = set(job.candidates.filter(status=Candidate.QUEUED).values_list("code", flat=True))
    assert {c["id"] for c in batch.batch["candidates"]} == {str(code) for code in queued}
    assert queued, "no candidate survived the build"
    for candidate in job.candidates.all():
        assert candidate.compile_report is not None
        assert candidate.status in (Candidate.QUEUED, Candidate.REJECTED)
        assert candidate.status == Candidate.QUEUED or candidate.reason


def test_importing_the_results_file_sends_the_job_to_review(
    upload, tmp_path, django_capture_on_commit_callbacks
):
    job = upload()
    batch_file = tmp_path / "batch.json"
    call_command("export_batch", str(job.code), "-o", str(batch_file))
    batch = json.loads(batch_file.read_text())
    results_file = tmp_path / "results.json"
    results_file.write_text(json.dumps(results_for(batch)))
    with django_capture_on_commit_callbacks(execute=True):
        call_command("import_results", str(results_file))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.stop_reason
    assert job.best_candidate.status == Candidate.PASSED
    assert job.best_candidate.score_us == pytest.approx(10.0)
    # the review page's audit trail shows that the evidence came in as a carried results file
    from portal.selectors.jobs import job_history

    verbs = [e.verb for e in job_history(job)]
    assert "results.import" in verbs and "job.review" in verbs


def test_importing_the_same_results_twice_records_nothing_twice(
    upload, django_capture_on_commit_callbacks
):
    job = upload()
    results = results_for(job.batches.get().batch)
    with django_capture_on_commit_callbacks(execute=True):
        services.results_import(results=results)
    before = pipeline_counts(job)
    with django_capture_on_commit_callbacks(execute=True):
        services.results_import(results=results)
    assert pipeline_counts(job) == before
    assert Job.objects.get(pk=job.pk).status == Job.REVIEW


def test_every_task_run_again_makes_nothing_twice(upload, django_capture_on_commit_callbacks):
    job = upload()
    before = pipeline_counts(job)
    generation = job.generations.get()
    with django_capture_on_commit_callbacks(execute=True):
        tasks.job_start.apply(args=[job.pk])
        tasks.generation_propose.apply(args=[generation.pk])
        for candidate in job.candidates.all():
            tasks.candidate_build.apply(args=[candidate.pk])
        tasks.gpu_batch_dispatch.apply(args=[generation.pk])
        tasks.requeue_stuck.apply(kwargs={"older_than_s": 0})
    assert pipeline_counts(job) == before
    assert Job.objects.get(pk=job.pk).status == Job.WAITING_GPU


def test_a_second_generation_starts_from_the_first_ones_results(
    upload, django_capture_on_commit_callbacks
):
    job = upload(max_generations=2)
    with django_capture_on_commit_callbacks(execute=True):
        services.results_import(results=results_for(job.batches.get().batch))
    job.refresh_from_db()
    assert job.current_generation == 1
    assert job.status == Job.WAITING_GPU, job.stop_reason
    first, second = job.generations.order_by("index")
    assert first.status == Generation.DONE and first.best_candidate is not None
    # The next generation proposed new kernels (never the same PTX twice in a job).
    assert second.candidates.exists()


def test_a_job_whose_agents_fail_is_failed_with_the_reason(upload, settings):
    settings.FACTORY_PROPOSE = "tests.portal.stages:failing_propose"
    job = upload()
    assert job.status == Job.FAILED
    assert "the model is unavailable" in job.stop_reason


def test_a_job_whose_agents_are_not_installed_is_failed_with_the_reason(upload, settings):
    settings.FACTORY_PROPOSE = "factory.nowhere.propose"
    job = upload()
    assert job.status == Job.FAILED
    assert "not installed" in job.stop_reason


@pytest.mark.skipif(not RECORDED.exists(), reason=f"no H200 recording at {RECORDED}")
def test_a_results_file_recorded_on_an_h200_sends_the_job_to_review(
    upload, django_capture_on_commit_callbacks
):
    job = upload()
    recorded = json.loads(RECORDED.read_text())
    results = rebase_recorded(recorded, job.batches.get().batch)
    with django_capture_on_commit_callbacks(execute=True):
        services.results_import(results=results)
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.stop_reason
    batch = job.batches.get()
    assert batch.environment.gpu.startswith("NVIDIA H200")
    passed = job.candidates.filter(status=Candidate.PASSED)
    assert passed.exists() and job.best_candidate in passed
    assert TimingResult.objects.filter(candidate=job.best_candidate).count() == len(
        batch.batch["shapes"]
    )


def test_a_cancelled_job_sends_nothing_to_the_gpu(
    upload, customer, settings, django_capture_on_commit_callbacks
):
    settings.FACTORY_POPULATION = 4
    job = upload()
    generation = job.generations.get()
    # Rewind to "built, not yet dispatched", cancel, then let the dispatch arrive late.
    job.batches.all().delete()
    Generation.objects.filter(pk=generation.pk).update(status=Generation.BUILDING)
    Job.objects.filter(pk=job.pk).update(status=Job.RUNNING)
    assert services.job_cancel(job=Job.objects.get(pk=job.pk), user=customer)
    with django_capture_on_commit_callbacks(execute=True):
        tasks.gpu_batch_dispatch.apply(args=[generation.pk])
    assert not GpuBatch.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).status == Job.CANCELLED


def test_another_job_on_a_workload_starts_from_the_first_jobs_winner(
    upload, customer, django_capture_on_commit_callbacks
):
    from factory.evidence import schedule_key
    from factory.families.row.ir import lower
    from factory.families.row.schedules import space
    from factory.loop import propose

    first = upload()
    # Make the first job's fastest kernel a layout no job would start from on its own: one of
    # the schedule space that a job without evidence does not propose.
    spec = first.workload.spec()
    fresh = {
        schedule_key(d.schedule)
        for seed in (1, 2, 3)
        for d in propose(spec, generation=0, population=8, evidence=[], seed=seed)
    }
    odd = next(
        s for s in space(lower(spec), list(spec.shapes)) if schedule_key(s.to_dict()) not in fresh
    )
    batch = first.batches.get().batch
    fastest = Candidate.objects.get(code=batch["candidates"][0]["id"])  # results_for: fastest
    Candidate.objects.filter(pk=fastest.pk).update(schedule=odd.to_dict())
    with django_capture_on_commit_callbacks(execute=True):
        services.results_import(results=results_for(batch))
    first.refresh_from_db()
    assert first.status == Job.REVIEW and first.best_candidate == fastest
    winner = schedule_key(odd.to_dict())
    with django_capture_on_commit_callbacks(execute=True):
        again = services.job_rerun(workload=first.workload, user=customer, max_generations=1)
    again.refresh_from_db()
    assert again.status == Job.WAITING_GPU, again.stop_reason
    # The "new job starts from what earlier jobs found" of the workload page: the first job's
    # fastest kernel is among the new job's first proposals.
    proposed = {schedule_key(c.schedule) for c in again.candidates.all()}
    assert winner in proposed
