"""The home, workload, job (with live progress), candidate and token pages."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.delivery import decide_and_deliver
from portal.models import Candidate, GpuBatch, Job
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_in_review(orgs[0], customer, failing=(2,))


def test_the_home_page_answers_200_for_a_customer_and_an_engineer(
    client, customer, engineer, review_job
):
    client.force_login(customer)
    page = client.get(reverse("web-home"))
    assert page.status_code == 200 and "softmax" in page.content.decode()
    client.force_login(engineer)
    page = client.get(reverse("web-home"))
    assert page.status_code == 200
    assert reverse("web-review", args=[review_job.code]) in page.content.decode()


def test_the_login_page_renders_and_logs_a_customer_in(client, customer):
    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass"})
    assert response.status_code == 302
    assert client.get(reverse("web-home")).status_code == 200


def test_the_job_page_shows_progress_charts_and_the_speedup(client, customer, review_job):
    client.force_login(customer)
    response = client.get(reverse("web-job", args=[review_job.code]))
    assert response.status_code == 200
    charts = response.context["charts"]
    assert set(charts) == {"generations", "baselines", "bandwidth", "correctness"}
    assert all(charts.values())
    html = response.content.decode()
    assert "/static/vendor/plotly.min.js" in html
    # every script and stylesheet from this server: none from a CDN (the page's random CSRF
    # token may spell "cdn", so the addresses are what is checked)
    sources = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sources and not [u for u in sources if u.startswith(("http:", "https:", "//"))]
    assert "2.00×" in html or "1.9" in html  # torch_compile at 2x base, best candidate at base
    assert response.context["candidates"].paginator.count == 3
    # each candidate's kernel by its name (the layout's tag), its writer's note on hover
    best = Candidate.objects.get(pk=review_job.best_candidate_id)
    assert best.entry and f">{best.entry}</td>" in html
    assert 'id="gpu-queue"' not in html  # done with the GPU: no queue to stand in


def test_the_progress_fragment_polls_while_the_job_runs(client, customer, review_job):
    Job.objects.filter(pk=review_job.pk).update(status=Job.RUNNING, stage=Job.STAGE_PROPOSING)
    client.force_login(customer)
    response = client.get(reverse("web-job-progress", args=[review_job.code]))
    assert response.status_code == 200
    assert 'hx-trigger="every 1s"' in response.content.decode()


def test_the_progress_fragment_stops_polling_with_286_when_the_job_is_done(
    client, customer, review_job
):
    client.force_login(customer)
    response = client.get(reverse("web-job-progress", args=[review_job.code]) + "?live=1")
    assert response.status_code == 286
    assert "hx-trigger" not in response.content.decode()
    # Drawn while the job ran: reload once so the charts appear.
    assert response["HX-Refresh"] == "true"


def test_the_progress_poll_tells_the_page_to_fetch_its_charts_and_candidates_when_they_change(
    client, customer, review_job
):
    Job.objects.filter(pk=review_job.pk).update(status=Job.RUNNING, stage=Job.STAGE_PROPOSING)
    waiting = Candidate.objects.filter(job=review_job, status=Candidate.FAILED)
    waiting.update(status=Candidate.COMPILED)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[review_job.code]))
    live = page.context["live"]
    html = page.content.decode()
    assert 'hx-trigger="charts-stale from:body"' in html
    assert 'hx-trigger="candidates-stale from:body"' in html
    progress = reverse("web-job-progress", args=[review_job.code])
    poll = f"{progress}?live=1&charts={live['charts']}&candidates={live['candidates']}"
    assert f"charts={live['charts']}&amp;candidates={live['candidates']}" in html
    unchanged = client.get(poll)
    assert unchanged.status_code == 200 and "HX-Trigger" not in unchanged
    # Compiled, then sent to the GPU: still "in flight", but the table's status column changed.
    Candidate.objects.filter(job=review_job, status=Candidate.COMPILED).update(
        status=Candidate.QUEUED
    )
    assert client.get(poll)["HX-Trigger"] == "candidates-stale"
    # A candidate of the job fails on the GPU: its table changes, its charts do not.
    Candidate.objects.filter(job=review_job, status=Candidate.PASSED).exclude(
        pk=review_job.best_candidate_id
    ).update(status=Candidate.FAILED)
    assert client.get(poll)["HX-Trigger"] == "candidates-stale"
    # A generation more, and another best kernel: both.
    other = Candidate.objects.filter(job=review_job).exclude(pk=review_job.best_candidate_id)
    Job.objects.filter(pk=review_job.pk).update(best_candidate=other.first())
    assert client.get(poll)["HX-Trigger"] == "charts-stale, candidates-stale"
    # What the page then fetches: the parts alone, drawn as they are now.
    charts = client.get(reverse("web-job-charts", args=[review_job.code]))
    assert charts.status_code == 200 and 'id="charts"' in charts.content.decode()
    assert "<html" not in charts.content.decode()
    table = client.get(reverse("web-job-candidates", args=[review_job.code]) + "?page=1")
    body = table.content.decode()
    assert table.status_code == 200 and 'id="candidates"' in body and "<html" not in body
    assert str(other.first().code)[:8] in body and "best" in body


def _waiting_on_the_gpu(job):
    """`job` as it stands once its batch has been sent to the GPU queue, not yet recorded."""
    from portal.models import GpuBatch

    GpuBatch.objects.filter(job=job).update(status=GpuBatch.DISPATCHED, dispatched=timezone.now())
    Job.objects.filter(pk=job.pk).update(status=Job.WAITING_GPU)
    return GpuBatch.objects.get(job=job)


def _queue(client, job):
    response = client.get(reverse("web-job-progress", args=[job.code]))
    return response.context["progress"]["gpu_queue"], response.content.decode()


def test_a_sent_batch_waits_in_line_until_a_gpu_worker_says_it_took_it(
    client, customer, engineer, orgs, review_job
):
    from portal import services, tasks

    batch = _waiting_on_the_gpu(review_job)
    other = job_in_review(orgs[0], customer)
    _waiting_on_the_gpu(other)
    client.force_login(customer)
    queue, html = _queue(client, review_job)
    assert (queue["waiting"], queue["running"], queue["position"]) == (2, 0, 1)
    assert not queue["mine_running"] and "Yours is number 1 in line." in html
    # No GPU worker has ever taken a batch here: the page says so rather than "on the GPU".
    assert queue["idle"] and "No GPU worker has taken a batch from this queue yet" in html
    assert "on the GPU now" not in html

    tasks.gpu_batch_taken(str(batch.code), "gpu0@h200-host")
    queue, html = _queue(client, review_job)
    assert (queue["waiting"], queue["running"], queue["position"]) == (1, 1, None)
    assert queue["mine_running"] and not queue["idle"]
    assert "Yours is on the GPU now" in html and "h200-host" not in html  # customers: no hosts
    assert "(for under a minute)" in html  # not "0 minutes"
    GpuBatch.objects.filter(pk=batch.pk).update(started=timezone.now() - timedelta(minutes=3))
    assert "(for 3\xa0minutes)" in _queue(client, review_job)[1]
    assert _queue(client, other)[0]["position"] == 1
    client.force_login(engineer)
    assert "on gpu0@h200-host" in _queue(client, review_job)[1]
    for user, worker in ((engineer, "gpu0@h200-host"), (customer, None)):
        key, _ = services.api_token_create(user=user, name="queue")
        api = client.get(
            reverse("api-job", args=[review_job.code]), HTTP_AUTHORIZATION=f"Bearer {key}"
        ).json()["gpu_queue"]
        assert api["mine_running"] and api["mine_started"] and api.get("mine_worker") == worker

    # Given back unrun (its host had no usable GPU): in line again.
    services.gpu_batch_taken(code=str(batch.code), worker="")
    assert _queue(client, review_job)[0]["position"] == 1
    # Stopped without results (a worker bug): not waiting, not running; engineers see why.
    services.gpu_batch_taken(code=str(batch.code), worker="gpu0@h200-host", error="TypeError: x")
    queue, html = _queue(client, review_job)
    assert (queue["position"], queue["mine_running"], queue["mine_error"]) == (
        None,
        False,
        "TypeError: x",
    )
    assert "stopped without results" in html and "TypeError: x" in html
    assert "send it again from this page" in html
    client.force_login(customer)
    html = _queue(client, review_job)[1]
    assert "stopped without results" in html and "TypeError" not in html
    # A cancelled job's batch that no worker took is out of the line; one on a GPU holds it.
    services.job_cancel(job=other, user=customer)
    assert _queue(client, review_job)[0]["waiting"] == 0
    tasks.gpu_batch_taken(str(GpuBatch.objects.get(job=other).code), "gpu1@h200-host")
    assert _queue(client, review_job)[0]["running"] == 1
    # A late word about a batch already recorded changes nothing.
    GpuBatch.objects.filter(pk=batch.pk).update(status=GpuBatch.RECORDED)
    assert not services.gpu_batch_taken(code=str(batch.code), worker="gpu1@elsewhere")


def test_an_engineer_sends_a_stopped_batch_to_the_gpu_queue_again(
    client, customer, engineer, review_job, settings, django_capture_on_commit_callbacks
):
    from portal import services
    from portal.celery import GPU_TASK_NAME, app
    from portal.models import AuditEvent

    settings.GPU_DISPATCH = True
    batch = _waiting_on_the_gpu(review_job)
    services.gpu_batch_taken(code=str(batch.code), worker="gpu0@h200-host", error="TypeError: x")
    resend = reverse("web-job-resend", args=[review_job.code])
    job_page = reverse("web-job", args=[review_job.code])
    client.force_login(customer)
    assert 'id="resend"' not in client.get(job_page).content.decode()
    assert client.post(resend).status_code == 404  # engineers only
    client.force_login(engineer)
    assert 'id="resend"' in client.get(job_page).content.decode()

    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(f"gpu.{batch.arch}")
        queue.clear()
        with django_capture_on_commit_callbacks(execute=True):
            page = client.post(resend, follow=True).content.decode()
        assert "is back in the GPU queue" in page
        message = queue.get(timeout=10)  # the real broker holds the batch for a GPU worker
        message.ack()
        queue.close()
    assert message.headers["task"] == GPU_TASK_NAME
    assert message.headers["id"] == f"gpu-batch-{batch.code}"  # what a cancel revokes
    assert message.payload[0][0]["batch_id"] == str(batch.code)
    batch.refresh_from_db()
    assert (batch.status, batch.error, batch.worker, batch.started) == (
        GpuBatch.DISPATCHED,
        "",
        "",
        None,
    )
    assert AuditEvent.objects.filter(verb="gpu_batch.resend", actor=engineer).count() == 1

    # While a worker says it is running the batch, it is not sent twice.
    services.gpu_batch_taken(code=str(batch.code), worker="gpu0@h200-host")
    with django_capture_on_commit_callbacks(execute=True) as sent:
        page = client.post(resend, follow=True).content.decode()
    assert "is on gpu0@h200-host now" in page and not sent
    assert AuditEvent.objects.filter(verb="gpu_batch.resend").count() == 1

    # A job that stopped needs no GPU time: its batch is not sent again.
    services.gpu_batch_taken(code=str(batch.code), worker="gpu0@h200-host", error="lost")
    Job.objects.filter(pk=review_job.pk).update(status=Job.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True) as sent:
        page = client.post(resend, follow=True).content.decode()
    assert "The job is cancelled: it needs no GPU time." in page and not sent
    assert 'id="resend"' not in page  # nor offered


def test_a_batch_back_from_the_gpu_is_shown_as_being_recorded(client, customer, review_job):
    batch = _waiting_on_the_gpu(review_job)
    # results_record has stored the batch; generation_finish has not yet moved the job on
    GpuBatch.objects.filter(pk=batch.pk).update(status=GpuBatch.RECORDED)
    Job.objects.filter(pk=review_job.pk).update(stage=Job.STAGE_RECORDING)
    client.force_login(customer)
    html = _queue(client, review_job)[1]
    assert "Yours is back from the GPU; its results are being recorded." in html
    assert "waiting for results" not in html


def test_without_gpu_dispatch_the_page_says_the_batch_waits_for_a_results_file(
    client, customer, review_job, settings
):
    settings.GPU_DISPATCH = False
    _waiting_on_the_gpu(review_job)
    client.force_login(customer)
    queue, html = _queue(client, review_job)
    assert queue["position"] == 1 and not queue["dispatch"]
    assert "Yours waits for a results file" in html
    assert "No GPU worker has taken" not in html  # nothing is sent to a worker by design


def test_the_candidate_page_shows_lineage_compile_verification_and_timing(
    client, engineer, review_job
):
    client.force_login(engineer)
    best = review_job.best_candidate
    response = client.get(reverse("web-candidate", args=[best.code]))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="ln">1<' in html  # PTX with line numbers
    assert "held out" in html and "benchmarked" in html
    assert "variant 0" in html  # what changed
    assert len(response.context["timings"]) == 2
    assert "not ranked (no fitted model yet)" in html
    Candidate.objects.filter(pk=best.pk).update(predicted_us=42.5)
    html = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert "42.50 µs predicted before the GPU" in html
    assert "compile cache" not in html
    Candidate.objects.filter(pk=best.pk).update(
        compile_report={**best.compile_report, "compile_ms": 61.25, "cached": True}
    )
    html = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert "61.2 ms" in html and "Read from the compile cache" in html
    assert html.index("61.2 ms") < html.index('id="compile-cached"')


def test_a_customer_reads_the_ptx_only_once_it_is_approved(client, customer, engineer, review_job):
    best = review_job.best_candidate
    client.force_login(customer)
    assert not client.get(reverse("web-candidate", args=[best.code])).context["show_ptx"]
    decide_and_deliver(
        job=review_job, reviewer=engineer, decision="approve", comment="", checklist={}
    )
    assert client.get(reverse("web-candidate", args=[best.code])).context["show_ptx"]


def test_the_workload_page_shows_the_spec_and_the_latest_jobs_progress(
    client, customer, review_job
):
    client.force_login(customer)
    response = client.get(reverse("web-workload", args=[review_job.workload.code]))
    assert response.status_code == 200
    assert response.context["latest"] == review_job


def test_a_customer_creates_and_revokes_an_api_token(client, customer):
    from portal.models import ApiToken

    client.force_login(customer)
    response = client.post(reverse("web-tokens"), {"name": "laptop"})
    key = response.context["new_key"]
    assert key.startswith("ptxf_") and ApiToken.lookup(key).user == customer
    token = ApiToken.objects.get(user=customer)
    client.post(reverse("web-token-delete", args=[token.code]))
    assert ApiToken.lookup(key) is None


@pytest.mark.parametrize(
    "status, stage, expected",
    [
        (Job.QUEUED, "", ["current", "", "", "", "", ""]),
        (Job.RUNNING, Job.STAGE_BUILDING, ["done", "done", "current", "", "", ""]),
        (Job.WAITING_GPU, Job.STAGE_GPU, ["done", "done", "done", "current", "", ""]),
        (Job.REVIEW, Job.STAGE_DONE, ["done", "done", "done", "done", "current", ""]),
        (Job.APPROVED, Job.STAGE_DONE, ["done"] * 6),
        (Job.REJECTED, Job.STAGE_DONE, ["done", "done", "done", "done", "failed", ""]),
        (Job.FAILED, Job.STAGE_PROPOSING, ["done", "failed", "", "", "", ""]),
    ],
)
def test_the_stage_timeline_marks_done_current_and_failed_steps(status, stage, expected):
    from portal.selectors import stage_steps

    assert [s["state"] for s in stage_steps(Job(status=status, stage=stage))] == expected


def _rank_again(job):
    """The cost model's rank correlation, stored again as generation_finish stores it."""
    from portal import services

    for generation in job.generations.all():
        generation.model_rho = services.costmodel_rho(job=job, generation=generation)
        generation.save(update_fields=["model_rho"])
    Job.objects.filter(pk=job.pk).update(model_rho=services.costmodel_rho(job=job))
    job.refresh_from_db()


def test_the_job_page_tracks_how_well_the_cost_model_ranked_the_candidates(
    client, customer, orgs, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, candidates=4)  # measured 10, 11, 12, 13 us
    # the model ranked three of them in the right order and swapped none; one it never ranked
    for c, predicted in zip(
        job.candidates.order_by("score_us"), (5.0, 6.0, 9.0, None), strict=True
    ):
        Candidate.objects.filter(pk=c.pk).update(predicted_us=predicted)
    _rank_again(job)  # as generation_finish does when the results land
    client.force_login(customer)
    response = client.get(reverse("web-job", args=[job.code]))
    assert response.status_code == 200
    rows = response.context["progress"]["generations"]
    assert rows[0]["model_rho"] == pytest.approx(1.0)
    assert 'Cost model <span style="text-transform:none">ρ</span>' in response.content.decode()
    assert "rank correlation 1.00" in response.context["charts"]["costmodel"]

    Candidate.objects.filter(pk=job.candidates.order_by("score_us")[0].pk).update(predicted_us=20.0)
    _rank_again(job)
    response = client.get(reverse("web-job", args=[job.code]))
    assert response.context["progress"]["generations"][0]["model_rho"] == pytest.approx(-0.5)


def test_without_three_ranked_candidates_the_cost_model_chart_waits(client, customer, review_job):
    client.force_login(customer)
    response = client.get(reverse("web-job", args=[review_job.code]))
    assert "costmodel" not in response.context["charts"]
    assert response.context["progress"]["generations"][0]["model_rho"] is None
    assert "The cost-model chart appears once the model has ranked three verified candidates" in (
        response.content.decode()
    )


def test_health_says_the_database_answers_and_which_local_workers_are_ready(
    client, settings, tmp_path, monkeypatch
):
    monkeypatch.setenv("PTXF_VAR_DIR", str(tmp_path))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cpu@host.ready").write_text("1\n")
    body = client.get(reverse("web-health")).json()
    assert body == {"status": "ok", "database": "ok", "workers_ready_here": 1}


def test_the_workload_page_says_when_one_kernel_must_serve_several_row_lengths(
    client, customer, orgs
):
    from factory.spec import catalogue_manifest
    from portal import services

    suite = catalogue_manifest("rmsnorm")  # rows of 4096 and 8192
    one = suite.split("[[shapes]]")[0] + "[[shapes]]\nM = 64\nN = 4096\n"
    client.force_login(customer)
    for manifest, said in ((suite, True), (one, False)):
        wl = services.workload_create(org=orgs[0], user=customer, manifest=manifest)
        response = client.get(reverse("web-workload", args=[wl.code]))
        assert response.context["spec"] is not None
        assert response.context["row_lengths"] == ([4096, 8192] if said else [4096])
        assert ('id="row-lengths"' in response.content.decode()) == said
