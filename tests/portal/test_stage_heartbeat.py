"""Heartbeats of running stages: a stage stamps its job while it works and clears the stamp when
it ends; the sweep sends a stage that fell silent again, and fails the job with the reason once
it has fallen silent too often; the job page says when the running stage was last heard."""

import re
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal import pipeline, tasks
from portal.models import Candidate, Generation, GpuBatch, Job
from tests.portal.conftest import make_world_for


@pytest.fixture
def world(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return make_world_for(orgs[0], customer, "acme-softmax")


@pytest.fixture
def sent(monkeypatch):
    """The tasks the pipeline queues, as (task name, row id), instead of a broker."""
    queued = []

    class Kept:
        def __init__(self, name):
            self.name = name

        def delay(self, pk):
            queued.append((self.name, pk))

    monkeypatch.setattr(pipeline, "_task", Kept)
    monkeypatch.setattr(pipeline, "send_to_gpu", lambda pk: queued.append(("gpu", pk)))
    return queued


def _silent(job, seconds, what="agents: generation 0", requeues=0):
    Job.objects.filter(pk=job.pk).update(
        heartbeat=timezone.now() - timedelta(seconds=seconds),
        heartbeat_by=what,
        silent_requeues=requeues,
    )


def _proposing(job):
    Job.objects.filter(pk=job.pk).update(current_generation=0)
    Generation.objects.filter(job=job, index=0).update(status=Generation.PROPOSING)
    job.refresh_from_db()
    return job


# --- the stamp ----------------------------------------------------------------------------------


def test_a_stage_stamps_its_job_while_it_works_and_clears_the_stamp_when_it_ends(world):
    job = world["job"]
    with pipeline.heartbeat(job.pk, "compile: candidate 1234abcd"):
        job.refresh_from_db()
        assert job.heartbeat is not None and job.heartbeat_by == "compile: candidate 1234abcd"
        assert (timezone.now() - job.heartbeat).total_seconds() < 5
    job.refresh_from_db()
    assert job.heartbeat is None and job.heartbeat_by == ""


def test_a_stage_that_raises_clears_its_stamp_too(world):
    job = world["job"]
    with pytest.raises(RuntimeError), pipeline.heartbeat(job.pk, "agents: generation 0"):
        raise RuntimeError("the model is unavailable")
    job.refresh_from_db()
    assert job.heartbeat is None


def test_a_stage_that_ends_leaves_the_stamp_of_a_parallel_stage_alone(world):
    job = world["job"]
    with pipeline.heartbeat(job.pk, "compile: candidate aaaa"):
        pipeline.heartbeat_beat(job.pk, "compile: candidate bbbb")  # another build, later
    job.refresh_from_db()
    assert job.heartbeat is not None and job.heartbeat_by == "compile: candidate bbbb"


def test_a_finished_job_is_not_stamped(world):
    job = world["job"]
    Job.objects.filter(pk=job.pk).update(status=Job.CANCELLED)
    assert pipeline.heartbeat_beat(job.pk, "compile: candidate aaaa") is False


@pytest.mark.django_db(transaction=True)
def test_the_stamp_is_renewed_from_a_thread_while_the_work_runs(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-beat")["job"]
    with pipeline.heartbeat(job.pk, "agents: generation 0", every_s=0.05):
        first = Job.objects.get(pk=job.pk).heartbeat
        deadline = time.monotonic() + 10
        while Job.objects.get(pk=job.pk).heartbeat == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Job.objects.get(pk=job.pk).heartbeat > first  # beaten again, the work still running
    assert Job.objects.get(pk=job.pk).heartbeat is None


def test_a_hung_stage_stops_beating_after_its_longest_time(world, monkeypatch):
    beats = []
    monkeypatch.setattr(pipeline, "heartbeat_beat", lambda job_id, what: beats.append(what))
    with pipeline.heartbeat(world["job"].pk, "compile: hung", every_s=0.01, max_s=0.1):
        beaters = [t for t in threading.enumerate() if t.name == "heartbeat compile: hung"]
        assert beaters
        beaters[0].join(timeout=5)  # the thread gives up at max_s although the work goes on
        assert not beaters[0].is_alive()
        counted = len(beats)
        assert 2 <= counted <= 15


# --- the tasks ----------------------------------------------------------------------------------


def test_a_candidate_build_beats_as_the_compile_of_its_candidate(world, monkeypatch):
    candidate, job = world["candidate"], world["job"]
    seen = []

    def build(*, candidate):
        seen.append(Job.objects.get(pk=job.pk).heartbeat_by)

    monkeypatch.setattr(tasks.services, "candidate_build", build)
    tasks.candidate_build(candidate.pk)
    assert seen == [f"compile: candidate {str(candidate.code)[:8]}"]
    assert Job.objects.get(pk=job.pk).heartbeat is None


def test_proposing_a_generation_beats_as_the_agents(world, monkeypatch):
    job = _proposing(world["job"])
    seen = []
    monkeypatch.setattr(
        tasks.services,
        "generation_propose",
        lambda *, generation: seen.append(Job.objects.get(pk=job.pk).heartbeat_by),
    )
    tasks.generation_propose.apply(args=(Generation.objects.get(job=job, index=0).pk,))
    assert seen == ["agents: generation 0"]


def _batch(job):
    generation = Generation.objects.get(job=job, index=0)
    return GpuBatch.objects.create(job=job, generation=generation, status=GpuBatch.DISPATCHED)


def test_a_gpu_batch_beats_while_a_gpu_worker_runs_it_and_stops_when_it_ends(world):
    job = world["job"]
    batch = _batch(job)
    tasks.gpu_batch_taken(str(batch.code), "gpu0@host")
    job.refresh_from_db()
    assert job.heartbeat_by == f"gpu: batch {str(batch.code)[:8]}"  # no host name shown
    _silent(job, 100, job.heartbeat_by)
    tasks.gpu_batch_alive(str(batch.code), "gpu0@host")
    job.refresh_from_db()
    assert (timezone.now() - job.heartbeat).total_seconds() < 5
    tasks.gpu_batch_taken(str(batch.code), "gpu0@host", "RuntimeError: the GPU fell off the bus")
    job.refresh_from_db()
    assert job.heartbeat is None


def test_a_beat_for_a_batch_no_longer_out_or_no_batch_at_all_changes_nothing(world):
    job = world["job"]
    batch = _batch(job)
    GpuBatch.objects.filter(pk=batch.pk).update(status=GpuBatch.RECORDED)
    tasks.gpu_batch_alive(str(batch.code), "gpu0@host")
    tasks.gpu_batch_alive("not-a-batch", "gpu0@host")
    tasks.gpu_batch_alive(str(uuid.uuid4()), "gpu0@host")
    job.refresh_from_db()
    assert job.heartbeat is None


def test_the_gpu_stamp_is_cleared_when_its_results_come_back_even_refused(world):
    job = world["job"]
    batch = _batch(job)
    tasks.gpu_batch_taken(str(batch.code), "gpu0@host")
    tasks.results_record({"batch_id": str(batch.code), "candidates": "nonsense"})
    job.refresh_from_db()
    assert job.heartbeat is None


def test_the_sweep_runs_every_15_seconds_on_the_default_queue():
    from portal.celery import TASK_ROUTES, app

    schedule = app.conf.beat_schedule["heartbeat-sweep"]
    assert schedule["task"] == "portal.heartbeat_sweep" and schedule["schedule"] <= 15
    assert TASK_ROUTES["portal.heartbeat_sweep"] == {"queue": "default"}
    assert TASK_ROUTES["portal.gpu_batch_alive"] == {"queue": "default"}


# --- the sweep ----------------------------------------------------------------------------------


def test_a_stage_silent_too_long_is_sent_again(world, sent, django_capture_on_commit_callbacks):
    job = _proposing(world["job"])
    _silent(job, 60)
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent() == {"requeued": 1, "failed": 0}
    generation = Generation.objects.get(job=job, index=0)
    assert ("portal.generation_propose", generation.pk) in sent
    job.refresh_from_db()
    assert job.status == Job.RUNNING and job.silent_requeues == 1 and job.heartbeat is None


def test_a_silent_compile_sends_the_unbuilt_candidates_again(
    world, sent, django_capture_on_commit_callbacks
):
    job, candidate = world["job"], world["candidate"]
    Job.objects.filter(pk=job.pk).update(current_generation=0)
    Generation.objects.filter(job=job, index=0).update(status=Generation.BUILDING)
    assert candidate.status == Candidate.PROPOSED
    _silent(job, 60, f"compile: candidate {str(candidate.code)[:8]}")
    with django_capture_on_commit_callbacks(execute=True):
        pipeline.sweep_silent()
    assert ("portal.candidate_build", candidate.pk) in sent


def test_a_stage_heard_lately_is_left_alone(world, sent, django_capture_on_commit_callbacks):
    job = _proposing(world["job"])
    _silent(job, 10)
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent() == {"requeued": 0, "failed": 0}
    assert sent == []
    job.refresh_from_db()
    assert job.heartbeat_by == "agents: generation 0"


def test_a_gpu_batch_has_longer_to_speak_and_is_then_sent_to_the_gpu_again(
    world, sent, django_capture_on_commit_callbacks
):
    job = world["job"]
    Job.objects.filter(pk=job.pk).update(current_generation=0, status=Job.WAITING_GPU)
    Generation.objects.filter(job=job, index=0).update(status=Generation.GPU)
    batch = _batch(job)
    _silent(job, 60, f"gpu: batch {str(batch.code)[:8]} on gpu0@host")
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent()["requeued"] == 0  # beats come through the broker
    _silent(job, 400, f"gpu: batch {str(batch.code)[:8]} on gpu0@host")
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent()["requeued"] == 1
    assert ("gpu", batch.pk) in sent


def test_a_stage_silent_again_after_its_requeues_fails_the_job_with_the_reason(
    world, sent, django_capture_on_commit_callbacks, settings
):
    settings.HEARTBEAT_REQUEUES = 2
    job = _proposing(world["job"])
    _silent(job, 120, "agents: generation 0", requeues=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent() == {"requeued": 0, "failed": 1}
    job.refresh_from_db()
    assert job.status == Job.FAILED
    assert job.stop_reason.startswith("agents: generation 0 fell silent (no heartbeat for 120 s)")
    assert "sent again 2 times" in job.stop_reason
    assert sent == []


def test_each_silence_counts_until_a_stage_ends_normally(
    world, sent, django_capture_on_commit_callbacks, settings
):
    settings.HEARTBEAT_REQUEUES = 2
    job = _proposing(world["job"])
    for expected in (1, 2):
        _silent(job, 60, requeues=expected - 1)
        with django_capture_on_commit_callbacks(execute=True):
            pipeline.sweep_silent()
        assert Job.objects.get(pk=job.pk).silent_requeues == expected
    with pipeline.heartbeat(job.pk, "agents: generation 0"):
        pass  # the re-sent stage runs to its end
    assert Job.objects.get(pk=job.pk).silent_requeues == 0


def test_two_sweeps_act_once_on_one_silence(world, sent, django_capture_on_commit_callbacks):
    job = _proposing(world["job"])
    _silent(job, 60)
    stale = Job.objects.get(pk=job.pk)
    with django_capture_on_commit_callbacks(execute=True):
        pipeline.sweep_silent()
    # A second sweep that read the job before the first acted: its claim finds nothing.
    claimed = Job.objects.filter(
        pk=job.pk, heartbeat=stale.heartbeat, silent_requeues=stale.silent_requeues
    ).count()
    assert claimed == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert pipeline.sweep_silent() == {"requeued": 0, "failed": 0}


def test_a_finished_job_with_a_stale_stamp_is_not_swept(world, sent):
    job = world["job"]
    _silent(job, 3600)
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW)
    assert pipeline.sweep_silent() == {"requeued": 0, "failed": 0}


# --- the job page -------------------------------------------------------------------------------


def test_the_job_page_says_when_the_running_stage_was_last_heard(world, client, customer):
    job = world["job"]
    _silent(job, 7, "compile: candidate 1234abcd")
    client.force_login(customer)
    for url in (reverse("web-job", args=[job.code]), reverse("web-job-progress", args=[job.code])):
        html = client.get(url).content.decode()
        assert 'id="heartbeat"' in html
        heard = re.search(r"compile: candidate 1234abcd: last heard (\d+) s ago", html)
        assert heard and 7 <= int(heard.group(1)) < 60  # (a loaded machine renders slowly)


def test_the_job_page_has_no_heartbeat_line_between_stages_or_once_done(world, client, customer):
    job = world["job"]
    client.force_login(customer)
    assert 'id="heartbeat"' not in client.get(reverse("web-job", args=[job.code])).content.decode()
    _silent(job, 7)
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW)
    assert 'id="heartbeat"' not in client.get(reverse("web-job", args=[job.code])).content.decode()


def test_the_gpu_task_sends_heartbeats_while_the_batch_runs_and_none_after(monkeypatch):
    import gpuworker
    import portal.celery as worker_side

    beats = []
    monkeypatch.setattr(worker_side, "GPU_HEARTBEAT_EVERY_S", 0.02)
    monkeypatch.setattr(worker_side, "_tell_portal", lambda *args: None)

    class Sig:
        def __init__(self, name, args, queue):
            self.name, self.args = name, args

        def apply_async(self):
            beats.append((self.name, self.args))

    monkeypatch.setattr(worker_side.app, "signature", Sig)
    batch_id = str(uuid.uuid4())

    def run_batch(batch):
        deadline = time.monotonic() + 10
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"batch_id": batch_id}

    monkeypatch.setattr(gpuworker, "run_batch", run_batch)
    worker_side.gpu_run_batch.apply(args=({"batch_id": batch_id},)).get()
    assert len(beats) >= 3
    assert {name for name, _ in beats} == {"portal.gpu_batch_alive"}
    assert beats[0][1][0] == batch_id
    after = len(beats)
    assert not [t for t in threading.enumerate() if t.name == "gpu heartbeat"]
    assert len(beats) == after  # the beating thread is gone with the batch
