"""Archiving through the JSON API: a finished job leaves the default job list and comes back,
a job still searching is refused with the reason, and the list's filters refuse unknown
values in JSON."""

import pytest
from django.urls import reverse

from portal import services
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


def _auth(user):
    key, _ = services.api_token_create(user=user, name="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _listed(client, user, query=""):
    response = client.get(reverse("api-jobs") + query, **_auth(user))
    assert response.status_code == 200, response.content
    return [j["job"] for j in response.json()["jobs"]]


def test_a_customer_archives_a_finished_job_and_unarchives_it(client, customer, acme_world):
    done = acme_world["approved_job"]
    code = str(done.code)
    assert code in _listed(client, customer)
    response = client.post(reverse("api-job-archive", args=[code[:8]]), **_auth(customer))
    assert response.status_code == 200, response.content
    assert response.json()["archived"] is not None and response.json()["status"] == "approved"
    assert code not in _listed(client, customer)
    assert code in _listed(client, customer, "?show=archived")
    assert code in _listed(client, customer, "?show=all")
    # Archived, the job is whole: its answer and its results still come.
    assert client.get(reverse("api-job", args=[code]), **_auth(customer)).status_code == 200
    assert client.get(reverse("api-results", args=[code]), **_auth(customer)).status_code == 200

    response = client.post(reverse("api-job-unarchive", args=[code]), **_auth(customer))
    assert response.status_code == 200 and response.json()["archived"] is None
    assert code in _listed(client, customer)
    verbs = list(AuditEvent.objects.filter(actor=customer).values_list("verb", flat=True))
    assert verbs.count("job.archive") == 1 and verbs.count("job.restore") == 1


def test_a_job_still_searching_is_not_archived_and_the_reason_is_given(
    client, customer, acme_world
):
    running = acme_world["job"]
    response = client.post(reverse("api-job-archive", args=[running.code]), **_auth(customer))
    assert response.status_code == 409
    assert "still searching" in response.json()["error"]
    running.refresh_from_db()
    assert running.archived is None


def test_archiving_twice_or_unarchiving_a_current_job_is_409(client, customer, acme_world):
    code = acme_world["approved_job"].code
    unarchive = client.post(reverse("api-job-unarchive", args=[code]), **_auth(customer))
    assert unarchive.status_code == 409 and "not archived" in unarchive.json()["error"]
    first = client.post(reverse("api-job-archive", args=[code]), **_auth(customer))
    assert first.status_code == 200
    again = client.post(reverse("api-job-archive", args=[code]), **_auth(customer))
    assert again.status_code == 409 and "archived already" in again.json()["error"]
    assert AuditEvent.objects.filter(verb="job.archive").count() == 1


def test_another_organisations_job_cannot_be_archived(client, outsider, acme_world):
    code = acme_world["approved_job"].code
    for name in ("api-job-archive", "api-job-unarchive"):
        response = client.post(reverse(name, args=[code]), **_auth(outsider))
        assert response.status_code == 404 and response["Content-Type"] == "application/json"
    acme_world["approved_job"].refresh_from_db()
    assert acme_world["approved_job"].archived is None


def test_archive_takes_post_only(client, customer, acme_world):
    code = acme_world["approved_job"].code
    response = client.get(reverse("api-job-archive", args=[code]), **_auth(customer))
    assert response.status_code == 405 and response["Allow"] == "POST"


@pytest.mark.parametrize(
    "query, field",
    [("?show=hidden", "show"), ("?status=finished", "status"), ("?q=" + "x" * 101, "q")],
)
def test_unknown_job_list_filters_are_a_json_400(client, customer, acme_world, query, field):
    response = client.get(reverse("api-jobs") + query, **_auth(customer))
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert [f for f, _ in response.json()["errors"]] == [field]


def test_the_job_list_searches_and_filters_by_status(client, customer, acme_world):
    running, done = str(acme_world["job"].code), str(acme_world["approved_job"].code)
    assert _listed(client, customer, "?status=active") == [running]
    assert _listed(client, customer, "?status=approved") == [done]
    assert set(_listed(client, customer, "?q=acme-softmax")) == {running, done}
    assert _listed(client, customer, "?q=nothing-like-it") == []
