"""Reads for the pages and the API: the evidence behind a job, shaped as plain data.

The views call these after the access check (`portal.web.access`); nothing here decides who may
see what. Queries are written for a job with thousands of candidates: values() instead of model
instances where a page only needs a few columns, JSON key lookups instead of loading a whole
results file, and pagination for lists.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, F
from django.utils import timezone

from portal.charts import shape_label
from portal.models import (
    BaselineMeasurement,
    Candidate,
    Flag,
    Generation,
    GpuBatch,
    Job,
    ReviewDecision,
    TimingResult,
    VerificationResult,
    dims_key,
)

STAGES = [
    ("queued", "Queued"),
    ("proposing", "Writing kernels"),
    ("building", "Compiling"),
    ("gpu", "On the GPU"),
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


def row_lengths(spec) -> list[int]:
    """The distinct row lengths (the reduced or innermost axis) of a workload's shapes, in
    order; [] when the generator cannot lower it. One kernel serves every shape of a job, so
    with more than one the page says what that costs."""
    if spec is None:
        return []
    try:
        from factory import families

        fam, ir = families.family_for(spec)
        split = fam.split_dims(ir)
    except Exception:  # noqa: BLE001 - an operator the generator does not express
        return []
    if not split:
        return []
    row_dim = split[0]
    out: list[int] = []
    for dims in spec.shapes:
        n = int(dims[row_dim])
        if n not in out:
            out.append(n)
    return out


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


def stage_steps(job: Job) -> list[dict]:
    """The stage timeline: steps before the current one are done; the current one is current,
    or failed when the job failed, was cancelled or was rejected there."""
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
        steps.append({"key": key, "label": label, "state": state})
    return steps


def costmodel_rows(job: Job) -> list[dict]:
    """Verified candidates the cost model had ranked: generation, predicted time and measured
    time, both summed over the benchmarked shapes (the model predicts that sum). One grouped
    query over the timings."""
    from django.db.models import Sum

    rows = (
        TimingResult.objects.filter(
            candidate__job=job,
            candidate__status=Candidate.PASSED,
            candidate__predicted_us__isnull=False,
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


def costmodel_accuracy(rows: list[dict]) -> dict[int | None, float | None]:
    """Spearman rank correlation of predicted and measured times, per generation and for the
    whole job (key None); None where fewer than three verified candidates were ranked."""
    from factory.costmodel import spearman

    by_gen: dict[int | None, list[dict]] = {None: rows}
    for row in rows:
        by_gen.setdefault(row["generation"], []).append(row)
    return {
        gen: spearman([r["predicted_us"] for r in rs], [r["runtime_us"] for r in rs])
        for gen, rs in by_gen.items()
    }


def generation_rows(job: Job) -> list[dict]:
    """One row per generation: status, candidate counts by status, best time, duration, and the
    cost model's rank correlation with the measured times."""
    accuracy = costmodel_accuracy(costmodel_rows(job))
    counts: dict[int, dict[str, int]] = {}
    for gen_id, status, n in (
        Candidate.objects.filter(job=job)
        .values_list("generation_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts.setdefault(gen_id, {})[status] = n
    rows = []
    for gen in Generation.objects.filter(job=job).order_by("index"):
        c = counts.get(gen.id, {})
        end = gen.finished or (timezone.now() if gen.status != Generation.DONE else gen.updated)
        rows.append(
            {
                "index": gen.index,
                "status": gen.status,
                "status_label": gen.get_status_display(),
                "total": sum(c.values()),
                "passed": c.get(Candidate.PASSED, 0),
                "failed": c.get(Candidate.FAILED, 0),
                "rejected": c.get(Candidate.REJECTED, 0),
                "waiting": sum(
                    c.get(s, 0) for s in (Candidate.PROPOSED, Candidate.COMPILED, Candidate.QUEUED)
                ),
                "by_status": c,
                "best_score_us": gen.best_score_us,
                "model_rho": accuracy.get(gen.index),
                "duration_s": max(0.0, (end - gen.created).total_seconds()),
            }
        )
    return rows


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


def job_progress(job: Job) -> dict:
    gens = generation_rows(job)
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
    eta_s = None
    if not finished and durations:
        remaining = budget - done
        current = next((g for g in gens if g["status"] != Generation.DONE), None)
        per_gen = statistics.median(durations)
        eta_s = max(0.0, remaining * per_gen - (current["duration_s"] if current else 0.0))
    totals: dict[str, int] = {}
    for g in gens:
        for key in ("total", "passed", "failed", "rejected", "waiting"):
            totals[key] = totals.get(key, 0) + g[key]
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
        "eta": format_duration(eta_s),
        "generations": gens,
        "totals": totals,
        "gpu_queue": gpu_queue(job),
        "stop_reason": job.stop_reason,
        "best_score_us": job.best_candidate.score_us if job.best_candidate_id else None,
    }


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating…"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"about {seconds} s"
    if seconds < 3600:
        return f"about {math.ceil(seconds / 60)} min"
    return f"about {seconds // 3600} h {seconds % 3600 // 60} min"


# --- evidence -----------------------------------------------------------------------------------


def population_rows(job: Job) -> list[dict]:
    """Every candidate of the job as (generation, score, status), for the population chart.
    Plain columns only: thousands of rows, and no UUIDs to convert."""
    return [
        {"generation": gen, "runtime_us": score, "status": status}
        for gen, score, status in Candidate.objects.filter(job=job)
        .order_by()
        .values_list("generation__index", "score_us", "status")
    ]


def candidate_timings(candidate: Candidate) -> list[TimingResult]:
    return list(
        TimingResult.objects.filter(candidate=candidate)
        .select_related("environment")
        .order_by("id")
    )


def candidate_verifications(candidate: Candidate) -> list[VerificationResult]:
    return list(VerificationResult.objects.filter(candidate=candidate).order_by("heldout", "id"))


def candidate_flags(candidate: Candidate) -> list[Flag]:
    return list(Flag.objects.filter(candidate=candidate).order_by("id"))


@dataclass
class BaselineSeries:
    name: str
    version: str
    status: str
    reason: str
    timings: dict[str, TimingResult] = field(default_factory=dict)  # dims_key -> timing


def job_baselines(job: Job) -> list[BaselineSeries]:
    """The latest measurement of every baseline for this job, with its timings by shape."""
    latest: dict[str, BaselineMeasurement] = {}
    for m in (
        BaselineMeasurement.objects.filter(job=job)
        .select_related("baseline")
        .order_by("created", "id")
    ):
        latest[m.baseline.name] = m
    timings: dict[int, dict[str, TimingResult]] = {}
    for t in TimingResult.objects.filter(
        baseline_measurement__in=[m.id for m in latest.values()]
    ).defer("samples_us"):
        timings.setdefault(t.baseline_measurement_id, {})[t.dims_key] = t
    return [
        BaselineSeries(
            name=name,
            version=m.baseline.version,
            status=m.status,
            reason=m.reason,
            timings=timings.get(m.id, {}),
        )
        for name, m in sorted(latest.items())
    ]


def copy_ceiling_tbps(job: Job) -> float | None:
    """The measured copy ceiling of the job's latest recorded batch. A recorded results file
    never changes, so the number is read once per batch (a JSON lookup into a document that can
    be megabytes) and then served from the cache."""
    latest = (
        GpuBatch.objects.filter(job=job, status=GpuBatch.RECORDED)
        .order_by("-finished", "-id")
        .values_list("id", "code")
        .first()
    )
    if latest is None:
        return None
    batch_id, batch_code = latest

    def read() -> float | None:
        value = (
            GpuBatch.objects.filter(pk=batch_id)
            .values_list("results__copy_ceiling_tbps", flat=True)
            .first()
        )
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    # A missing ceiling is cached as -1 (the cache cannot tell a stored None from a miss).
    value = cache.get_or_set(f"ptxf:copy-ceiling:{batch_code}", lambda: read() or -1.0, 24 * 3600)
    return value if value > 0 else None


def comparison_rows(candidate: Candidate | None, baselines: list[BaselineSeries]) -> list[dict]:
    """Rows for the baseline and bandwidth charts: the candidate and each baseline per shape."""
    rows = []
    if candidate is not None:
        for t in TimingResult.objects.filter(candidate=candidate).defer("samples_us"):
            rows.append(_timing_row("candidate", t))
    for b in baselines:
        for t in b.timings.values():
            rows.append(_timing_row(b.name, t))
    return rows


def _timing_row(name: str, t: TimingResult) -> dict:
    return {
        "name": name,
        "shape": shape_label(t.dims),
        "dims_key": t.dims_key,
        "median_us": t.median_us,
        "ci_low_us": t.ci_low_us,
        "ci_high_us": t.ci_high_us,
        "tbps": t.tbps,
    }


def correctness_rows(verifications: list[VerificationResult]) -> list[dict]:
    return [
        {
            "shape": shape_label(v.dims),
            "heldout": v.heldout,
            "rel_err": v.rel_err,
            "passed": v.passed,
        }
        for v in verifications
    ]


def speedups(candidate_timings_: list[TimingResult], baseline: BaselineSeries | None) -> list[dict]:
    """Speedup of the candidate over one baseline per shape, with a conservative interval:
    [their fastest / our slowest, their slowest / our fastest] from the 95% intervals."""
    if baseline is None:
        return []
    rows = []
    for t in candidate_timings_:
        b = baseline.timings.get(t.dims_key)
        if b is None or not t.median_us or not b.median_us:
            rows.append({"shape": shape_label(t.dims), "dims_key": t.dims_key, "missing": True})
            continue
        low = b.ci_low_us / t.ci_high_us if b.ci_low_us and t.ci_high_us else None
        high = b.ci_high_us / t.ci_low_us if b.ci_high_us and t.ci_low_us else None
        rows.append(
            {
                "shape": shape_label(t.dims),
                "dims_key": t.dims_key,
                "missing": False,
                "baseline_us": b.median_us,
                "candidate_us": t.median_us,
                "speedup": b.median_us / t.median_us,
                "low": low,
                "high": high,
            }
        )
    return rows


# --- review -------------------------------------------------------------------------------------


@dataclass
class Check:
    key: str
    label: str
    ok: bool
    detail: str


def expected_shapes(job: Job) -> tuple[list[dict], list[dict]]:
    """(benchmarked, held-out) shapes of the job's workload, from the spec or, failing that,
    from the job's latest batch."""
    spec = spec_or_none(job.workload)
    if spec is not None:
        return [dict(s) for s in spec.shapes], [dict(s) for s in spec.heldout_shapes]
    batch = (
        GpuBatch.objects.filter(job=job)
        .order_by("-id")
        .values_list("batch__shapes", "batch__heldout_shapes")
        .first()
    )
    if batch:
        return list(batch[0] or []), list(batch[1] or [])
    return [], []


def review_checklist(
    job: Job, candidate: Candidate, baseline_name: str | None
) -> tuple[list[Check], list[dict], list[BaselineSeries]]:
    """The evidence checklist an engineer reviews before approving, built from the records.
    Returns (checks, speedup rows against the chosen baseline, all baselines)."""
    verifications = candidate_verifications(candidate)
    timings = candidate_timings(candidate)
    flags = candidate_flags(candidate)
    baselines = job_baselines(job)
    shapes, heldout = expected_shapes(job)

    passed_keys = {(dims_key(v.dims), v.heldout) for v in verifications if v.passed}
    failed = [v for v in verifications if not v.passed]
    missing = [s for s in shapes if (dims_key(s), False) not in passed_keys]
    missing_heldout = [s for s in heldout if (dims_key(s), True) not in passed_keys]
    checks = []
    if failed or missing or missing_heldout or not verifications:
        parts = []
        if failed:
            parts.append(f"{len(failed)} failed: " + ", ".join(shape_label(v.dims) for v in failed))
        if missing:
            parts.append("not verified: " + ", ".join(shape_label(s) for s in missing))
        if missing_heldout:
            parts.append(
                "held-out not verified: " + ", ".join(shape_label(s) for s in missing_heldout)
            )
        if not verifications:
            parts.append("no verification results recorded")
        checks.append(
            Check(
                "correct",
                "Correct at every benchmarked and held-out shape",
                False,
                "; ".join(parts),
            )
        )
    else:
        worst = max((v.rel_err or 0.0) for v in verifications)
        checks.append(
            Check(
                "correct",
                "Correct at every benchmarked and held-out shape",
                True,
                f"{len(shapes)} benchmarked + {len(heldout)} held-out shapes; worst relative "
                f"error {worst:.2e}",
            )
        )
    red_team_ok = candidate.status == Candidate.PASSED and candidate.gpu_status == "passed"
    checks.append(
        Check(
            "red_team",
            "Red-team checks passed (own process, fresh inputs, poisoned outputs, guard "
            "regions, re-check after timing)",
            red_team_ok,
            "the GPU worker passed it"
            if red_team_ok
            else f"GPU status {candidate.gpu_status or 'none'}: {candidate.reason or 'no record'}",
        )
    )
    checks.append(
        Check(
            "no_flags",
            "No plausibility flags",
            not flags,
            "none raised" if not flags else "; ".join(f.message for f in flags[:5]),
        )
    )
    by_name = {b.name: b for b in baselines}
    if baseline_name not in by_name:
        baseline_name = default_baseline(baselines, timings)
    chosen = by_name.get(baseline_name)
    rows = speedups(timings, chosen)
    if chosen is None:
        ok, detail = False, "no baseline was measured"
    elif not rows or any(r["missing"] for r in rows):
        ok, detail = False, f"{chosen.name} has no time at some shapes"
    else:
        lows = [r["low"] for r in rows]
        ok = all(low is not None and low > 1.0 for low in lows)
        worst = min((low for low in lows if low is not None), default=None)
        detail = (
            f"against {chosen.name}: lowest bound {worst:.2f}×"
            if worst is not None
            else f"against {chosen.name}: no intervals recorded"
        )
    checks.append(
        Check("speedup", "Speedup interval above 1 against the chosen baseline", ok, detail)
    )
    return checks, rows, baselines


def default_baseline(baselines: list[BaselineSeries], timings: list[TimingResult]) -> str | None:
    """The strongest measured baseline (the lowest geometric-mean time over our shapes): the
    honest one to compare against unless the engineer picks another."""
    keys = [t.dims_key for t in timings]
    best, best_score = None, math.inf
    for b in baselines:
        times = [b.timings[k].median_us for k in keys if k in b.timings and b.timings[k].median_us]
        if not times or len(times) < len(keys):
            continue
        score = math.exp(sum(math.log(x) for x in times) / len(times))
        if score < best_score:
            best, best_score = b.name, score
    if best is None and baselines:
        best = baselines[0].name
    return best


def latest_decision(job: Job) -> ReviewDecision | None:
    return ReviewDecision.objects.filter(job=job).select_related("reviewer").first()


def review_queue():
    """Jobs whose best candidate awaits a decision, oldest first."""
    return (
        Job.objects.filter(status=Job.REVIEW, best_candidate__isnull=False)
        .select_related("workload", "workload__org", "best_candidate")
        .order_by("updated")
    )


def top_candidates(job: Job):
    """Candidates ranked for the job page's table: timed ones by score, then the rest."""
    return (
        Candidate.objects.filter(job=job)
        .select_related("generation")
        .only(
            "code",
            "status",
            "score_us",
            "role",
            "backend",
            "reason",
            "gpu_status",
            "generation__index",
            "created",
        )
        # Timed candidates first, fastest first; nulls last on every database.
        .order_by(F("score_us").asc(nulls_last=True), "created")
    )


# --- the evidence memory (engineers) -------------------------------------------------------------


def evidence_families() -> list[dict]:
    """Per operator family across every job: jobs, candidates by outcome, the best bandwidth."""
    from django.db.models import Max, Q

    counts = (
        Candidate.objects.values(family=F("job__workload__family"))
        .annotate(
            jobs=Count("job", distinct=True),
            candidates=Count("id"),
            passed=Count("id", filter=Q(status=Candidate.PASSED)),
            failed=Count("id", filter=Q(status=Candidate.FAILED)),
            refused=Count("id", filter=Q(status=Candidate.REJECTED)),
        )
        .order_by("family")
    )
    best = dict(
        TimingResult.objects.filter(candidate__status=Candidate.PASSED)
        .values_list("candidate__job__workload__family")
        .annotate(Max("tbps"))
        .order_by()
    )
    return [dict(row, best_tbps=best.get(row["family"])) for row in counts]


ACCURACY_SAMPLE = 600


def evidence_view(*, family: str, gpu: str, dtype: str | None, shape_class: str | None) -> dict:
    """What the factory has learnt for one family on one GPU (optionally one dtype and shape
    class): the lessons the agents read, how well the cost model ranks this evidence, the
    fastest verified results and why candidates failed."""
    from factory import families
    from factory.costmodel import held_out_spearman
    from factory.evidence import distil_lessons
    from factory.evidence import shape_class as class_of
    from portal.evidence_store import DbEvidenceStore

    records = DbEvidenceStore().query(family=family, gpu=gpu)
    dtypes = sorted({r["dtype"] for r in records if r["dtype"]})
    classes = sorted({class_of(r["dims"]) for r in records if r["dims"]})
    if dtype:
        records = [r for r in records if r["dtype"] == dtype]
    if shape_class:
        records = [r for r in records if r["dims"] and class_of(r["dims"]) == shape_class]
    lessons = distil_lessons(records, family=family, gpu=gpu)
    # Fields the evidence has tried more than one value of (one value teaches nothing).
    choices = [
        {"field": f, "value": v, **stats}
        for f, values in sorted(lessons.choices.items())
        if len(values) > 1
        for v, stats in sorted(values.items(), key=lambda kv: -kv[1]["wins"] / kv[1]["n"])
        if stats["n"] >= 3
    ]
    passed = [r for r in records if r["status"] == Candidate.PASSED and r["median_us"]]
    top = sorted(passed, key=lambda r: -(r["tbps"] or 0.0))[:12]
    return {
        "records": len(records),
        "jobs": len({r["job"] for r in records}),
        "dtypes": dtypes,
        "shape_classes": classes,
        "lessons": lessons,
        "choices": choices,
        "failures": sorted(lessons.failures.items(), key=lambda kv: -kv[1])[:10],
        # on the newest verified records: the estimate needs hundreds, not every record
        "model_rho": held_out_spearman(passed[-ACCURACY_SAMPLE:]),
        "model_sample": min(len(passed), ACCURACY_SAMPLE),
        "top": [dict(r, shape=shape_label(r["dims"]), what=_schedule_label(r)) for r in top],
        "tag_legend": " ".join(f.legend for f in families.all_families() if f.legend),
    }


def _schedule_label(record: dict) -> str:
    schedule = record.get("schedule") or {}
    if schedule.get("ptx_edit"):
        from factory.agents.ptxedit import PtxEdit

        return "customer kernel: " + PtxEdit.from_schedule(schedule).describe()
    if schedule.get("family"):
        from factory import families

        try:
            return families.get(schedule["family"]).label(schedule)
        except (KeyError, TypeError, ValueError):
            pass
    return "hand-written PTX" if not schedule else str(schedule)[:60]
