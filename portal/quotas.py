"""Per-organisation quotas, checked where a job is created (services.job_create), so an upload,
a re-run and the API all meet the same limit with the same sentence."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone


class QuotaExceeded(ValidationError, ValueError):
    """A job refused by a quota. A ValidationError (the upload form and the API's submit show
    its message with a 400) and a ValueError."""

    def __init__(self, message: str):
        ValidationError.__init__(self, message, code="quota")


def check_running_jobs(*, org) -> None:
    """The quotas a new job of `org` must pass; raises QuotaExceeded naming the one it does not:
    at most ORG_MAX_ACTIVE_JOBS jobs queued or searching, and at most ORG_GPU_SECONDS_PER_DAY
    seconds of GPU time over the last 24 hours. Called inside the transaction that creates the
    job; the organisation's row is locked first so two submissions at once cannot both take the
    last place (PostgreSQL; SQLite's IMMEDIATE transactions are serialised anyway)."""
    from portal.models import Job, Organisation

    limit = settings.ORG_MAX_ACTIVE_JOBS
    if limit:
        Organisation.objects.select_for_update().filter(pk=org.pk).first()
        active = Job.objects.filter(workload__org=org, status__in=Job.ACTIVE).count()
        if active >= limit:
            raise QuotaExceeded(
                f"{org.name} already has {active} jobs queued or searching (the limit is "
                f"{limit}): wait for one to finish, or stop or cancel one, then submit again."
            )
    budget_s = settings.ORG_GPU_SECONDS_PER_DAY
    if budget_s:
        used_s = gpu_seconds_used(org=org)
        if used_s >= budget_s:
            raise QuotaExceeded(
                f"{org.name} has used {used_s / 3600:.1f} GPU-hours in the last 24 hours (the "
                f"limit is {budget_s / 3600:.1f}): new jobs can start once older batches fall "
                "out of that window."
            )


def gpu_seconds_used(*, org, window: timedelta = timedelta(hours=24)) -> float:
    """Seconds `org`'s batches spent on a GPU within the last `window` (a batch still running
    counts up to now)."""
    from portal.models import GpuBatch

    now = timezone.now()
    since = now - window
    used = 0.0
    batches = GpuBatch.objects.filter(job__workload__org=org, started__isnull=False).filter(
        Q(finished__isnull=True) | Q(finished__gte=since)
    )
    for started, finished in batches.values_list("started", "finished"):
        start = max(started, since)
        end = finished or now
        if end > start:
            used += (end - start).total_seconds()
    return used
