"""Nobody sees another organisation's objects through the pages: they are 404, exactly like
objects that do not exist. Customers cannot reach the review pages."""

import uuid

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def _pages_for(world):
    return [
        reverse("web-workload", args=[world["workload"].code]),
        reverse("web-job", args=[world["job"].code]),
        reverse("web-job-progress", args=[world["job"].code]),
        reverse("web-job-charts", args=[world["job"].code]),
        reverse("web-job-candidates", args=[world["job"].code]),
        reverse("web-job", args=[world["approved_job"].code]),
        reverse("web-candidate", args=[world["candidate"].code]),
        reverse("web-artifact-download", args=[world["approved_job"].code]),
    ]


def test_a_customer_gets_404_for_every_object_of_another_organisation(
    client, customer, acme_world, globex_world
):
    client.force_login(customer)
    for url in _pages_for(globex_world):
        assert client.get(url).status_code == 404, url


def test_a_customer_sees_their_own_organisations_pages(client, customer, acme_world):
    client.force_login(customer)
    for url in _pages_for(acme_world)[:-1]:
        assert client.get(url).status_code in (200, 286), url


def test_an_unknown_code_is_404_like_another_organisations(client, customer, acme_world):
    client.force_login(customer)
    assert client.get(reverse("web-job", args=[uuid.uuid4()])).status_code == 404
    assert client.get("/jobs/not-a-uuid/").status_code == 404


def test_a_customer_cannot_reach_the_review_pages(client, customer, acme_world):
    client.force_login(customer)
    assert client.get(reverse("web-review-queue")).status_code == 404
    assert client.get(reverse("web-review", args=[acme_world["job"].code])).status_code == 404
    response = client.post(
        reverse("web-review", args=[acme_world["job"].code]),
        {"decision": "approve", "comment": "looks fine to me"},
    )
    assert response.status_code == 404


def test_an_engineer_sees_every_organisations_jobs(client, engineer, globex_world):
    client.force_login(engineer)
    assert client.get(reverse("web-job", args=[globex_world["job"].code])).status_code == 200


def test_pages_ask_an_anonymous_visitor_to_log_in(client, acme_world):
    for url in _pages_for(acme_world) + [reverse("web-home"), reverse("web-upload")]:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
