"""Pages and the API stay up whatever times reached the database (written before the results
schema existed, or by hand): a negative, zero, NaN or infinite median answers a page, not a 500."""

import math

import pytest
from django.test import Client
from django.urls import reverse

from portal import services
from portal.models import BaselineMeasurement, TimingResult
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("bad", [-1.0, 0.0, math.inf])  # (SQLite stores NaN as NULL)
def test_a_bad_stored_median_never_makes_a_page_or_the_api_fail(
    bad, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    TimingResult.objects.filter(candidate=job.best_candidate).update(median_us=bad)
    baseline = BaselineMeasurement.objects.filter(job=job).first()
    TimingResult.objects.filter(baseline_measurement=baseline).update(median_us=bad)

    client = Client(raise_request_exception=False)
    client.force_login(engineer)
    family = job.workload.family
    for url in (
        reverse("web-job", args=[job.code]),
        reverse("web-job-charts", args=[job.code]),
        reverse("web-candidate", args=[job.best_candidate.code]),
        reverse("web-review", args=[job.code]),
        reverse("web-evidence") + f"?family={family}&gpu={job.target_gpu}",
        reverse("web-job-results-csv", args=[job.code]),
    ):
        response = client.get(url)
        assert response.status_code < 500, (url, response.status_code)
    key, _ = services.api_token_create(user=customer, name="t")
    response = client.get(
        reverse("api-results", args=[job.code]), HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 200
