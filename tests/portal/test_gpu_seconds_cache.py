"""The job page's GPU-seconds per generation read a recorded batch's times from its results once
(the database unpacks the whole document for two keys), then from the cache; a batch still out
is read every time."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.models import Generation, GpuBatch
from portal.selectors.evidence import generation_gpu_seconds
from tests.portal.conftest import make_world_for


@pytest.fixture
def job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return make_world_for(orgs[0], customer, "acme-gpu-seconds")["job"]


def _results(start, end):
    return {"env": {"started_at": start, "finished_at": end}, "candidates": []}


def _json_reads(queries):
    return sum(1 for q in queries if "started_at" in q["sql"])


def test_a_recorded_batch_is_read_from_its_results_once_then_from_the_cache(job):
    generation = Generation.objects.get(job=job, index=0)
    GpuBatch.objects.create(
        job=job,
        generation=generation,
        status=GpuBatch.RECORDED,
        results=_results("2026-12-07T09:00:00+00:00", "2026-12-07T09:00:42.5+00:00"),
    )
    with CaptureQueriesContext(connection) as first:
        assert generation_gpu_seconds(job) == {0: 42.5}
    with CaptureQueriesContext(connection) as second:
        assert generation_gpu_seconds(job) == {0: 42.5}
    assert _json_reads(first.captured_queries) == 1
    assert _json_reads(second.captured_queries) == 0


def test_a_batch_still_out_is_read_every_time(job):
    generation = Generation.objects.get(job=job, index=0)
    batch = GpuBatch.objects.create(
        job=job, generation=generation, status=GpuBatch.DISPATCHED, results=None
    )
    assert generation_gpu_seconds(job) == {}
    GpuBatch.objects.filter(pk=batch.pk).update(
        results=_results("2026-12-07T09:00:00+00:00", "2026-12-07T09:00:10+00:00")
    )
    with CaptureQueriesContext(connection) as again:
        assert generation_gpu_seconds(job) == {0: 10.0}
    assert _json_reads(again.captured_queries) == 1
