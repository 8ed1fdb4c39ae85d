"""Who may see what. Every page and API view goes through these helpers, so the organisation
check lives in one place.

Customers see their own organisation's workloads and everything under them. Engineers review
across organisations, so they see every workload. Anyone else gets a 404: an object of another
organisation does not exist as far as its viewer is concerned (a 403 would confirm the id).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.http import Http404

from portal.models import Artifact, Candidate, Job, Membership, Organisation, Workload


def memberships(user):
    """The user's memberships, read once per request (cached on the user object)."""
    cached = getattr(user, "_ptxf_memberships", None)
    if cached is None:
        if not user.is_authenticated:
            cached = []
        else:
            cached = list(Membership.objects.filter(user=user).select_related("org"))
        user._ptxf_memberships = cached
    return cached


def is_engineer(user) -> bool:
    return any(m.role == Membership.ROLE_ENGINEER for m in memberships(user))


def org_ids(user) -> list[int]:
    return [m.org_id for m in memberships(user)]


def primary_org(user) -> Organisation | None:
    """The organisation a customer's uploads belong to (the first customer membership)."""
    for m in memberships(user):
        if m.role == Membership.ROLE_CUSTOMER:
            return m.org
    found = memberships(user)
    return found[0].org if found else None


def workloads_for(user):
    qs = Workload.objects.all()
    return qs if is_engineer(user) else qs.filter(org_id__in=org_ids(user))


def jobs_for(user):
    qs = Job.objects.all()
    return qs if is_engineer(user) else qs.filter(workload__org_id__in=org_ids(user))


def candidates_for(user):
    qs = Candidate.objects.all()
    return qs if is_engineer(user) else qs.filter(job__workload__org_id__in=org_ids(user))


def artifacts_for(user):
    qs = Artifact.objects.all()
    return qs if is_engineer(user) else qs.filter(job__workload__org_id__in=org_ids(user))


def _one(qs, code):
    # A malformed UUID cannot name anything: the URL converters already refuse most, and this
    # catches codes that arrive through the API body or query strings.
    try:
        return qs.get(code=code)
    except (qs.model.DoesNotExist, ValidationError, ValueError, TypeError):
        raise Http404("No such object.") from None


def get_workload_for_user(user, code) -> Workload:
    return _one(workloads_for(user).select_related("org"), code)


def get_job_for_user(user, code) -> Job:
    return _one(jobs_for(user).select_related("workload", "workload__org", "best_candidate"), code)


def get_candidate_for_user(user, code) -> Candidate:
    return _one(
        candidates_for(user).select_related(
            "job", "job__workload", "job__workload__org", "generation", "parent"
        ),
        code,
    )


def get_artifact_for_user(user, code) -> Artifact:
    return _one(artifacts_for(user).select_related("job", "job__workload", "candidate"), code)


def may_read_ptx(user, candidate) -> bool:
    """Engineers read every candidate's PTX; a customer reads only the PTX an engineer approved
    (before that, the kernel is not a deliverable, and handing it out would bypass the review)."""
    if is_engineer(user):
        return True
    from portal.models import Job, ReviewDecision

    if candidate.job.status != Job.APPROVED:
        return False
    latest = ReviewDecision.objects.filter(job_id=candidate.job_id).order_by("-created").first()
    return (
        latest is not None
        and latest.decision == ReviewDecision.APPROVE
        and latest.candidate_id == candidate.id
    )
