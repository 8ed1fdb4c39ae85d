"""Issue 52, the job's progress: the timeline agrees with the GPU queue card, time left always
says something true, and every page counts generations the same way."""

import pytest
from django.urls import reverse

from portal.models import GpuBatch, Job
from tests.portal.web.world import job_between_generations, job_in_review, job_on_the_gpu

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job, _ = job_on_the_gpu(orgs[0], customer, candidates=8)
    return job


def test_a_job_whose_batch_no_gpu_has_taken_does_not_say_it_is_on_the_gpu(
    client, customer, waiting_job
):
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[waiting_job.code])).content.decode()
    assert "0 batches on a GPU" in page
    assert "On the GPU" not in page and "in flight" not in page
    assert "Waiting for a GPU" in page and "8 waiting for a GPU" in page


def test_a_job_whose_batch_a_worker_runs_says_so_in_the_timeline_and_the_card(
    client, customer, waiting_job
):
    from django.utils import timezone

    GpuBatch.objects.filter(job=waiting_job).update(started=timezone.now(), worker="gpu-1")
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[waiting_job.code])).content.decode()
    assert "On the GPU" in page and "Yours is on the GPU now" in page
    assert "8 on the GPU now" in page


def test_time_left_never_stays_at_estimating(client, customer, waiting_job):
    client.force_login(customer)
    page = client.get(reverse("web-job-progress", args=[waiting_job.code])).content.decode()
    assert "estimating" not in page
    assert 'time left: <span class="eta">unknown until a GPU takes the batch</span>' in page


def test_time_left_before_the_first_generation_says_when_it_will_be_known(
    client, customer, waiting_job
):
    Job.objects.filter(pk=waiting_job.pk).update(status=Job.RUNNING, stage=Job.STAGE_PROPOSING)
    client.force_login(customer)
    page = client.get(reverse("web-job-progress", args=[waiting_job.code])).content.decode()
    assert "known after the first generation" in page


def test_home_list_job_page_and_engineer_table_count_generations_the_same_way(
    client, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_between_generations(job_in_review(orgs[0], customer))  # 1 done, budget 4
    waiting, _ = job_on_the_gpu(orgs[0], customer, name="other")  # 0 done, budget 1
    client.force_login(customer)
    home = client.get(reverse("web-home")).content.decode()
    assert 'class="generations-done"' in home
    assert ">1 of 4</span>" in home and ">0 of 1</span>" in home
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "Generations done: <span" in page and ">1 of 4</span>" in page
    client.force_login(engineer)
    home = client.get(reverse("web-home")).content.decode()
    table = home.split("Waiting for GPU results", 1)[1].split("</table>", 1)[0]
    assert ">0 of 1</span>" in table
    assert reverse("web-job", args=[waiting.code]) in table
