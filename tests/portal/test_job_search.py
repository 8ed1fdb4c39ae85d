"""Issue 52: the home page's job list is searched by name, operator and status, a finished job
is archived (gone from the default list, shown under the Archived filter, restorable), and
each job says how its best kernel compares with the best baseline of the same GPU run."""

import re

import pytest
from django.urls import reverse

from portal.derived import speedup_over_best_baseline
from portal.models import AuditEvent, BaselineMeasurement, Job, Workload
from tests.portal.web.world import job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(orgs, customer, outsider, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    made = {
        "layernorm": job_in_review(orgs[0], customer, name="layernorm_big"),
        "softmax": job_in_review(orgs[0], customer, name="attn_softmax", base_us=30.0),
        "rmsnorm": job_on_the_gpu(orgs[0], customer, name="rmsnorm_fused")[0],
        "globex": job_in_review(orgs[1], outsider, name="globex_layernorm"),
    }
    Workload.objects.filter(jobs=made["softmax"]).update(family="softmax")
    Workload.objects.filter(jobs=made["layernorm"]).update(family="layernorm")
    return made


def _rows(client, **params) -> str:
    page = client.get(reverse("web-home"), params).content.decode()
    return page[page.index('id="jobs"') :]


def test_the_search_finds_jobs_by_name_operator_and_status(client, customer, jobs):
    client.force_login(customer)
    every = _rows(client)
    assert "layernorm_big" in every and "attn_softmax" in every and "rmsnorm_fused" in every
    assert "globex_layernorm" not in every  # another organisation's, whatever the search

    by_name = _rows(client, q="fused")
    assert "rmsnorm_fused" in by_name and "layernorm_big" not in by_name
    by_operator = _rows(client, q="softmax")
    assert "attn_softmax" in by_operator and "layernorm_big" not in by_operator
    by_status_word = _rows(client, q="waiting")
    assert "rmsnorm_fused" in by_status_word and "attn_softmax" not in by_status_word
    by_status = _rows(client, status=Job.REVIEW)
    assert "layernorm_big" in by_status and "rmsnorm_fused" not in by_status
    still_searching = _rows(client, status="active")
    assert "rmsnorm_fused" in still_searching and "layernorm_big" not in still_searching
    # every word must match: a name and a status together
    both = _rows(client, q="layernorm review")
    assert "layernorm_big" in both and "attn_softmax" not in both
    assert "globex_layernorm" not in _rows(client, q="globex")
    nothing = _rows(client, q="no-such-operator")
    assert "No job matches" in nothing and "no-such-operator" in nothing


def test_an_engineer_searches_every_organisation_by_its_name(client, engineer, jobs):
    client.force_login(engineer)
    found = _rows(client, q="Globex")
    assert "globex_layernorm" in found and "layernorm_big" not in found


def test_an_unknown_filter_value_is_ignored_not_an_error(client, customer, jobs):
    client.force_login(customer)
    response = client.get(reverse("web-home"), {"status": "<script>", "show": "nope"})
    assert response.status_code == 200
    assert "<script>" not in response.content.decode()
    assert "attn_softmax" in response.content.decode()


def test_archiving_hides_a_job_until_the_archived_filter_and_restore_brings_it_back(
    client, customer, jobs
):
    client.force_login(customer)
    job = jobs["layernorm"]
    response = client.post(reverse("web-job-archive", args=[job.code]), {"next": "/?q=layer#jobs"})
    assert response.status_code == 302 and response["Location"] == "/?q=layer#jobs"
    job.refresh_from_db()
    assert job.archived is not None
    assert AuditEvent.objects.filter(verb="job.archive", target=f"job:{job.code}").exists()

    assert "layernorm_big" not in _rows(client)
    archived = _rows(client, show="archived")
    assert "layernorm_big" in archived and "attn_softmax" not in archived
    assert reverse("web-job-restore", args=[job.code]) in archived
    assert "layernorm_big" in _rows(client, show="all")
    # still whole: its page opens
    assert client.get(reverse("web-job", args=[job.code])).status_code == 200

    client.post(reverse("web-job-restore", args=[job.code]))
    job.refresh_from_db()
    assert job.archived is None
    assert "layernorm_big" in _rows(client)


def test_a_job_still_searching_is_not_archived(client, customer, jobs):
    client.force_login(customer)
    job = jobs["rmsnorm"]
    response = client.post(reverse("web-job-archive", args=[job.code]), follow=True)
    job.refresh_from_db()
    assert job.archived is None
    assert "still searching" in response.content.decode()


def test_another_organisations_job_cannot_be_archived_or_restored(client, outsider, jobs):
    client.force_login(outsider)
    job = jobs["layernorm"]
    assert client.post(reverse("web-job-archive", args=[job.code])).status_code == 404
    assert client.post(reverse("web-job-restore", args=[job.code])).status_code == 404
    job.refresh_from_db()
    assert job.archived is None


def test_the_archive_returns_only_to_a_page_of_this_site(client, customer, jobs):
    client.force_login(customer)
    job = jobs["layernorm"]
    response = client.post(
        reverse("web-job-archive", args=[job.code]), {"next": "https://elsewhere.example/"}
    )
    assert response["Location"] == reverse("web-home")


def test_archive_needs_a_post(client, customer, jobs):
    client.force_login(customer)
    assert client.get(reverse("web-job-archive", args=[jobs["layernorm"].code])).status_code == 405


def _vs_cell(page: str, name: str) -> str:
    row = page[page.index(name) :]
    row = row[: row.index("</tr>")]
    return re.search(r'class="num vs-baseline">(.*?)</td>', row, re.S).group(1)


def test_the_list_shows_the_best_kernel_against_the_best_baseline_of_its_run(
    client, customer, jobs
):
    # job_in_review: the best kernel takes base_us, the one baseline (torch_compile) 2 x base_us
    client.force_login(customer)
    page = _rows(client)
    assert "vs best baseline" in page
    assert "2.00x" in _vs_cell(page, "layernorm_big")
    # a baseline faster than the best kernel: below 1x, in the colour of a bad result
    job = jobs["softmax"]
    measurement = BaselineMeasurement.objects.get(job=job)
    BaselineMeasurement.objects.filter(pk=measurement.pk).update(score_us=20.0)
    assert "0.67x" in _vs_cell(_rows(client), "attn_softmax")  # 20 / 30
    assert "var(--bad)" in _vs_cell(_rows(client), "attn_softmax")
    # no baseline timed: a dash, not a number
    BaselineMeasurement.objects.filter(pk=measurement.pk).update(status="unavailable")
    assert "x" not in _vs_cell(_rows(client), "attn_softmax").replace("–", "")
    # a job without a timed kernel has no ratio
    assert "–" in _vs_cell(_rows(client), "rmsnorm_fused")


def test_a_baseline_of_another_run_is_not_compared_with(client, customer, jobs):
    from portal.models import Generation, GpuBatch

    client.force_login(customer)
    job = jobs["layernorm"]
    # the only baseline measurement moves to a batch of another generation of the job
    other = Generation.objects.create(job=job, index=1, status=Generation.DONE)
    batch = GpuBatch.objects.create(job=job, generation=other, status=GpuBatch.RECORDED)
    BaselineMeasurement.objects.filter(job=job).update(batch=batch)
    assert "2.00x" not in _vs_cell(_rows(client), "layernorm_big")


def test_speedup_over_best_baseline_is_the_fastest_baseline_over_the_kernel():
    assert speedup_over_best_baseline(10.0, [30.0, 20.0, 25.0]) == 2.0
    assert speedup_over_best_baseline(10.0, [5.0]) == 0.5
    assert speedup_over_best_baseline(None, [5.0]) is None
    assert speedup_over_best_baseline(10.0, []) is None
    assert speedup_over_best_baseline(0.0, [5.0]) is None
    assert speedup_over_best_baseline(10.0, [float("nan"), -1.0, 0.0]) is None
    assert speedup_over_best_baseline(10.0, [float("inf"), 40.0]) == 4.0
