"""Who may see what: the one organisation check, for the pages and the API alike.

Customers see their own organisations' workloads and everything under them. Engineers review
across organisations, so they see every workload. Anyone else sees nothing. A row outside the
viewer's scope is indistinguishable from a row that does not exist: the `get_<thing>_for_user`
helpers raise Http404 for both (a 403 would confirm the id), and the API answers that as its
JSON 404.
"""

from __future__ import annotations

import uuid

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404

from portal.models import (
    ApiToken,
    Artifact,
    Candidate,
    Job,
    Membership,
    Organisation,
    ReviewDecision,
    Workload,
)

# --- the viewer ---------------------------------------------------------------------------------


def memberships(user) -> list[Membership]:
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
    return any(m.is_engineer for m in memberships(user))


def org_ids(user) -> list[int]:
    return [m.org_id for m in memberships(user)]


def primary_org(user) -> Organisation | None:
    """The organisation a customer's uploads belong to (the first customer or admin
    membership)."""
    for m in memberships(user):
        if m.role in (Membership.ROLE_CUSTOMER, Membership.ROLE_ADMIN):
            return m.org
    found = memberships(user)
    return found[0].org if found else None


# --- scoped lists -------------------------------------------------------------------------------


def workload_list(*, user) -> QuerySet[Workload]:
    rows = Workload.objects.select_related("org")
    return rows if is_engineer(user) else rows.filter(org_id__in=org_ids(user))


def job_list(*, user) -> QuerySet[Job]:
    rows = Job.objects.select_related("workload", "workload__org", "best_candidate")
    return rows if is_engineer(user) else rows.filter(workload__org_id__in=org_ids(user))


def candidate_list(*, user) -> QuerySet[Candidate]:
    rows = Candidate.objects.select_related(
        "job", "job__workload", "job__workload__org", "generation", "parent"
    )
    return rows if is_engineer(user) else rows.filter(job__workload__org_id__in=org_ids(user))


def artifact_list(*, user) -> QuerySet[Artifact]:
    """Artifacts of approved jobs only, ever."""
    rows = Artifact.objects.filter(job__status=Job.APPROVED).select_related(
        "job", "job__workload", "candidate"
    )
    return rows if is_engineer(user) else rows.filter(job__workload__org_id__in=org_ids(user))


def api_token_list(*, user) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created")


# --- one object, or 404 -------------------------------------------------------------------------


# The pages and `ptxf` show the first 8 hex digits of a code: at least that many name an object
# when no other object in the viewer's scope starts with them.
SHORT_CODE_MIN = 8
_HEX = frozenset("0123456789abcdef")


def _canonical_prefix(digits: str) -> str:
    """Hex digits as the start of a UUID's text form (8-4-4-4-12): PostgreSQL compares the
    uuid's text with its hyphens, SQLite strips them from both sides."""
    out = ""
    for i, ch in enumerate(digits):
        if i in (8, 12, 16, 20):
            out += "-"
        out += ch
    return out


class AmbiguousCode(Http404):
    """A short code that begins more than one object's code in the viewer's scope."""


def _one(rows: QuerySet, code):
    # A malformed UUID cannot name anything: the URL converters already refuse most, and this
    # catches codes that arrive through the API body or query strings.
    if not isinstance(code, uuid.UUID):
        digits = str(code).strip().lower().replace("-", "")
        if SHORT_CODE_MIN <= len(digits) < 32 and set(digits) <= _HEX:
            # A prefix: one match or nothing (two objects sharing it name neither).
            found = list(rows.filter(code__startswith=_canonical_prefix(digits))[:2])
            if len(found) > 1:
                raise AmbiguousCode(f"The short code {code} is ambiguous: give more of it.")
            if not found:
                raise Http404("No such object.")
            return found[0]
    try:
        return rows.get(code=code)
    except (rows.model.DoesNotExist, ValidationError, ValueError, TypeError):
        raise Http404("No such object.") from None


def get_workload_for_user(user, code) -> Workload:
    return _one(workload_list(user=user), code)


def get_job_for_user(user, code) -> Job:
    return _one(job_list(user=user), code)


def get_candidate_for_user(user, code) -> Candidate:
    return _one(candidate_list(user=user), code)


def get_artifact_for_user(user, job_code) -> Artifact:
    """The artifact of an approved job, checked every time: the job must be visible to the
    user, approved, and the artifact's candidate the one the latest decision approved."""
    job = get_job_for_user(user, job_code)
    if job.status != Job.APPROVED:
        raise Http404("Nothing has been approved for this job.")
    decision = latest_decision(job)
    if decision is None or decision.decision != ReviewDecision.APPROVE:
        raise Http404("Nothing has been approved for this job.")
    artifact = (
        artifact_list(user=user)
        .filter(job=job, candidate_id=decision.candidate_id)
        .order_by("-created")
        .first()
    )
    if artifact is None:
        raise Http404("The artifact is not ready.")
    return artifact


def latest_decision(job: Job) -> ReviewDecision | None:
    return ReviewDecision.objects.filter(job=job).select_related("reviewer").first()


def may_read_ptx(user, candidate: Candidate) -> bool:
    """Engineers read every candidate's PTX; a customer reads only the PTX an engineer approved
    (before that, the kernel is not a deliverable, and handing it out would bypass the review)."""
    if is_engineer(user):
        return True
    if candidate.job.status != Job.APPROVED:
        return False
    latest = ReviewDecision.objects.filter(job_id=candidate.job_id).order_by("-created").first()
    return (
        latest is not None
        and latest.decision == ReviewDecision.APPROVE
        and latest.candidate_id == candidate.id
    )
