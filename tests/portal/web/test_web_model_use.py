"""Tokens and cost per job and per candidate, from the agents' usage: stored per generation when
it is proposed, shown on the job and candidate pages and given by the API."""

import pytest
from django.urls import reverse

from portal import services
from portal.models import Candidate, Generation, Job
from tests.portal.web.world import job_in_review

pytestmark = pytest.mark.django_db


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer)
    Generation.objects.filter(job=job, index=0).update(
        usage={"tokens_in": 12000, "tokens_out": 3400, "cost_usd": 0.087, "requests": 3}
    )
    Candidate.objects.filter(job=job).update(tokens_in=3000, tokens_out=1000, cost_usd=0.02)
    return job


def _auth(user):
    key, _ = services.api_token_create(user=user, name="t")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def test_the_job_page_shows_tokens_and_cost_per_job_and_generation(client, customer, review_job):
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[review_job.code])).content.decode()
    card = page.split('id="model-use"', 1)[1]
    assert "<strong>12000</strong> tokens in" in card and "$0.0870" in card
    assert "went to answers that produced no kept kernel" in card


def test_the_candidate_page_shows_its_share(client, customer, review_job):
    client.force_login(customer)
    best = review_job.best_candidate
    page = client.get(reverse("web-candidate", args=[best.code])).content.decode()
    assert "3000 tokens in · 1000 out · $0.0200" in page


def test_the_api_gives_model_use_per_job_and_per_candidate(client, customer, review_job):
    body = client.get(reverse("api-job", args=[review_job.code]), **_auth(customer)).json()
    assert body["usage"]["tokens_in"] == 12000 and body["usage"]["cost_usd"] == 0.087
    assert body["usage"]["by_generation"]["0"]["tokens_in"] == 3 * 3000
    best = review_job.best_candidate
    c = client.get(reverse("api-candidate", args=[best.code]), **_auth(customer)).json()
    assert c["usage"] == {"tokens_in": 3000, "tokens_out": 1000, "cost_usd": 0.02}


def test_an_offline_job_says_its_kernels_cost_no_tokens(client, customer, orgs, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, name="other")
    Job.objects.filter(pk=job.pk).update(backend="offline")
    client.force_login(customer)
    page = client.get(reverse("web-job", args=[job.code])).content.decode()
    assert "offline generator" in page


def test_proposing_a_generation_stores_what_the_agents_spent(orgs, customer, settings, monkeypatch):
    from portal.models import Workload, sha256_hex

    settings.FACTORY_PROPOSE = "tests.portal.web.test_web_model_use:_propose_with_spend"
    monkeypatch.setattr(Workload, "spec", lambda self: None)  # not read by the stub
    manifest = 'name = "x"\n'
    wl = Workload.objects.create(
        org=orgs[0], name="x", manifest=manifest, sha256=sha256_hex(manifest), created_by=customer
    )
    job = Job.objects.create(workload=wl, status=Job.RUNNING, created_by=customer)
    gen = Generation.objects.create(job=job, index=0)
    services.generation_propose(generation=gen)
    gen.refresh_from_db()
    assert gen.usage["tokens_in"] == 500 and gen.usage["requests"] == 2


def _propose_with_spend(workload, **kwargs):
    class Report:
        usage = {"tokens_in": 500, "tokens_out": 40, "cost_usd": 0.01, "requests": 2}

    return [], Report()
