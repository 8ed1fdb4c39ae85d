"""Issue 52: the 8-character codes the pages and `ptxf` show work in the API `ptxf` calls;
an ambiguous prefix is a 404, never a guess."""

import uuid

import pytest
from django.urls import reverse

from portal import services
from portal.models import Job
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


def _auth(user):
    key, _ = services.api_token_create(user=user, name="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_in_review(orgs[0], customer)


def test_the_api_finds_a_job_by_the_first_eight_characters_of_its_code(
    client, customer, review_job
):
    short = str(review_job.code)[:8]
    response = client.get(f"/api/v1/jobs/{short}/", **_auth(customer))
    assert response.status_code == 200, response.content
    assert response.json()["job"] == str(review_job.code)
    results = client.get(f"/api/v1/jobs/{short}/results/", **_auth(customer))
    assert results.status_code == 200


def test_a_candidate_and_a_workload_are_found_by_their_short_codes_too(
    client, customer, review_job
):
    headers = _auth(customer)
    c = review_job.best_candidate
    assert client.get(f"/api/v1/candidates/{str(c.code)[:8]}/", **headers).status_code == 200
    w = review_job.workload
    assert client.get(f"/api/v1/workloads/{str(w.code)[:10]}/", **headers).status_code == 200


def test_a_prefix_shorter_than_eight_characters_names_nothing(client, customer, review_job):
    response = client.get(f"/api/v1/jobs/{str(review_job.code)[:7]}/", **_auth(customer))
    assert response.status_code == 404


def test_a_prefix_two_jobs_share_is_a_404(client, customer, review_job):
    twin = Job.objects.get(pk=review_job.pk)
    shared = str(review_job.code)[:8]
    twin.pk = None
    twin.code = uuid.UUID(shared + "0" * 24)
    twin.best_candidate = None
    twin.save()
    response = client.get(f"/api/v1/jobs/{shared}/", **_auth(customer))
    assert response.status_code == 404
    assert "ambiguous" in response.json()["error"]
    # The full code still names each one.
    assert client.get(f"/api/v1/jobs/{review_job.code}/", **_auth(customer)).status_code == 200


def test_another_organisations_job_is_not_found_by_its_short_code(client, outsider, review_job):
    response = client.get(f"/api/v1/jobs/{str(review_job.code)[:8]}/", **_auth(outsider))
    assert response.status_code == 404


def test_reverse_still_builds_api_urls_from_full_codes(review_job):
    assert reverse("api-job", args=[review_job.code]).endswith(f"/{review_job.code}/")


def test_a_prefix_longer_than_eight_digits_is_matched_with_or_without_its_hyphens(
    client, customer, review_job
):
    code = str(review_job.code)
    for prefix in (code[:13], code[:13].replace("-", ""), code[:20]):
        response = client.get(f"/api/v1/jobs/{prefix}/", **_auth(customer))
        assert response.status_code == 200, prefix
