"""Reads. Everything a page or the API shows comes through here, always scoped by the user: a
customer sees only their organisations' rows, an engineer sees every organisation (they review
all jobs), an anonymous user sees nothing. A row outside the scope is indistinguishable from a
row that does not exist (the views answer 404 for both).
"""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from portal.models import (
    Artifact,
    AuditEvent,
    BaselineMeasurement,
    Candidate,
    GpuBatch,
    Job,
    Membership,
    Organisation,
    TimingResult,
    VerificationResult,
    Workload,
)


def user_memberships(user) -> QuerySet[Membership]:
    if not user.is_authenticated:
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("org")


def user_is_engineer(user) -> bool:
    if not user.is_authenticated:
        return False
    return Membership.objects.filter(user=user, role=Membership.ROLE_ENGINEER).exists()


def user_organisations(user) -> QuerySet[Organisation]:
    """The organisations whose workloads the user may see."""
    if not user.is_authenticated:
        return Organisation.objects.none()
    if user_is_engineer(user):
        return Organisation.objects.all()
    return Organisation.objects.filter(memberships__user=user)


def user_default_organisation(user) -> Organisation | None:
    """Where the user's uploads go: their first customer membership, else any membership."""
    memberships = user_memberships(user).order_by("role", "created")
    first = memberships.first()
    return first.org if first else None


def _as_uuid(code) -> uuid.UUID | None:
    try:
        return code if isinstance(code, uuid.UUID) else uuid.UUID(str(code))
    except ValueError:
        return None


def workload_list(*, user) -> QuerySet[Workload]:
    return Workload.objects.filter(org__in=user_organisations(user)).select_related("org")


def workload_get(*, user, code) -> Workload | None:
    code = _as_uuid(code)
    return workload_list(user=user).filter(code=code).first() if code else None


def job_list(*, user, workload: Workload | None = None) -> QuerySet[Job]:
    jobs = Job.objects.filter(workload__org__in=user_organisations(user)).select_related(
        "workload", "workload__org", "best_candidate"
    )
    return jobs.filter(workload=workload) if workload is not None else jobs


def job_get(*, user, code) -> Job | None:
    code = _as_uuid(code)
    return job_list(user=user).filter(code=code).first() if code else None


def candidate_list(*, user, job: Job | None = None) -> QuerySet[Candidate]:
    candidates = Candidate.objects.filter(job__workload__org__in=user_organisations(user))
    candidates = candidates.select_related("generation", "job", "parent")
    return candidates.filter(job=job) if job is not None else candidates


def candidate_get(*, user, code) -> Candidate | None:
    code = _as_uuid(code)
    return candidate_list(user=user).filter(code=code).first() if code else None


def candidate_verifications(*, candidate: Candidate) -> QuerySet[VerificationResult]:
    return candidate.verifications.order_by("heldout", "dims_key")


def candidate_timings(*, candidate: Candidate) -> QuerySet[TimingResult]:
    return candidate.timings.select_related("environment").order_by("dims_key")


def job_baselines(*, job: Job) -> QuerySet[BaselineMeasurement]:
    return job.baseline_measurements.select_related("baseline", "batch").prefetch_related("timings")


def job_batches(*, job: Job) -> QuerySet[GpuBatch]:
    return job.batches.select_related("generation", "environment").order_by("generation__index")


def review_queue(*, user) -> QuerySet[Job]:
    """Jobs waiting for an engineer; empty for everyone else."""
    if not user_is_engineer(user):
        return Job.objects.none()
    return job_list(user=user).filter(status=Job.REVIEW).order_by("finished", "created")


def artifact_list(*, user, job: Job | None = None) -> QuerySet[Artifact]:
    """Only artifacts of approved jobs, ever."""
    artifacts = Artifact.objects.filter(
        job__workload__org__in=user_organisations(user), job__status=Job.APPROVED
    ).select_related("job", "candidate")
    return artifacts.filter(job=job) if job is not None else artifacts


def artifact_get(*, user, code) -> Artifact | None:
    code = _as_uuid(code)
    return artifact_list(user=user).filter(code=code).first() if code else None


def audit_list(*, user) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(org__in=user_organisations(user)).select_related("actor")
