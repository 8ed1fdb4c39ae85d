"""Job controls on the job and workload pages: cancel a job, stop its search early and send the
best verified kernel so far to review, start another job on a stored workload."""

import re

import pytest
from django.urls import reverse

from portal import charts, services
from portal.models import AuditEvent, Candidate, Generation, Job
from tests.portal.web.world import job_between_generations, job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def running_with_results(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_between_generations(job_in_review(orgs[0], customer, failing=(0,)))


def test_a_customer_cancels_their_running_job(client, customer, acme_world):
    job = acme_world["job"]
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert 'id="cancel"' in page
    response = client.post(reverse("web-job-cancel", args=[job.code]), follow=True)
    job.refresh_from_db()
    assert job.status == Job.CANCELLED and job.finished is not None
    assert job.stop_reason == "cancelled by alice"
    assert AuditEvent.objects.filter(verb="job.cancel", target=f"job:{job.code}").exists()
    page = response.content.decode()
    assert "The job is cancelled" in page
    assert 'id="cancel"' not in page and 'id="stop"' not in page
    assert "1 not run" in page and "in flight" not in page  # its proposed candidate
    assert ">stopped</span>" in page and "Proposing" not in page  # its unfinished generation
    # How far it got (nothing of its budget), not a full bar as for a search that ran its course
    assert '<div class="progress stopped">' in page and re.search(r"of \d+</span>\s+·\s+0%", page)
    assert ">Not run</span>" in page and ">Proposed</span>" not in page  # in the table too


def test_stop_is_offered_only_once_a_kernel_has_passed(
    client, customer, acme_world, running_with_results
):
    client.force_login(customer)
    fresh = client.get(reverse("web-job", args=[acme_world["job"].code])).content.decode()
    assert 'id="cancel"' in fresh and 'id="stop"' not in fresh
    timed = client.get(reverse("web-job", args=[running_with_results.code])).content.decode()
    assert 'id="cancel"' in timed and 'id="stop"' in timed


def test_stopping_early_sends_the_fastest_verified_kernel_to_review(
    client, customer, engineer, running_with_results
):
    job = running_with_results
    client.force_login(customer)
    response = client.post(reverse("web-job-stop", args=[job.code]), follow=True)
    job.refresh_from_db()
    assert job.status == Job.REVIEW and job.stage == Job.STAGE_DONE
    assert job.stop_reason == "stopped early by alice"
    # Candidate 0 failed on the GPU; candidate 1 is the fastest that passed.
    passed = job.candidates.filter(status=Candidate.PASSED).order_by("score_us")
    assert job.best_candidate == passed.first() and job.best_candidate.note == "variant 1"
    assert "up for review" in response.content.decode()
    client.force_login(engineer)
    queue = client.get(reverse("web-review-queue")).content.decode()
    assert str(job.code)[:8] in queue


def test_stopping_before_any_kernel_passed_is_refused_with_the_reason(client, customer, acme_world):
    job = acme_world["job"]
    client.force_login(customer)
    response = client.post(reverse("web-job-stop", args=[job.code]), follow=True)
    assert "nothing to review" in response.content.decode()
    job.refresh_from_db()
    assert job.status == Job.RUNNING and job.stop_reason == ""


def test_a_finished_job_cannot_be_cancelled_or_stopped(client, customer, acme_world):
    job = acme_world["approved_job"]
    client.force_login(customer)
    page = client.post(reverse("web-job-cancel", args=[job.code]), follow=True)
    assert "nothing to cancel" in page.content.decode()
    page = client.post(reverse("web-job-stop", args=[job.code]), follow=True)
    assert "not searching" in page.content.decode()
    job.refresh_from_db()
    assert job.status == Job.APPROVED


def test_an_outsider_cannot_touch_another_organisations_job(client, outsider, acme_world):
    job = acme_world["job"]
    client.force_login(outsider)
    for name in ("web-job-cancel", "web-job-stop"):
        assert client.post(reverse(name, args=[job.code])).status_code == 404
    rerun = client.post(reverse("web-workload-rerun", args=[acme_world["workload"].code]))
    assert rerun.status_code == 404
    job.refresh_from_db()
    assert job.status == Job.RUNNING
    assert acme_world["workload"].jobs.count() == 2


def test_controls_take_post_only(client, customer, acme_world):
    client.force_login(customer)
    job = acme_world["job"]
    assert client.get(reverse("web-job-cancel", args=[job.code])).status_code == 405
    assert client.get(reverse("web-job-stop", args=[job.code])).status_code == 405
    job.refresh_from_db()
    assert job.status == Job.RUNNING


def test_a_cancelled_jobs_late_build_compiles_nothing(customer, acme_world):
    job, candidate = acme_world["job"], acme_world["candidate"]
    assert services.job_cancel(job=job, user=customer)
    candidate.refresh_from_db()
    assert services.candidate_build(candidate=candidate) is False
    candidate.refresh_from_db()
    assert candidate.status == Candidate.PROPOSED and candidate.compile_report in ({}, None)


def test_another_job_on_a_workload_starts_with_the_budget_asked_for(
    client, customer, orgs, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = tmp_path / "media"
    done = job_in_review(orgs[0], customer)
    workload = done.workload
    client.force_login(customer)
    page = client.get(reverse("web-workload", args=[workload.code])).content.decode()
    assert 'id="rerun"' in page
    with django_capture_on_commit_callbacks() as queued:
        response = client.post(
            reverse("web-workload-rerun", args=[workload.code]), {"generations": "3"}
        )
    new = workload.jobs.exclude(pk=done.pk).get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "web-job", args=[new.code]
    )
    assert new.status == Job.QUEUED and new.max_generations == 3 and new.created_by == customer
    assert len(queued) == 1  # the job's start, sent once the transaction commits


def test_another_job_waits_until_the_workloads_running_job_stops(client, customer, acme_world):
    workload = acme_world["workload"]
    client.force_login(customer)
    page = client.get(reverse("web-workload", args=[workload.code])).content.decode()
    assert 'id="rerun"' not in page  # its latest job is still searching
    response = client.post(reverse("web-workload-rerun", args=[workload.code]), follow=True)
    assert "still searching" in response.content.decode()
    assert workload.jobs.count() == 2


def test_a_rerun_budget_out_of_range_is_refused(client, customer, orgs, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    workload = job_in_review(orgs[0], customer).workload
    client.force_login(customer)
    response = client.post(
        reverse("web-workload-rerun", args=[workload.code]), {"generations": "99"}, follow=True
    )
    assert "Generations:" in response.content.decode()
    assert workload.jobs.count() == 1


def test_a_batch_that_lands_after_its_job_was_cancelled_is_kept_as_evidence(
    customer, orgs, settings, tmp_path, django_capture_on_commit_callbacks
):
    from portal.celery import app
    from portal.evidence_store import DbEvidenceStore
    from tests.portal.web.world import job_on_the_gpu

    settings.MEDIA_ROOT = tmp_path / "media"
    job, results = job_on_the_gpu(orgs[0], customer)
    assert services.job_cancel(job=job, user=customer)
    app.conf.task_always_eager = True  # generation_finish runs here, on commit
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.results_record(results=results)
    finally:
        app.conf.task_always_eager = False
    job.refresh_from_db()
    assert job.status == Job.CANCELLED and job.best_candidate is None
    assert job.generations.get().status == Generation.DONE
    assert job.candidates.filter(status=Candidate.PASSED).count() == 3
    kept = [
        r for r in DbEvidenceStore().query(family=job.workload.family) if r["job"] == str(job.code)
    ]
    assert len({r["ptx_sha256"] for r in kept}) == 3  # each candidate, at each shape
    assert len(kept) == 6 and all(r["status"] == "passed" for r in kept)


def test_a_faster_kernel_landing_after_an_early_stop_becomes_the_one_to_review(
    client, customer, engineer, orgs, settings, tmp_path
):
    from tests.portal.web.world import batch_on_the_gpu

    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_between_generations(job_in_review(orgs[0], customer))  # gen 0: 10, 11, 12 us
    late = Generation.objects.get(job=job, index=1)
    Generation.objects.filter(pk=late.pk).update(status=Generation.GPU)
    results = batch_on_the_gpu(late, base_us=5.0)  # gen 1 on a GPU: 5, 6, 7 us
    services.job_stop_early(job=job, user=customer)
    job.refresh_from_db()
    stopped_best = job.best_candidate
    assert stopped_best.note == "variant 0"

    client.force_login(engineer)
    page = client.get(reverse("web-review", args=[job.code]))
    shown = str(page.context["candidate"].code)
    assert shown == str(stopped_best.code) and f'name="candidate" value="{shown}"' in (
        page.content.decode()
    )
    services.results_record(results=results)
    services.generation_finish(generation=Generation.objects.get(pk=late.pk))
    job.refresh_from_db()
    assert job.status == Job.REVIEW and job.best_candidate.note == "g1 v0"
    assert AuditEvent.objects.filter(verb="job.best", target=f"job:{job.code}").exists()

    # The engineer decides on the page they read: refused, and shown the new best.
    response = client.post(
        reverse("web-review", args=[job.code]),
        {"decision": "approve", "comment": "looked at it", "candidate": shown},
    )
    assert response.status_code == 409
    assert "The best kernel changed while you read" in response.content.decode()
    assert response.context["candidate"] == job.best_candidate
    job.refresh_from_db()
    assert job.status == Job.REVIEW and not job.reviews.exists()


def test_a_slower_late_batch_leaves_the_kernel_under_review_alone(
    customer, orgs, settings, tmp_path
):
    from tests.portal.web.world import batch_on_the_gpu

    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_between_generations(job_in_review(orgs[0], customer))
    late = Generation.objects.get(job=job, index=1)
    Generation.objects.filter(pk=late.pk).update(status=Generation.GPU)
    results = batch_on_the_gpu(late, base_us=50.0)
    services.job_stop_early(job=job, user=customer)
    best = Job.objects.get(pk=job.pk).best_candidate
    services.results_record(results=results)
    services.generation_finish(generation=Generation.objects.get(pk=late.pk))
    job.refresh_from_db()
    assert job.best_candidate == best and job.status == Job.REVIEW
    assert not AuditEvent.objects.filter(verb="job.best").exists()


def test_the_workload_page_compares_its_jobs_best_kernels_once_two_are_timed(
    client, customer, orgs, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    first = job_in_review(orgs[0], customer)  # best 10 us
    client.force_login(customer)
    url = reverse("web-workload", args=[first.workload.code])
    assert 'id="jobs-chart"' not in client.get(url).content.decode()  # one job: its own page
    second = job_in_review(orgs[0], customer, base_us=7.0)
    Job.objects.filter(pk=second.pk).update(workload=first.workload)
    page = client.get(url).content.decode()
    assert 'id="jobs-chart"' in page and "vendor/plotly.min.js" in page
    figure = charts.jobs_figure(
        [
            {"job": str(first.code)[:8], "best_us": 10.0, "status": "In review"},
            {"job": "nothing", "best_us": None, "status": "Cancelled"},
            {"job": str(second.code)[:8], "best_us": 7.0, "status": "In review"},
        ]
    )
    (bars,) = figure["data"]
    assert bars["x"] == [str(first.code)[:8], str(second.code)[:8]] and bars["y"] == [10.0, 7.0]
    # The page's chart: both jobs, oldest first, with their best times.
    drawn = re.search(r'"x":\[("[^]]*")\],"y":\[([^]]*)\]', page)
    assert drawn.group(1) == f'"{str(first.code)[:8]}","{str(second.code)[:8]}"'
    assert [float(y) for y in drawn.group(2).split(",")] == pytest.approx([10.0, 7.0])


def test_a_customer_takes_every_time_away_as_csv(
    client, customer, outsider, orgs, settings, tmp_path
):
    import csv
    import io

    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, failing=(2,))
    Candidate.objects.filter(job=job, note="variant 2").update(reason="=HYPERLINK(x)")
    client.force_login(customer)
    assert 'id="results-csv"' in client.get(reverse("web-job", args=[job.code])).content.decode()
    response = client.get(reverse("web-job-results-csv", args=[job.code]))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert f"job-{str(job.code)[:8]}-results.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    fastest = job.best_candidate
    mine = [r for r in rows if r["candidate"] == str(fastest.code)]
    assert sorted(r["shape"] for r in mine) == ["M=4096 N=4096", "M=64 N=1024"]
    assert all(float(r["median_us"]) == pytest.approx(10.0) for r in mine)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["median_us"] == ""
    assert failed[0]["reason"] == "'=HYPERLINK(x)"  # text in a spreadsheet, not a formula
    assert {r["made_by"] for r in rows if r["candidate"] == "torch_compile"} == {"baseline"}
    client.force_login(outsider)
    assert client.get(reverse("web-job-results-csv", args=[job.code])).status_code == 404
