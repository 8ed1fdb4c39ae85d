"""Customers see only their organisation's rows; engineers see the review queue. One helper per
object answers 404 for a row outside the viewer's scope, exactly as for one that does not exist."""

import pytest
from django.http import Http404

from portal import selectors
from portal.models import Job


def test_a_customer_sees_their_own_workloads_jobs_candidates_and_artifacts(
    customer, acme_world, globex_world
):
    assert list(selectors.workload_list(user=customer)) == [acme_world["workload"]]
    job = acme_world["job"]
    assert selectors.get_job_for_user(customer, job.code) == job
    candidate = acme_world["candidate"]
    assert selectors.get_candidate_for_user(customer, candidate.code) == candidate
    assert list(selectors.artifact_list(user=customer)) == [acme_world["artifact"]]


@pytest.mark.parametrize(
    ("getter", "key"),
    [
        (selectors.get_workload_for_user, "workload"),
        (selectors.get_job_for_user, "job"),
        (selectors.get_job_for_user, "approved_job"),
        (selectors.get_candidate_for_user, "candidate"),
    ],
)
def test_an_outsider_finds_nothing_of_another_organisation(
    getter, key, outsider, acme_world, globex_world
):
    with pytest.raises(Http404):
        getter(outsider, acme_world[key].code)
    assert getter(outsider, globex_world[key].code) is not None


def test_lists_of_an_outsider_hold_only_their_organisation(outsider, acme_world, globex_world):
    assert set(selectors.job_list(user=outsider)) == {
        globex_world["job"],
        globex_world["approved_job"],
    }
    assert acme_world["candidate"] not in selectors.candidate_list(user=outsider)
    assert list(selectors.artifact_list(user=outsider)) == [globex_world["artifact"]]


def test_a_bad_code_is_not_found_rather_than_an_error(customer, acme_world):
    with pytest.raises(Http404):
        selectors.get_job_for_user(customer, "not-a-uuid")


def test_an_anonymous_user_sees_nothing(acme_world):
    from django.contrib.auth.models import AnonymousUser

    assert not selectors.workload_list(user=AnonymousUser()).exists()
    with pytest.raises(Http404):
        selectors.get_job_for_user(AnonymousUser(), acme_world["job"].code)


def test_artifacts_of_a_job_that_is_not_approved_are_never_listed(customer, acme_world):
    job = acme_world["approved_job"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW)
    assert not selectors.artifact_list(user=customer).exists()
    with pytest.raises(Http404):
        selectors.get_artifact_for_user(customer, job.code)


def test_a_customer_has_no_review_queue(customer, acme_world):
    job = acme_world["job"]
    Job.objects.filter(pk=job.pk).update(status=Job.REVIEW, best_candidate=acme_world["candidate"])
    assert not selectors.review_queue(user=customer).exists()
    assert not selectors.is_engineer(customer)


def test_an_engineer_sees_jobs_in_review_from_every_organisation(
    engineer, acme_world, globex_world
):
    for world in (acme_world, globex_world):
        Job.objects.filter(pk=world["job"].pk).update(
            status=Job.REVIEW, best_candidate=world["candidate"]
        )
    assert set(selectors.review_queue(user=engineer)) == {acme_world["job"], globex_world["job"]}


def test_a_job_in_review_with_nothing_verified_waits_outside_the_queue(engineer, acme_world):
    Job.objects.filter(pk=acme_world["job"].pk).update(status=Job.REVIEW)
    assert not selectors.review_queue(user=engineer).exists()
