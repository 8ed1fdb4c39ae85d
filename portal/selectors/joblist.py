"""The job list of the home page: search by name, operator or status, archived jobs behind a
filter, and each job's best kernel against the best baseline of the same GPU run.

Who may see a job is decided by `scope.job_list`; everything here narrows that queryset.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from django.db.models import Q, QuerySet

from portal.derived import speedup_over_best_baseline
from portal.models import BaselineMeasurement, Job, Workload
from portal.selectors.jobs import with_generations_done

# The list's filter of archived jobs: hidden (the default), only them, or everything.
SHOW_CURRENT = ""
SHOW_ARCHIVED = "archived"
SHOW_ALL = "all"
SHOW_CHOICES = (SHOW_CURRENT, SHOW_ARCHIVED, SHOW_ALL)
# Status filters beyond the job's own statuses: every job still searching.
STATUS_ACTIVE = "active"


@dataclass(frozen=True)
class JobQuery:
    """What the list was asked for; unknown values read as "no filter"."""

    text: str = ""
    status: str = ""
    show: str = SHOW_CURRENT

    @classmethod
    def from_params(cls, params) -> JobQuery:
        text = " ".join(str(params.get("q", "")).split())[:100]
        status = str(params.get("status", ""))
        if status not in dict(Job.STATUS_CHOICES) and status != STATUS_ACTIVE:
            status = ""
        show = str(params.get("show", ""))
        if show not in SHOW_CHOICES:
            show = SHOW_CURRENT
        return cls(text=text, status=status, show=show)

    @property
    def filtered(self) -> bool:
        return bool(self.text or self.status or self.show)


def _status_matching(word: str) -> list[str]:
    """Job statuses whose code or label contains `word` ("review" finds In review)."""
    word = word.lower()
    return [code for code, label in Job.STATUS_CHOICES if word in code or word in label.lower()]


def search_jobs(jobs: QuerySet[Job], query: JobQuery, *, engineer: bool = False):
    """`jobs` (scoped) narrowed by `query` (`filter_jobs`), newest first, with
    `generations_done`; the best candidate's large columns (its PTX, compile report, schedule)
    are left out: the list shows its time only."""
    return (
        with_generations_done(filter_jobs(jobs, query, engineer=engineer))
        .defer(*(f"best_candidate__{name}" for name in BEST_CANDIDATE_UNSHOWN))
        .order_by("-created")
    )


# Columns of a job's best candidate that the job list never shows: kilobytes a row.
BEST_CANDIDATE_UNSHOWN = ("ptx", "compile_report", "review", "schedule", "params", "launch", "note")


def filter_jobs(jobs: QuerySet[Job], query: JobQuery, *, engineer: bool = False):
    """`jobs` (scoped) narrowed by `query`, without annotations (what a count of the list
    needs: counting the annotated list groups every job's generations first). Each word of
    the text must match the workload's name, its operator (family), the job's status (code or
    label), the start of the job's code, or (for an engineer) the organisation's name."""
    if query.show == SHOW_CURRENT:
        jobs = jobs.filter(archived__isnull=True)
    elif query.show == SHOW_ARCHIVED:
        jobs = jobs.filter(archived__isnull=False)
    if query.status == STATUS_ACTIVE:
        jobs = jobs.filter(status__in=Job.ACTIVE)
    elif query.status:
        jobs = jobs.filter(status=query.status)
    for word in query.text.split():
        match = Q(workload__name__icontains=word) | Q(workload__family__icontains=word)
        statuses = _status_matching(word)
        if statuses:
            match |= Q(status__in=statuses)
        digits = word.lower().replace("-", "")
        if len(digits) >= 4 and all(ch in "0123456789abcdef" for ch in digits):
            match |= Q(code__startswith=digits[:8])
        if engineer:
            match |= Q(workload__org__name__icontains=word)
        jobs = jobs.filter(match)
    return jobs


def with_vs_best_baseline(jobs) -> list[Job]:
    """The jobs (a page of them), each with `vs_best_baseline`: its best kernel's speed-up over
    the fastest baseline measured in the same GPU batch (the run that timed the kernel), both as
    the geometric mean of their medians over the batch's shapes; None when either is missing.
    One query for the whole page."""
    jobs = list(jobs)
    wanted = {
        j.id: j.best_candidate.generation_id
        for j in jobs
        if j.best_candidate_id and j.best_candidate.score_us
    }
    scores: dict[int, list[float]] = {}
    rows = (
        BaselineMeasurement.objects.filter(
            job_id__in=list(wanted), status="passed", score_us__isnull=False
        )
        .values_list("job_id", "batch__generation_id", "score_us")
        .order_by()
    )
    for job_id, generation_id, score in rows:
        if wanted.get(job_id) == generation_id:
            scores.setdefault(job_id, []).append(score)
    for j in jobs:
        best = j.best_candidate.score_us if j.id in wanted else None
        j.vs_best_baseline = speedup_over_best_baseline(best, scores.get(j.id, []))
    return jobs


def speedup_label(value: float | None) -> str:
    """ "1.84x" (two decimals under 10x), "–" without a value."""
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def with_shapes_labels(workloads) -> None:
    """Set `shapes` on each workload: its `Workload.shapes_label`, worked out once per manifest
    in this process (`_shapes_label`) instead of a TOML parse per row and render."""
    for w in workloads:
        w.shapes = _shapes_label(w.sha256, w.manifest)


@functools.lru_cache(maxsize=1024)
def _shapes_label(sha256: str, manifest: str) -> str:
    # keyed by the manifest's hash too: a workload's text never changes under one hash
    return Workload(manifest=manifest).shapes_label
