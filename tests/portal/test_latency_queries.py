"""The API's results answer costs the same number of queries whatever the number of candidates
(a deferred column read per candidate made it 2,000 queries for a 2,000-candidate job)."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal import services
from portal.models import Candidate, Generation, sha256_hex
from tests.portal.conftest import SIMPLE_PTX, make_world_for


def _queries(client, url, key):
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    return len(ctx.captured_queries)


def test_the_results_answer_does_not_query_per_candidate(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = make_world_for(orgs[0], customer, "acme-many")["job"]
    generation = Generation.objects.get(job=job, index=0)
    key, _ = services.api_token_create(user=customer, name="t")
    url = reverse("api-results", args=[job.code])

    def add(n):
        start = Candidate.objects.count()
        Candidate.objects.bulk_create(
            Candidate(job=job, generation=generation, ptx=SIMPLE_PTX, ptx_sha256=sha256_hex(f"{i}"))
            for i in range(start, start + n)
        )

    add(5)
    few = _queries(client, url, key)
    add(40)
    many = _queries(client, url, key)
    assert many <= few + 2  # not one a candidate (40 more were added)
    body = client.get(url, HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert len(body["candidate_results"]) == 46
