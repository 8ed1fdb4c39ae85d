"""Customers see only their organisation's rows; engineers see the review queue."""

import pytest

from portal import selectors
from portal.models import Job


def test_a_customer_sees_their_own_workloads_jobs_candidates_and_artifacts(
    customer, acme_world, globex_world
):
    assert list(selectors.workload_list(user=customer)) == [acme_world["workload"]]
    assert selectors.job_get(user=customer, code=acme_world["job"].code) == acme_world["job"]
    candidate = acme_world["candidate"]
    assert selectors.candidate_get(user=customer, code=candidate.code) == candidate
    artifact = acme_world["artifact"]
    assert selectors.artifact_get(user=customer, code=artifact.code) == artifact


@pytest.mark.parametrize(
    ("getter", "key"),
    [
        (selectors.workload_get, "workload"),
        (selectors.job_get, "job"),
        (selectors.job_get, "approved_job"),
        (selectors.candidate_get, "candidate"),
        (selectors.artifact_get, "artifact"),
    ],
)
def test_an_outsider_finds_nothing_of_another_organisation(
    getter, key, outsider, acme_world, globex_world
):
    assert getter(user=outsider, code=acme_world[key].code) is None
    assert getter(user=outsider, code=globex_world[key].code) is not None


def test_lists_of_an_outsider_hold_only_their_organisation(outsider, acme_world, globex_world):
    assert set(selectors.job_list(user=outsider)) == {
        globex_world["job"],
        globex_world["approved_job"],
    }
    assert acme_world["candidate"] not in selectors.candidate_list(user=outsider)
    assert list(selectors.artifact_list(user=outsider)) == [globex_world["artifact"]]


def test_a_bad_code_is_not_found_rather_than_an_error(customer, acme_world):
    assert selectors.job_get(user=customer, code="not-a-uuid") is None


def test_an_anonymous_user_sees_nothing(acme_world):
    from django.contrib.auth.models import AnonymousUser

    assert not selectors.workload_list(user=AnonymousUser()).exists()
    assert selectors.job_get(user=AnonymousUser(), code=acme_world["job"].code) is None


def test_artifacts_of_a_job_that_is_not_approved_are_never_listed(customer, acme_world):
    job = acme_world["approved_job"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW)
    assert selectors.artifact_get(user=customer, code=acme_world["artifact"].code) is None


def test_a_customer_has_no_review_queue(customer, acme_world):
    Job.objects.filter(pk=acme_world["job"].pk).update(status=Job.REVIEW)
    assert not selectors.review_queue(user=customer).exists()
    assert not selectors.user_is_engineer(customer)


def test_an_engineer_sees_jobs_in_review_from_every_organisation(
    engineer, acme_world, globex_world
):
    Job.objects.filter(pk__in=[acme_world["job"].pk, globex_world["job"].pk]).update(
        status=Job.REVIEW
    )
    assert set(selectors.review_queue(user=engineer)) == {acme_world["job"], globex_world["job"]}
