"""Reads about the evidence behind a job: a candidate's verification and timings, the
baselines it was timed against, speedups, the review checklist, and the evidence memory
across jobs. Shaped as plain data for the pages, the API and the delivered artifact alike.

Nothing here decides who may see what (`portal.selectors.scope` does, before these are called).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
from django.core.cache import cache
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from portal.charts import shape_label
from portal.models import (
    BaselineMeasurement,
    Candidate,
    Environment,
    Flag,
    Generation,
    GpuBatch,
    Job,
    TimingResult,
    VerificationResult,
    Workload,
    dims_key,
)
from portal.selectors.jobs import spec_or_none


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
    """The latest measurement of every baseline for this job, with its timings by shape. The
    measurements are read as plain rows of the columns shown (a job has one a baseline and
    generation, each with its verification document)."""
    latest: dict[str, tuple] = {}
    for row in (
        BaselineMeasurement.objects.filter(job=job)
        .order_by("created", "id")
        .values_list("id", "baseline__name", "baseline__version", "status", "reason")
    ):
        latest[row[1]] = row
    timings: dict[int, dict[str, TimingResult]] = {}
    for t in TimingResult.objects.filter(
        baseline_measurement__in=[row[0] for row in latest.values()]
    ).defer("samples_us"):
        timings.setdefault(t.baseline_measurement_id, {})[t.dims_key] = t
    return [
        BaselineSeries(
            name=name,
            version=version,
            status=status,
            reason=reason,
            timings=timings.get(pk, {}),
        )
        for name, (pk, _, version, status, reason) in sorted(latest.items())
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


def _result_machines(verifications, timings) -> list:
    """The environments (GPU and driver, or the CPU PTX interpreter) that produced a candidate's
    verification and timing results, in the order first seen; [] when none is recorded."""
    # The batches' environments in one query, without loading the batches (their results
    # documents run to megabytes).
    batch_ids = sorted({v.batch_id for v in verifications})
    by_batch = dict(
        GpuBatch.objects.filter(id__in=batch_ids, environment__isnull=False).values_list(
            "id", "environment_id"
        )
    )
    envs = {e.id: e for e in Environment.objects.filter(id__in=set(by_batch.values()))}
    seen = []
    for env in [envs.get(by_batch.get(v.batch_id)) for v in verifications] + [
        t.environment for t in timings
    ]:
        if env is not None and env not in seen:
            seen.append(env)
    return seen


def _is_interpreter(env) -> bool:
    """A results file made by the CPU PTX interpreter names it, and no GPU, as its `gpu`."""
    return "interpreter" in (env.gpu or "").lower()


def _red_team_detail(candidate: Candidate, ok: bool, machines: list) -> str:
    """Who ran the candidate, in words: the GPU worker on its GPU, or the CPU PTX interpreter
    (which is not the GPU worker and times nothing on a GPU)."""
    status = candidate.gpu_status or "none"
    reason = candidate.reason or "no record"
    names = "; ".join(map(str, machines))
    if not machines:
        return "passed (the results name no machine)" if ok else f"status {status}: {reason}"
    if all(_is_interpreter(m) for m in machines):
        who = f"the CPU PTX interpreter, not the GPU worker ({names})"
    elif any(_is_interpreter(m) for m in machines):
        who = f"the GPU worker and the CPU PTX interpreter ({names})"
    else:
        who = f"the GPU worker on {names}"
    return f"passed by {who}" if ok else f"{who} reports {status}: {reason}"


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
            _red_team_detail(candidate, red_team_ok, _result_machines(verifications, timings)),
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
    elif not chosen.timings:
        why = f": {chosen.reason}" if chosen.reason else ""
        ok, detail = False, f"{chosen.name} was not measured ({chosen.status}{why})"
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
    honest one to compare against unless the engineer picks another. None when no baseline was
    timed at every one of our shapes (all unavailable, or none asked for)."""
    keys = [t.dims_key for t in timings]
    best, best_score = None, math.inf
    for b in baselines:
        # only finite positive times: a stored 0 or -1 (or inf) must not fail the page's log
        times = [
            b.timings[k].median_us
            for k in keys
            if k in b.timings and 0 < (b.timings[k].median_us or 0) < math.inf
        ]
        if not times or len(times) < len(keys):
            continue
        score = math.exp(sum(math.log(x) for x in times) / len(times))
        if score < best_score:
            best, best_score = b.name, score
    return best  # None when no baseline has a time at every shape: nothing to compare with


def _instant(value):
    """A datetime from a stored ISO timestamp (the worker's `env` times), None if unreadable."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        out = datetime.fromisoformat(value)
    except ValueError:
        return None
    return out if out.tzinfo is not None else out.replace(tzinfo=UTC)


def generation_gpu_seconds(job: Job) -> dict[int, float]:
    """GPU-seconds each generation's batch took, by generation index: the span the GPU worker
    recorded in its results (`env.started_at` to `env.finished_at`: verification, baselines and
    timing), else the batch's taken-to-recorded span (an imported results file without times),
    a batch still on the GPU counting up to now. Generations whose batch never reached a GPU
    are absent.

    Reading two keys of a results document makes the database unpack all of it (megabytes for a
    large batch), and the job page asks every second while it is open: a recorded batch's
    results never change, so its span is read once and kept in this process's cache."""
    from django.core.cache import cache

    out: dict[int, float] = {}
    rows = list(
        GpuBatch.objects.filter(job=job)
        .values_list("pk", "generation__index", "status", "started", "finished", "code")
        .order_by()
    )
    # by the batch's code: unique for good, where an id may come back in another database
    keys = {r[0]: f"batch-gpu-span:{r[5]}" for r in rows if r[2] == GpuBatch.RECORDED}
    spans = cache.get_many(list(keys.values())) if keys else {}
    unread = [pk for pk in (r[0] for r in rows) if keys.get(pk) not in spans]
    env = {}
    if unread:
        env = {
            pk: (start, end)
            for pk, start, end in GpuBatch.objects.filter(pk__in=unread).values_list(
                "pk", "results__env__started_at", "results__env__finished_at"
            )
        }
        fresh = {keys[pk]: env[pk] for pk in unread if pk in keys and pk in env}
        if fresh:
            cache.set_many(fresh, timeout=24 * 3600)
    now = timezone.now()
    for pk, index, _, started, finished, _ in rows:
        env_start, env_end = spans[keys[pk]] if keys.get(pk) in spans else env.get(pk, (None, None))
        begin, end = _instant(env_start), _instant(env_end)
        if begin is None or end is None:
            begin, end = started, finished or (now if started else None)
        if begin is None or end is None or end < begin:
            continue
        out[index] = out.get(index, 0.0) + (end - begin).total_seconds()
    return out


# --- the evidence memory (engineers) -------------------------------------------------------------


def evidence_gpus() -> list[str]:
    """The architectures any job targeted, sm_90 when there are none yet."""
    gpus = Job.objects.order_by("target_gpu").values_list("target_gpu", flat=True).distinct()
    return list(gpus) or ["sm_90"]


def evidence_families() -> list[dict]:
    """Per operator family across every job: jobs, candidates by outcome, the best bandwidth."""
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


# How long a computed evidence view is served before it is computed again even when nothing in
# `evidence_version` moved (a candidate's status changed in place, say).
EVIDENCE_VIEW_TTL_S = 60


def evidence_version() -> str:
    """A word that changes whenever evidence is added: the newest candidate, timing and
    verification row, and the number and newest change of the generations (a generation moves
    when its candidates are compiled, sent, recorded or refused). Four small queries, each a
    maximum PostgreSQL and SQLite read from the primary key's index (the generations are few)."""
    newest = [
        m.objects.aggregate(newest=Max("id"))["newest"]
        for m in (Candidate, TimingResult, VerificationResult)
    ]
    generations = Generation.objects.aggregate(n=Count("id"), changed=Max("updated"))
    return "-".join(str(x or 0) for x in [*newest, generations["n"], generations["changed"]])


def evidence_view(*, family: str, gpu: str, dtype: str | None, shape_class: str | None) -> dict:
    """`evidence_view_uncached`, kept in this process's cache while `evidence_version` stays
    the same (at most EVIDENCE_VIEW_TTL_S seconds): it reads every record of the family, which
    for one 2,000-candidate job is about 0.1 s of CPU, and engineers open the page often."""
    # the filters come from the query string: hashed, so that any text makes a valid cache key
    words = json.dumps([family, gpu, dtype, shape_class, evidence_version()])
    key = "ptxf:evidence-view:" + hashlib.sha256(words.encode()).hexdigest()
    return cache.get_or_set(
        key,
        lambda: evidence_view_uncached(
            family=family, gpu=gpu, dtype=dtype, shape_class=shape_class
        ),
        EVIDENCE_VIEW_TTL_S,
    )


def evidence_view_uncached(
    *, family: str, gpu: str, dtype: str | None, shape_class: str | None
) -> dict:
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
    labels = _schedule_labels(top)
    names = dict(
        Workload.objects.filter(sha256__in={r["workload_sha256"] for r in passed})
        .order_by("created")
        .values_list("sha256", "name")
    )
    return {
        "records": len(records),
        "jobs": len({r["job"] for r in records}),
        "findings": search_findings(passed, names),
        "dtypes": dtypes,
        "shape_classes": classes,
        "lessons": lessons,
        "choices": choices,
        "failures": sorted(lessons.failures.items(), key=lambda kv: -kv[1])[:10],
        # on the newest verified records: the estimate needs hundreds, not every record
        "model_rho": held_out_spearman(passed[-ACCURACY_SAMPLE:]),
        "model_sample": min(len(passed), ACCURACY_SAMPLE),
        "top": [
            dict(r, shape=shape_label(r["dims"]), what=labels.get((r["job"], r["ptx_sha256"]), ""))
            for r in top
        ],
        "tag_legend": " ".join(f.legend for f in families.all_families() if f.legend),
    }


# A choice decides a shape when the best schedule without the winning value is at least this
# much slower than the best with it; closer than that is within run-to-run noise of a timing.
DECISIVE = 1.02
# Fields that name the problem or the family, not a choice the search made.
NOT_CHOICES = ("family", "problem")


def _shape_groups(records: list[dict], names: dict[str, str]) -> dict[tuple, dict]:
    """Verified records by (operator signature, shape): each schedule's fastest median there."""
    groups: dict[tuple, dict] = {}
    for r in records:
        sched = r.get("schedule")
        if r.get("status") != Candidate.PASSED or not r.get("median_us") or not r.get("dims"):
            continue
        if not isinstance(sched, dict) or sched.get("ptx_edit"):
            continue
        key = (r.get("signature") or "", dims_key(r["dims"]))
        g = groups.setdefault(
            key,
            {
                "label": " ".join(
                    x
                    for x in (names.get(r.get("workload_sha256") or "", ""), shape_label(r["dims"]))
                    if x
                ),
                "best": {},
            },
        )
        skey = json.dumps(sched, sort_keys=True, default=str)
        prev = g["best"].get(skey)
        t = float(r["median_us"])
        if prev is None or t < prev[0]:
            g["best"][skey] = (t, sched)
    return groups


def search_findings(records: list[dict], names: dict[str, str] | None = None) -> list[dict]:
    """What the search learnt about each schedule field, from the verified evidence: at each
    shape (one operator at one size) where the search timed schedules with two or more values
    of the field, the value of the fastest schedule there, and how much slower the fastest
    schedule with any other value ran (the margin). A value wins a shape when that margin is at
    least DECISIVE; closer shapes count as "no difference". One dict per field that has a
    winner somewhere, most shapes decided first: `field`, `wins` (value, shapes, median margin,
    schedules timed), `even` (shapes where it made no difference) and `text`, the finding in a
    sentence. `names`: workload hash -> operator name, for the shape labels."""
    names = names or {}
    per_field: dict[str, dict] = {}
    for g in _shape_groups(records, names).values():
        timed = list(g["best"].values())
        fields = sorted({f for _, sched in timed for f in sched} - set(NOT_CHOICES))
        for f in fields:
            by_value: dict[str, float] = {}
            for t, sched in timed:
                v = _value_text(sched.get(f))
                by_value[v] = min(t, by_value.get(v, math.inf))
            if len(by_value) < 2:
                continue
            ranked = sorted(by_value.items(), key=lambda kv: kv[1])
            (value, best), (_, runner_up) = ranked[0], ranked[1]
            margin = runner_up / best
            entry = per_field.setdefault(f, {"wins": {}, "even": []})
            if margin >= DECISIVE:
                w = entry["wins"].setdefault(value, {"shapes": [], "margins": [], "timed": 0})
                w["shapes"].append(g["label"])
                w["margins"].append(margin)
                w["timed"] += len(timed)
            else:
                entry["even"].append(g["label"])
    out = []
    for f, entry in per_field.items():
        if not entry["wins"]:
            continue
        wins = sorted(
            (
                {
                    "value": v,
                    "shapes": sorted(w["shapes"]),
                    "margin": float(np.median(w["margins"])),
                    "timed": w["timed"],
                }
                for v, w in entry["wins"].items()
            ),
            key=lambda w: (-len(w["shapes"]), -w["margin"]),
        )
        decided = sum(len(w["shapes"]) for w in wins)
        out.append(
            {
                "field": f,
                "wins": wins,
                "even": sorted(entry["even"]),
                "decided": decided,
                "text": _finding_text(f, wins, entry["even"]),
            }
        )
    return sorted(out, key=lambda x: (-x["decided"], x["field"]))


def _value_text(value) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


def _shapes_text(shapes: list[str], limit: int = 4) -> str:
    shown = ", ".join(shapes[:limit])
    return shown + (f" and {len(shapes) - limit} more" if len(shapes) > limit else "")


def _finding_text(f: str, wins: list[dict], even: list[str]) -> str:
    """A field's finding in words: where each value won and by how much, where it did not
    matter."""
    total = sum(len(w["shapes"]) for w in wins) + len(even)
    parts = []
    for w in wins:
        n = len(w["shapes"])
        parts.append(
            f"{f} = {w['value']} is fastest at {n} of {total} shape{'s' if total != 1 else ''} "
            f"({_shapes_text(w['shapes'])}); there the best schedule with another {f} is "
            f"{w['margin']:.2f}x slower (median)"
        )
    text = "; ".join(parts)
    if even:
        text += (
            f"; at {len(even)} shape{'s' if len(even) != 1 else ''} ({_shapes_text(even)}) "
            f"it made less than {round((DECISIVE - 1) * 100)}% difference"
        )
    return text + "."


def _schedule_labels(records: list[dict]) -> dict[tuple[str, str], str]:
    """The stored schedule label of each record's candidate, by (job code, PTX hash): the
    evidence records carry the schedule, the candidate row its label in words."""
    rows = Candidate.objects.filter(
        job__code__in={r["job"] for r in records},
        ptx_sha256__in={r["ptx_sha256"] for r in records},
    ).values_list("job__code", "ptx_sha256", "schedule_label")
    return {(str(job), sha): label for job, sha, label in rows}


# --- throughput for compute-bound families --------------------------------------------------------

# Families whose kernels are bound by arithmetic, not memory: their charts show TFLOP/s against
# the card's dense peak instead of TB/s against the copy ceiling. Attention's roofline counts the
# unmasked work only (the pairs its mask's band keeps), as issue 49 asks.
COMPUTE_BOUND_FAMILIES = ("matmul", "attention")


def throughput_rows(spec, arch: str, comparison: list[dict]) -> tuple[list[dict], float | None]:
    """For a compute-bound family's workload: each comparison row with its achieved TFLOP/s
    (the family's roofline FLOPs at that shape over its median time), and the card's dense
    peak in TFLOP/s for the workload's precision (bf16/fp16 tensor cores; fp32 FMA otherwise).
    ([], None) for memory-bound families or a workload the spec cannot read."""
    if spec is None:
        return [], None
    from factory import families
    from factory.device import device_for

    try:
        name = families.name_for(spec)
        if name not in COMPUTE_BOUND_FAMILIES:
            return [], None
        family = families.get(name)
        device = device_for(arch)
    except (KeyError, ValueError):
        return [], None
    half = any(t.dtype in ("bf16", "fp16") for t in spec.inputs)
    peak_per_us = device.peak_bf16_flops_per_us if half else device.peak_fp32_flops_per_us
    # By dims_key, not by label: PostgreSQL's jsonb keeps a shape's dims in its own key order.
    shapes = {dims_key(dict(d)): dict(d) for d in spec.shapes}
    rows = []
    for row in comparison:
        dims = shapes.get(row.get("dims_key") or "")
        if dims is None or not row.get("median_us"):
            continue
        flops = family.roofline_of(spec, dims).flops
        if flops:
            rows.append({**row, "tflops": flops / row["median_us"] / 1e6})
    return rows, peak_per_us / 1e6
