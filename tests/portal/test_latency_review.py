"""The review page reads the best kernel's evidence once per charts_version (issue 51); a
decision is always taken on the evidence as the database holds it."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from portal.models import Candidate, Generation, Job, sha256_hex
from tests.portal.conftest import SIMPLE_PTX, make_world_for


def _evidence_reads(client, method: str, url: str, data=None) -> tuple[list[str], object]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(url, data) if method == "post" else client.get(url)
    reads = [
        x["sql"]
        for x in ctx.captured_queries
        if 'FROM "portal_verificationresult"' in x["sql"]
        or 'FROM "portal_timingresult"' in x["sql"]
    ]
    return reads, response


def test_the_review_page_reads_the_evidence_once_per_charts_version(
    client, orgs, customer, engineer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    world = make_world_for(orgs[0], customer, "acme-review-cache")
    job, best = world["job"], world["candidate"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW, best_candidate=best)
    client.force_login(engineer)
    url = reverse("web-review", args=[job.code])
    reads, first = _evidence_reads(client, "get", url)
    assert first.status_code == 200 and reads
    reads, again = _evidence_reads(client, "get", url)
    assert again.status_code == 200 and not reads
    assert again.content.decode().count("Evidence checklist") == 1
    # another baseline asked for is worked out on its own
    reads, _ = _evidence_reads(client, "get", url + "?baseline=torch_eager")
    assert reads
    # a candidate verified since moves the version: read again
    Candidate.objects.create(
        job=job,
        generation=Generation.objects.get(job=job, index=0),
        ptx=SIMPLE_PTX,
        ptx_sha256=sha256_hex("verified since"),
        status=Candidate.PASSED,
        score_us=3.0,
    )
    reads, _ = _evidence_reads(client, "get", url)
    assert reads


def test_a_decision_reads_the_evidence_afresh(client, orgs, customer, engineer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    world = make_world_for(orgs[0], customer, "acme-review-post")
    job, best = world["job"], world["candidate"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW, best_candidate=best)
    client.force_login(engineer)
    url = reverse("web-review", args=[job.code])
    client.get(url)  # the page's evidence is cached now
    reads, response = _evidence_reads(
        client,
        "post",
        url,
        {"decision": "approve", "comment": "", "candidate": str(best.code)},
    )
    assert reads  # the checklist is worked out again for the decision
    # nothing verified: the approval is refused without an override
    assert response.status_code == 400
    job.refresh_from_db()
    assert job.status == Job.REVIEW
