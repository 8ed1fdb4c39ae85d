"""The JSON API: bearer tokens, JSON errors with 4xx codes, other organisations' objects 404."""

import json

import pytest
from django.urls import reverse

from portal import services
from portal.artifacts import verify_checksums
from portal.delivery import decide_and_deliver
from tests.portal.web.world import job_between_generations, job_in_review

pytestmark = pytest.mark.django_db


def _auth(user):
    key, _ = services.api_token_create(user=user, name="test")
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@pytest.fixture
def review_job(orgs, customer, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return job_in_review(orgs[0], customer)


def test_a_request_without_a_token_is_401_json(client, review_job):
    response = client.get(reverse("api-job", args=[review_job.code]))
    assert response.status_code == 401
    assert "Bearer" in response.json()["error"]


def test_a_revoked_or_mistyped_token_is_401(client, customer, review_job):
    headers = {"HTTP_AUTHORIZATION": "Bearer ptxf_deadbeef_nope"}
    assert client.get(reverse("api-job", args=[review_job.code]), **headers).status_code == 401


def test_a_customer_polls_their_job(client, customer, review_job):
    response = client.get(reverse("api-job", args=[review_job.code]), **_auth(customer))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "review" and body["done"] is True
    assert body["best_candidate"] == str(review_job.best_candidate.code)


def test_results_carry_verification_timing_baselines_and_speedups(client, customer, review_job):
    body = client.get(reverse("api-results", args=[review_job.code]), **_auth(customer)).json()
    best = body["best"]
    assert len(best["verification"]) == 3 and all(v["passed"] for v in best["verification"])
    assert best["compared_with"] == "torch_compile"
    assert all(s["speedup"] == pytest.approx(2.0) for s in best["speedups"])
    assert body["copy_ceiling_tbps"] == 4.28


def test_results_list_every_candidate_with_its_status_and_reason(
    client, orgs, customer, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path / "media"
    job = job_in_review(orgs[0], customer, candidates=3, failing=(2,))
    body = client.get(reverse("api-results", args=[job.code]), **_auth(customer)).json()
    rows = body["candidate_results"]
    assert [r["candidate"] for r in rows] == [
        str(c.code) for c in job.candidates.order_by("generation__index", "id")
    ]
    assert [r["status"] for r in rows] == ["passed", "passed", "failed"]
    assert rows[2]["reason"] and rows[2]["score_us"] is None
    assert rows[0]["score_us"] == pytest.approx(10.0) and rows[0]["generation"] == 0


def test_a_customer_gets_404_for_every_object_of_another_organisation(
    client, outsider, review_job, acme_world
):
    headers = _auth(outsider)
    urls = [
        reverse("api-job", args=[review_job.code]),
        reverse("api-results", args=[review_job.code]),
        reverse("api-artifact", args=[review_job.code]),
        reverse("api-workload", args=[review_job.workload.code]),
        reverse("api-candidate", args=[review_job.best_candidate.code]),
        reverse("api-artifact", args=[acme_world["approved_job"].code]),
    ]
    for url in urls:
        response = client.get(url, **headers)
        assert response.status_code == 404, url
        body = response.json()
        assert body.pop("request_id")  # the correlation id (portal/middleware.py) differs
        assert body == {"error": "Not found.", "status": 404}


def test_the_artifact_of_an_unapproved_job_is_refused_with_409(client, customer, review_job):
    response = client.get(reverse("api-artifact", args=[review_job.code]), **_auth(customer))
    assert response.status_code == 409
    assert "approved" in response.json()["error"]


def test_an_approved_artifact_downloads_and_its_checksums_verify(
    client, customer, engineer, review_job
):
    decide_and_deliver(
        job=review_job, reviewer=engineer, decision="approve", comment="", checklist={}
    )
    response = client.get(reverse("api-artifact", args=[review_job.code]), **_auth(customer))
    assert response.status_code == 200
    data = b"".join(response.streaming_content)
    assert verify_checksums(data) == []
    import hashlib

    assert response["X-Content-SHA256"] == hashlib.sha256(data).hexdigest()


def test_a_customer_reads_a_candidates_ptx_only_after_approval(
    client, customer, engineer, review_job
):
    url = reverse("api-candidate", args=[review_job.best_candidate.code])
    headers = _auth(customer)
    assert client.get(url, **headers).json()["ptx"] is None
    decide_and_deliver(
        job=review_job, reviewer=engineer, decision="approve", comment="", checklist={}
    )
    assert client.get(url, **headers).json()["ptx"].startswith("//")


def _submit(client, user, body, content_type="application/json"):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return client.post(reverse("api-jobs"), data=data, content_type=content_type, **_auth(user))


@pytest.mark.parametrize(
    "body, content_type, status, field",
    [
        ({"manifest": "x"}, "text/plain", 415, None),
        (b"{not json", "application/json", 400, None),
        (b"\xff\xfe", "application/json", 400, None),
        ([1, 2], "application/json", 400, None),
        ({}, "application/json", 400, "manifest"),
        ({"manifest": "   "}, "application/json", 400, "manifest"),
        ({"manifest": "name = 'x'\x00"}, "application/json", 400, "manifest"),
        ({"manifest": "a" * 70_000}, "application/json", 400, "manifest"),
        (
            {"manifest": "name='x'", "baseline_source": "x", "baseline_filename": "k.exe"},
            "application/json",
            400,
            "baseline_filename",
        ),
        (
            {"manifest": "name='x'", "baseline_source": "\x01bin", "baseline_filename": "k.ptx"},
            "application/json",
            400,
            "baseline_source",
        ),
        ({"manifest": "name='x'", "generations": 0}, "application/json", 400, "generations"),
        ({"manifest": "name='x'", "generations": True}, "application/json", 400, "generations"),
        ({"manifest": "name='x'", "per_row_length": 1}, "application/json", 400, "per_row_length"),
    ],
)
def test_bad_submissions_get_a_json_error_naming_the_field(
    client, customer, body, content_type, status, field
):
    response = _submit(client, customer, body, content_type)
    assert response.status_code == status
    payload = response.json()
    assert payload["error"]
    if field:
        assert field in [f for f, _ in payload["errors"]]


def test_a_huge_body_is_413(client, customer, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = _submit(client, customer, {"manifest": "a" * 5000})
    assert response.status_code == 413


def test_the_wrong_method_is_405_json(client, customer, review_job):
    response = client.delete(reverse("api-job", args=[review_job.code]), **_auth(customer))
    assert response.status_code == 405 and response["Allow"] == "GET"


def test_a_manifest_the_spec_refuses_gets_its_field_errors(client, customer):
    if not hasattr(pytest.importorskip("factory.spec"), "load_manifest"):
        pytest.skip("factory.spec has not landed")
    from portal.models import Job, Workload

    response = _submit(client, customer, {"manifest": 'name = "x"\n[[outputs]]\nname = 1\n'})
    assert response.status_code == 400
    assert response.json()["errors"]
    assert not Workload.objects.exists() and not Job.objects.exists()


def test_the_jobs_list_shows_only_the_customers_organisation(
    client, customer, outsider, review_job
):
    mine = client.get(reverse("api-jobs"), **_auth(customer)).json()["jobs"]
    theirs = client.get(reverse("api-jobs"), **_auth(outsider)).json()["jobs"]
    assert [j["job"] for j in mine] == [str(review_job.code)]
    assert theirs == []


# --- job controls ---------------------------------------------------------------------------------


def test_a_customer_cancels_a_running_job_and_a_second_cancel_is_409(client, customer, acme_world):
    job = acme_world["job"]
    url = reverse("api-job-cancel", args=[job.code])
    response = client.post(url, **_auth(customer))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "cancelled" and body["done"] is True
    assert body["stop_reason"] == "cancelled by alice"
    again = client.post(url, **_auth(customer))
    assert again.status_code == 409 and "nothing to cancel" in again.json()["error"]


def test_stop_sends_the_best_so_far_to_review_or_says_why_not(
    client, customer, acme_world, review_job
):
    refused = client.post(reverse("api-job-stop", args=[acme_world["job"].code]), **_auth(customer))
    assert refused.status_code == 409 and "nothing to review" in refused.json()["error"]
    job_between_generations(review_job)
    response = client.post(reverse("api-job-stop", args=[review_job.code]), **_auth(customer))
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "review" and body["stop_reason"] == "stopped early by alice"
    assert body["best_candidate"] == str(review_job.candidates.order_by("score_us")[0].code)


def test_another_job_on_a_workload_through_the_api(client, customer, review_job):
    url = reverse("api-workload-jobs", args=[review_job.workload.code])
    bad = client.post(url, {"generations": 0}, content_type="application/json", **_auth(customer))
    assert bad.status_code == 400 and bad.json()["errors"] == [
        ["generations", "a whole number from 1 to 50"]
    ]
    response = client.post(
        url, {"generations": 2}, content_type="application/json", **_auth(customer)
    )
    assert response.status_code == 201
    body = response.json()
    assert body["workload"] == str(review_job.workload.code)
    assert body["status"] == "queued" and body["max_generations"] == 2
    # The new job is queued (searching): a third one waits for it.
    third = client.post(url, **_auth(customer))
    assert third.status_code == 409 and "still searching" in third.json()["error"]
    assert review_job.workload.jobs.count() == 2


def test_job_controls_of_another_organisation_are_404_and_change_nothing(
    client, outsider, acme_world
):
    job = acme_world["job"]
    headers = _auth(outsider)
    for name in ("api-job-cancel", "api-job-stop"):
        assert client.post(reverse(name, args=[job.code]), **headers).status_code == 404
    url = reverse("api-workload-jobs", args=[acme_world["workload"].code])
    assert client.post(url, **headers).status_code == 404
    job.refresh_from_db()
    assert job.status == "running" and acme_world["workload"].jobs.count() == 2
    assert client.get(reverse("api-job-cancel", args=[job.code]), **headers).status_code == 405


def test_the_api_root_lists_every_endpoint_and_each_one_answers_its_method(client, customer):
    import uuid

    from django.urls import resolve

    root = reverse("api-root")
    body = client.get(root, **_auth(customer)).json()
    listed = body["endpoints"]
    assert len(listed) == 15
    for key in listed:
        method, path = key.split(" ")
        for word in ("JOB", "WORKLOAD", "CANDIDATE", "INVITATION"):
            path = path.replace(word, str(uuid.uuid4()))
        match = resolve(root + path)
        assert match.url_name.startswith("api-"), key
        # The method the root names is the one the view takes (an unknown id is a 404, an
        # empty submission a 415 and the invitations, to a customer, a 403; never a 405).
        response = client.generic(method, root + path, **_auth(customer))
        assert response.status_code in (200, 403, 404, 415), (key, response.status_code)
        assert response.status_code != 403 or path.startswith("invitations/"), key
