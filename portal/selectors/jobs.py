"""Reads about a job's progress: the stage timeline, its generations, the GPU queue it waits
in, its candidates, and the lists of jobs on the home and review pages.

Who may see a job is decided before these are called (`portal.selectors.scope`); the lists of
jobs that take a `user` are scoped through it. Queries are written for a job with thousands of
candidates: values() instead of model instances where a page only needs a few columns, and
derived facts (the cost model's rank correlation, schedule labels, a workload's row lengths)
read from the columns the services filled when they wrote the rows, not computed again on every
render.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Exists, F, Max, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from portal.derived import search_gains
from portal.models import (
    AuditEvent,
    BaselineMeasurement,
    Candidate,
    Generation,
    GpuBatch,
    Job,
    ReviewDecision,
    TimingResult,
    Workload,
)
from portal.selectors.scope import is_engineer, job_list, org_ids

STAGES = [
    ("queued", "Queued"),
    ("proposing", "Writing kernels"),
    ("building", "Compiling"),
    ("gpu", "GPU verification"),
    ("review", "Engineer review"),
    ("approved", "Approved"),
]


def spec_or_none(workload):
    """The parsed workload, or None when the spec package cannot read it (the page still shows
    what the database holds)."""
    try:
        return workload.spec()
    except Exception:  # noqa: BLE001 - a page must render even if the spec code changed
        return None


# --- progress -----------------------------------------------------------------------------------


def _stage_key(job: Job) -> str:
    """Where on the timeline the job is (or was when it stopped)."""
    if job.status == Job.QUEUED:
        return "queued"
    if job.status in (Job.REVIEW, Job.REJECTED):
        return "review"
    if job.status == Job.APPROVED:
        return "approved"
    if job.status == Job.WAITING_GPU:
        return "gpu"
    return {"building": "building", "gpu": "gpu", "recording": "gpu", "done": "review"}.get(
        job.stage, "proposing"
    )


def stage_steps(job: Job, progress: dict | None = None) -> list[dict]:
    """The stage timeline: steps before the current one are done; the current one is current,
    or failed when the job failed, was cancelled or was rejected there. With the job's
    `job_progress`, its GPU queue says whether the batch is on a GPU (no query of its own)."""
    keys = [k for k, _ in STAGES]
    reached = keys.index(_stage_key(job))
    stopped = job.status in (Job.FAILED, Job.CANCELLED, Job.REJECTED)
    steps = []
    for i, (key, label) in enumerate(STAGES):
        if job.status == Job.APPROVED or i < reached:
            state = "done"
        elif i == reached:
            state = "failed" if stopped else "current"
        else:
            state = ""
        if key == "gpu" and state == "current":
            on_gpu = progress["gpu_queue"]["mine_running"] if progress is not None else None
            label = _gpu_step_label(job, on_gpu)
        steps.append({"key": key, "label": label, "state": state})
    return steps


def _gpu_step_label(job: Job, on_gpu: bool | None = None) -> str:
    """The GPU step says what the GPU queue card says: on a GPU only while a worker runs the
    job's batch (`on_gpu` when the caller knows it from `gpu_queue`)."""
    if job.stage == Job.STAGE_RECORDING:
        return "Recording GPU results"
    if job.pk is None:
        return "Waiting for a GPU"
    if on_gpu is None:
        on_gpu = GpuBatch.objects.filter(
            job=job, status=GpuBatch.DISPATCHED, started__isnull=False
        ).exists()
    return "On the GPU" if on_gpu else "Waiting for a GPU"


def costmodel_rows(job: Job, generation: Generation | None = None) -> list[dict]:
    """Verified candidates the cost model had ranked: generation, predicted time and measured
    time, both summed over the benchmarked shapes (the model predicts that sum): the points of
    the job page's cost-model chart, and what `services.costmodel_rho` ranks. One grouped query
    over the timings."""
    rows = (
        TimingResult.objects.filter(
            candidate__job=job,
            candidate__status=Candidate.PASSED,
            candidate__predicted_us__isnull=False,
            **({"candidate__generation": generation} if generation is not None else {}),
        )
        .values("candidate_id", "candidate__generation__index", "candidate__predicted_us")
        .annotate(total=Sum("median_us"))
        .order_by()
    )
    return [
        {
            "generation": r["candidate__generation__index"],
            "predicted_us": r["candidate__predicted_us"],
            "runtime_us": r["total"],
        }
        for r in rows
        if r["total"] is not None
    ]


@dataclass(frozen=True)
class JobCounts:
    """What a job's pages count, read once per request: the job's candidates grouped by
    generation and status (with how many have a score and the sum of the scores), its
    generations as plain rows, and its newest baseline measurement. `charts_version`,
    `generation_rows` and `job_progress` are all computed from one of these, so a page that
    shows several of them reads the counts once (two queries whatever the candidates)."""

    # generation id -> status -> number of candidates
    by_generation: dict[int, dict[str, int]]
    scored: int
    scores: float
    # Generation rows: id, index, status, best_score_us, model_rho, created, updated, finished
    generations: list[dict]
    baselines_newest: int | None

    @property
    def by_status(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for counts in self.by_generation.values():
            for status, n in counts.items():
                out[status] = out.get(status, 0) + n
        return out

    @property
    def candidates(self) -> int:
        return sum(self.by_status.values())


GENERATION_COLUMNS = (
    "id",
    "index",
    "status",
    "best_score_us",
    "model_rho",
    "created",
    "updated",
    "finished",
)


def job_counts(job: Job) -> JobCounts:
    """The job's `JobCounts`: one grouped query over its candidates, one over its generations
    (with the newest baseline measurement)."""
    by_generation: dict[int, dict[str, int]] = {}
    scored, scores = 0, 0.0
    for gen_id, status, n, n_scored, total in (
        Candidate.objects.filter(job=job)
        .values_list("generation_id", "status")
        .annotate(n=Count("id"), scored=Count("score_us"), scores=Sum("score_us"))
        .order_by()
    ):
        by_generation.setdefault(gen_id, {})[status] = n
        scored += n_scored
        scores += total or 0.0
    # The newest baseline measurement rides along on every generation row (one subquery the
    # database runs once): a job has a measurement only once a generation reached a GPU.
    newest_baseline = (
        BaselineMeasurement.objects.filter(job=job).order_by().values("job").annotate(m=Max("id"))
    )
    generations = list(
        Generation.objects.filter(job=job)
        .annotate(baselines_newest=Subquery(newest_baseline.values("m")))
        .order_by("index")
        .values(*GENERATION_COLUMNS, "baselines_newest")
    )
    newest = generations[0]["baselines_newest"] if generations else None
    return JobCounts(
        by_generation=by_generation,
        scored=scored,
        scores=scores,
        generations=generations,
        baselines_newest=newest,
    )


def results_version(job: Job, counts: JobCounts | None = None) -> str:
    """A word that changes whenever what the job recorded may have changed: its best candidate
    and rank correlation, its generations' number and newest change, its candidates' number,
    how many have each status or a score and the sum of the scores, and its newest baseline
    measurement. What is drawn from the results alone (the charts, the candidate table, the
    results file and the API's evidence) is kept per this word, so approving or rejecting the
    job keeps it. Computed from `counts` when the caller has read them (`job_counts`, two small
    queries otherwise; the charts themselves take about ten and read every candidate and timing
    of the job)."""
    counts = job_counts(job) if counts is None else counts
    changed = max((g["updated"] for g in counts.generations if g["updated"]), default=None)
    by_status = counts.by_status
    words = [
        job.best_candidate_id,
        job.model_rho,
        len(counts.generations),
        changed.timestamp() if changed else None,
        counts.candidates,
        counts.scored,
        # 12 digits: a changed score moves it, the order the sums were added in does not
        f"{counts.scores:.12g}",
        *(by_status.get(code, 0) for code, _ in Candidate.STATUS_CHOICES),
        counts.baselines_newest,
    ]
    return ":".join(str(w) for w in words)


def charts_version(job: Job, counts: JobCounts | None = None) -> str:
    """`results_version` and the job's status and last change: a word that changes whenever
    anything the job page draws apart from its live progress may have changed (its decision
    and artifact too)."""
    updated = job.updated.timestamp() if job.updated else None
    return f"{job.status}:{updated}:{results_version(job, counts)}"


def generation_rows(job: Job, counts: JobCounts | None = None) -> list[dict]:
    """One row per generation: status, candidate counts by status, best time, duration, the
    cost model's rank correlation with the measured times (stored when the generation finished),
    the GPU-seconds its batch took, and the search's best so far, its gain over generation 0 and
    the GPU-seconds spent to date (portal.derived.search_gains). From `counts` when the caller
    has read them (`job_counts`)."""
    from portal.selectors.evidence import generation_gpu_seconds

    counts = job_counts(job) if counts is None else counts
    gpu_s = generation_gpu_seconds(job)
    on_gpu = _generations_on_gpu(counts.generations)
    labels = dict(Generation.STATUS_CHOICES)
    now = timezone.now()
    rows = []
    for gen in counts.generations:
        c = counts.by_generation.get(gen["id"], {})
        end = gen["finished"] or (now if gen["status"] != Generation.DONE else gen["updated"])
        if gen["status"] == Generation.GPU:
            # "on the GPU" only while a worker runs its batch (what the GPU queue card says)
            label = "On the GPU" if gen["id"] in on_gpu else "Waiting for a GPU"
        else:
            label = labels.get(gen["status"], gen["status"])
        rows.append(
            {
                "index": gen["index"],
                "status": gen["status"],
                "status_label": label,
                "total": sum(c.values()),
                "passed": c.get(Candidate.PASSED, 0),
                "failed": c.get(Candidate.FAILED, 0),
                "rejected": c.get(Candidate.REJECTED, 0),
                "waiting": sum(
                    c.get(s, 0) for s in (Candidate.PROPOSED, Candidate.COMPILED, Candidate.QUEUED)
                ),
                "by_status": c,
                "best_score_us": gen["best_score_us"],
                "model_rho": gen["model_rho"],
                "duration_s": max(0.0, (end - gen["created"]).total_seconds()),
                "gpu_s": gpu_s.get(gen["index"]),
            }
        )
    return search_gains(rows)


def _generations_on_gpu(generations: list[dict]) -> set[int]:
    """Ids of the generations (of those at the GPU stage) whose batch a GPU worker has taken;
    no query when none is at that stage."""
    at_gpu = [g["id"] for g in generations if g["status"] == Generation.GPU]
    if not at_gpu:
        return set()
    return set(
        GpuBatch.objects.filter(
            generation_id__in=at_gpu, status=GpuBatch.DISPATCHED, started__isnull=False
        ).values_list("generation_id", flat=True)
    )


def gpu_queue(job: Job) -> dict:
    """What the GPU queue for the job's architecture looks like: batches a GPU worker is running,
    batches waiting in line (sent, not yet taken), where this job's batch stands, and when a
    GPU worker last took a batch of this architecture (None: never), so a queue that nothing
    consumes says so."""
    open_batches = list(
        GpuBatch.objects.filter(arch=job.target_gpu, status=GpuBatch.DISPATCHED)
        .order_by("dispatched", "id")
        .values_list("job_id", "started", "worker", "error", "job__status")[:500]
    )
    # A stopped job's batch that no worker took is withdrawn: not in line any more. One on a
    # GPU still holds that GPU.
    waiting = [
        j
        for j, started, _, error, status in open_batches
        if started is None and not error and status in Job.ACTIVE
    ]
    running = {j: (started, worker) for j, started, worker, _, _ in open_batches if started}
    failed = {j: error for j, started, _, error, _ in open_batches if error and not started}
    last_taken = (
        GpuBatch.objects.filter(arch=job.target_gpu, started__isnull=False)
        .order_by("-started")
        .values_list("started", flat=True)
        .first()
    )
    mine = running.get(job.id)
    return {
        "arch": job.target_gpu,
        "dispatch": settings.GPU_DISPATCH,
        "waiting": len(waiting),
        "running": len(running),
        "mine_running": mine is not None,
        "mine_started": mine[0] if mine else None,
        "mine_worker": mine[1] if mine else "",
        "position": waiting.index(job.id) + 1 if job.id in waiting else None,
        "mine_error": failed.get(job.id, ""),
        "last_taken": last_taken,
        # Nothing running and batches waiting, and no worker has taken one for 5 minutes (or
        # ever): the queue may have no consumer, which the page should say.
        "idle": bool(waiting)
        and not running
        and (last_taken is None or (timezone.now() - last_taken).total_seconds() > 300),
    }


def job_progress(job: Job, counts: JobCounts | None = None) -> dict:
    """The job's progress for its page, its live poll and the API: generations done, the
    estimate of the time left, candidate totals, the GPU queue. From `counts` when the caller
    has read them (`job_counts`)."""
    gens = generation_rows(job, counts)
    done = sum(1 for g in gens if g["status"] == Generation.DONE)
    budget = max(job.max_generations, 1)
    finished = job.status not in Job.ACTIVE
    # A search that ran its course (budget, plateau, stopped early for review) is complete; a
    # cancelled or failed one shows how far it got.
    stopped = job.status in (Job.CANCELLED, Job.FAILED)
    fraction = min(1.0, done / budget) if stopped else 1.0 if finished else min(0.99, done / budget)
    # Estimate the rest from the generations already done (median, robust to a slow first one
    # that had to warm caches); nothing to say before the first generation is done.
    durations = [g["duration_s"] for g in gens if g["status"] == Generation.DONE]
    eta_s, overrun = None, False
    if not finished and durations:
        current = next((g for g in gens if g["status"] != Generation.DONE), None)
        eta_s, overrun = time_left(
            budget - done, durations, current["duration_s"] if current else None
        )
    totals: dict[str, int] = {}
    for g in gens:
        for key in ("total", "passed", "failed", "rejected", "waiting"):
            totals[key] = totals.get(key, 0) + g[key]
    queue = gpu_queue(job)
    waits_for_gpu = job.status == Job.WAITING_GPU and not queue["mine_running"]
    if finished:
        waiting_hint = "not run"
    elif job.status == Job.WAITING_GPU:
        waiting_hint = "on the GPU now" if queue["mine_running"] else "waiting for a GPU"
    else:
        waiting_hint = "being written or compiled"
    if eta_s is not None and not waits_for_gpu:
        eta = eta_text(eta_s, overrun)
    elif waits_for_gpu:
        eta = "unknown until a GPU takes the batch"
    else:
        eta = "known after the first generation"
    return {
        "status": job.status,
        "status_label": job.get_status_display(),
        "stage": job.stage,
        "active": job.status in Job.ACTIVE,
        "stopped": stopped,
        "generations_done": done,
        "max_generations": job.max_generations,
        "fraction": fraction,
        "percent": round(fraction * 100),
        "eta_s": eta_s,
        "eta": eta,
        "generations": gens,
        "totals": totals,
        "waiting_hint": waiting_hint,
        "gpu_queue": queue,
        "stop_reason": job.stop_reason,
        "best_score_us": job.best_candidate.score_us if job.best_candidate_id else None,
    }


def time_left(remaining: int, durations: list[float], current_s: float | None):
    """(seconds left, whether the running generation has overrun): the generations still to
    run at the median of those done, the running one counted from what it has used. A running
    generation past the median has an unknown rest, and only the ones after it are counted."""
    per_gen = statistics.median(durations)
    if current_s is None:
        return max(0, remaining) * per_gen, False
    left_now = per_gen - current_s
    after = max(0, remaining - 1) * per_gen
    return after + max(left_now, 0.0), left_now < 0


def eta_text(eta_s: float, overrun: bool) -> str:
    if not overrun:
        return format_duration(eta_s)
    if eta_s < 1:
        return "any moment: this last generation is taking longer than the others"
    return f"{format_duration(eta_s)} after this generation, which is taking longer than the others"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating…"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"about {seconds} s"
    if seconds < 3600:
        return f"about {math.ceil(seconds / 60)} min"
    return f"about {seconds // 3600} h {seconds % 3600 // 60} min"


def population_rows(job: Job) -> list[dict]:
    """Every candidate of the job as (generation, score, status), for the population chart.
    Plain columns only: thousands of rows, and no UUIDs to convert."""
    return [
        {"generation": gen, "runtime_us": score, "status": status}
        for gen, score, status in Candidate.objects.filter(job=job)
        .order_by()
        .values_list("generation__index", "score_us", "status")
    ]


def top_candidates(job: Job):
    """Candidates ranked for the job page's table and the results file: timed ones by score,
    then the rest. Plain rows (dicts) of the columns the table shows, the generation's index
    as `generation__index`: a page of the table builds no model instances."""
    return (
        Candidate.objects.filter(job=job)
        .values(
            "id",
            "code",
            "status",
            "score_us",
            "role",
            "backend",
            "reason",
            "entry",
            "note",
            "schedule_label",
            "generation__index",
        )
        # Timed candidates first, fastest first; nulls last on every database.
        .order_by(F("score_us").asc(nulls_last=True), "created", "id")
    )


def candidate_results(job: Job) -> list[dict]:
    """Every candidate of the job in the order it was made, for the API's results answer (which
    keeps them serialised per `charts_version`), as plain rows (no model instances: thousands a
    job) of only the columns that answer carries (a job's PTX texts and compile reports run to
    megabytes)."""
    return [
        {
            "candidate": str(code),
            "generation": index,
            "status": status,
            "reason": reason,
            "score_us": score,
            "entry": entry,
            "note": note,
        }
        for code, index, status, reason, score, entry, note in Candidate.objects.filter(job=job)
        .order_by("generation__index", "id")
        .values_list("code", "generation__index", "status", "reason", "score_us", "entry", "note")
    ]


def candidate_children(candidate: Candidate):
    return candidate.children.only("code", "status", "score_us").order_by("score_us")[:20]


# --- lists of jobs ------------------------------------------------------------------------------


def with_generations_done(jobs):
    """`jobs` with `generations_done`: the one count of generations every page shows ("N of
    M done": generations whose candidates were all verified and recorded), as `job_progress`
    counts them for the job page and the API."""
    return jobs.annotate(
        generations_done=Count(
            "generations", filter=Q(generations__status=Generation.DONE), distinct=True
        ),
        # results replayed from a recording (the fresh install's finished example), not run here
        recorded=Exists(GpuBatch.objects.filter(job=OuterRef("pk"), source="recording")),
    )


def recent_jobs(jobs, limit: int = 20):
    """The newest of `jobs` (a scoped queryset from `scope.job_list`)."""
    return with_generations_done(jobs).order_by("-created")[:limit]


def workload_jobs(workload: Workload, limit: int = 50) -> list[Job]:
    return list(workload.jobs.select_related("best_candidate").order_by("-created")[:limit])


def review_queue(*, user):
    """Jobs whose best candidate awaits an engineer's decision, oldest first; empty for anyone
    who is not an engineer."""
    if not is_engineer(user):
        return Job.objects.none()
    return (
        job_list(user=user)
        .filter(status=Job.REVIEW, best_candidate__isnull=False)
        .order_by("updated")
    )


def jobs_waiting_for_gpu(limit: int = 20) -> list[Job]:
    """Every organisation's jobs waiting for GPU results (engineers' home page)."""
    return list(
        with_generations_done(Job.objects.filter(status=Job.WAITING_GPU))
        .select_related("workload", "workload__org")
        .order_by("updated")[:limit]
    )


def recent_decisions(*, user, limit: int = 5):
    """The latest review decisions the user may see: of their organisations' jobs, or (for an
    engineer) of every job."""
    rows = ReviewDecision.objects.select_related("job", "job__workload", "reviewer")
    if not is_engineer(user):
        rows = rows.filter(job__workload__org_id__in=org_ids(user))
    return rows.order_by("-created")[:limit]


def job_history(job: Job, limit: int = 20):
    """The audit trail of one job, newest first: its own events and those of its GPU batches (a
    results file imported for a batch, say)."""
    targets = [f"job:{job.code}"] + [f"batch:{c}" for c in batch_codes(job)]
    return (
        AuditEvent.objects.filter(target__in=targets)
        .select_related("actor")
        .order_by("-created")[:limit]
    )


def job_decisions(job: Job):
    return job.reviews.select_related("reviewer").order_by("-created")


# --- the job's GPU batch ------------------------------------------------------------------------


def open_batch(job: Job) -> GpuBatch | None:
    """The job's batch still out to a GPU (sent, no results recorded), newest first."""
    return GpuBatch.objects.filter(job=job, status=GpuBatch.DISPATCHED).order_by("-id").first()


def batch_codes(job: Job) -> set[str]:
    return {str(c) for c in GpuBatch.objects.filter(job=job).values_list("code", flat=True)}


def job_artifact(job: Job):
    """The newest artifact of an approved job (None otherwise); what the job page links."""
    if job.status != Job.APPROVED:
        return None
    return job.artifacts.order_by("-created").first()


def job_timings_by_candidate(job: Job) -> dict[int, list[tuple]]:
    """Every candidate timing of the job by candidate id, shapes in order, as plain tuples
    (dims, median_us, ci_low_us, ci_high_us, p20_us, p80_us, tbps): the rows of the job's
    results spreadsheet. No model instances and no samples (thousands of rows a job); each
    distinct shape's dims are decoded once and shared."""
    rows = (
        TimingResult.objects.filter(candidate__job=job)
        .order_by("candidate_id", "dims_key")
        .values_list(
            "candidate_id",
            "dims_key",
            "median_us",
            "ci_low_us",
            "ci_high_us",
            "p20_us",
            "p80_us",
            "tbps",
        )
    )
    dims_by_key = dict(
        TimingResult.objects.filter(candidate__job=job)
        .order_by()
        .values_list("dims_key", "dims")
        .distinct()
    )
    out: dict[int, list[tuple]] = {}
    for candidate_id, dims_key, *cells in rows:
        out.setdefault(candidate_id, []).append((dims_by_key.get(dims_key) or {}, *cells))
    return out


def results_file_candidates(job: Job):
    """The job's candidates for its results spreadsheet, ranked as `top_candidates` ranks them,
    as plain tuples (id, code, generation index, status, role, backend, score_us, reason)."""
    return (
        Candidate.objects.filter(job=job)
        .order_by(F("score_us").asc(nulls_last=True), "created")
        .values_list(
            "id",
            "code",
            "generation__index",
            "status",
            "role",
            "backend",
            "score_us",
            "reason",
        )
    )


# --- model use ----------------------------------------------------------------------------------


def job_model_usage(job: Job) -> dict:
    """Tokens and dollars the agents spent on the job (`factory.agents.usage.job_usage`): each
    generation's whole spend (stored when it was proposed) and what its candidates carry, by
    generation; `unattributed` is the spend of answers that produced no kept kernel."""
    from factory.agents.usage import job_usage

    items = [
        {
            "generation": gen,
            "ptx_sha256": sha,
            "usage": {"tokens_in": t_in, "tokens_out": t_out, "cost_usd": float(cost or 0)},
        }
        # job_usage skips a candidate with no model use: leave those rows in the database
        # (a search without a model backend has thousands of them).
        for gen, sha, t_in, t_out, cost in Candidate.objects.filter(job=job)
        .filter(Q(tokens_in__gt=0) | Q(tokens_out__gt=0) | ~Q(cost_usd=0))
        .order_by()
        .values_list("generation__index", "ptx_sha256", "tokens_in", "tokens_out", "cost_usd")
    ]
    generations = [
        {"generation": index, "usage": usage}
        for index, usage in Generation.objects.filter(job=job)
        .order_by("index")
        .values_list("index", "usage")
        if usage
    ]
    return job_usage(items, generations or None)


def candidate_model_usage(candidate: Candidate) -> dict:
    """The candidate's share of its generation's model use."""
    return {
        "tokens_in": candidate.tokens_in,
        "tokens_out": candidate.tokens_out,
        "cost_usd": round(float(candidate.cost_usd or 0.0), 6),
    }
