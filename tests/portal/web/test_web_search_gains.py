"""Issue 53: the job page shows per generation what the search has earned: the best time so
far, the gain over generation 0 and the GPU-seconds spent, from what the GPU worker recorded."""

import pytest
from django.urls import reverse

from portal import derived, services
from portal.models import Generation, GpuBatch
from portal.selectors import generation_rows
from portal.selectors.evidence import generation_gpu_seconds
from tests.portal.web.world import batch_on_the_gpu, job_between_generations, job_on_the_gpu

pytestmark = pytest.mark.django_db


def test_search_gains_keeps_the_best_so_far_and_sums_gpu_seconds():
    rows = [
        {"index": 1, "best_score_us": 12.0, "gpu_s": 30.0},  # worse than generation 0
        {"index": 0, "best_score_us": 10.0, "gpu_s": 60.0},
        {"index": 2, "best_score_us": 8.0, "gpu_s": None},  # no GPU time recorded
        {"index": 3, "best_score_us": None, "gpu_s": 5.0},  # nothing verified
    ]
    out = derived.search_gains(rows)
    assert [r["index"] for r in out] == [0, 1, 2, 3]
    assert [r["best_so_far_us"] for r in out] == [10.0, 10.0, 8.0, 8.0]
    assert [r["gpu_s_total"] for r in out] == [60.0, 90.0, 90.0, 95.0]
    assert out[0]["gain_pct"] == pytest.approx(0.0)
    assert out[1]["gain_pct"] == pytest.approx(0.0)
    assert out[2]["gain_pct"] == pytest.approx(25.0)  # 10 us over 8 us
    assert rows[0] == {"index": 1, "best_score_us": 12.0, "gpu_s": 30.0}  # inputs untouched


def test_no_gain_is_claimed_before_generation_0_has_a_time():
    out = derived.search_gains(
        [{"index": 0, "best_score_us": None, "gpu_s": 1.0}, {"index": 1, "best_score_us": 5.0}]
    )
    assert [r["gain_pct"] for r in out] == [None, None]
    assert out[1]["best_so_far_us"] == 5.0


def _two_generations(orgs, customer):
    """Generation 0 at 10, 11, 12 us, generation 1 at 8, 9, 10 us; each batch's results say
    the worker ran it for 60 s (tests/portal/results_files.ENV)."""
    job, results = job_on_the_gpu(orgs[0], customer, candidates=3, base_us=10.0)
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job = job_between_generations(job)
    job.generations.filter(index=1).update(status=Generation.GPU)
    gen1 = job.generations.get(index=1)
    results1 = batch_on_the_gpu(gen1, candidates=3, base_us=8.0)
    results1["env"]["started_at"] = "2026-12-02T11:00:00+00:00"
    results1["env"]["finished_at"] = "2026-12-02T11:00:45+00:00"
    services.results_record(results=results1)
    services.generation_finish(generation=gen1)
    job.refresh_from_db()
    return job


def test_each_generation_shows_its_gpu_seconds_and_the_gain_so_far(orgs, customer):
    job = _two_generations(orgs, customer)
    assert generation_gpu_seconds(job) == {0: 60.0, 1: 45.0}
    rows = generation_rows(job)
    # generation 2 is being proposed: no GPU time yet, the total stays
    assert [r["gpu_s"] for r in rows] == [60.0, 45.0, None]
    assert [r["gpu_s_total"] for r in rows] == [60.0, 105.0, 105.0]
    assert rows[0]["best_so_far_us"] == pytest.approx(rows[0]["best_score_us"])
    assert rows[1]["best_so_far_us"] == pytest.approx(rows[1]["best_score_us"])
    assert rows[1]["best_so_far_us"] < rows[0]["best_so_far_us"]
    expected = (rows[0]["best_score_us"] / rows[1]["best_score_us"] - 1) * 100
    assert rows[1]["gain_pct"] == pytest.approx(expected)
    assert rows[1]["gain_pct"] > 10


def test_a_batch_without_worker_times_counts_its_taken_to_recorded_span(orgs, customer):
    from datetime import timedelta

    from django.utils import timezone

    job, _ = job_on_the_gpu(orgs[0], customer)
    assert generation_gpu_seconds(job) == {}  # sent, never taken: no GPU time
    start = timezone.now() - timedelta(seconds=100)
    GpuBatch.objects.filter(job=job).update(started=start, finished=start + timedelta(seconds=20))
    assert generation_gpu_seconds(job) == {0: pytest.approx(20.0)}
    GpuBatch.objects.filter(job=job).update(finished=None)  # still on the GPU: up to now
    assert generation_gpu_seconds(job)[0] == pytest.approx(100.0, abs=5.0)


def test_the_job_page_shows_best_so_far_gain_and_gpu_seconds(client, customer, orgs):
    job = _two_generations(orgs, customer)
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "Best so far</th>" in page and "Gain over gen 0</th>" in page
    assert "GPU-s (total)</th>" in page
    rows = generation_rows(job)
    gain = f"+{rows[1]['gain_pct']:.1f}%"
    assert gain in page
    assert "60.0 (60.0)" in page and "45.0 (105.0)" in page
