"""Per-organisation quotas, checked where a job is created (services.job_create), so an upload,
a re-run and the API all meet the same limit with the same sentence."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError


class QuotaExceeded(ValidationError, ValueError):
    """A job refused by a quota. A ValidationError (the upload form and the API's submit show
    its message with a 400) and a ValueError."""

    def __init__(self, message: str):
        ValidationError.__init__(self, message, code="quota")


def check_running_jobs(*, org) -> None:
    """Raise QuotaExceeded when `org` already has ORG_MAX_ACTIVE_JOBS jobs queued or searching.
    Called inside the transaction that creates the job; the organisation's row is locked first so
    two submissions at once cannot both take the last place (PostgreSQL; SQLite's IMMEDIATE
    transactions are serialised anyway)."""
    from portal.models import Job, Organisation

    limit = settings.ORG_MAX_ACTIVE_JOBS
    if not limit:
        return
    Organisation.objects.select_for_update().filter(pk=org.pk).first()
    active = Job.objects.filter(workload__org=org, status__in=Job.ACTIVE).count()
    if active >= limit:
        raise QuotaExceeded(
            f"{org.name} already has {active} jobs queued or searching (the limit is {limit}): "
            "wait for one to finish, or stop or cancel one, then submit again."
        )
