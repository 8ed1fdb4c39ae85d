"""Generations: propose candidates, decide when to stop, and a local driver.

The portal calls `propose` and `should_stop` from its Celery tasks (agents queue) with evidence
it reads from its database; `run_job` runs the same steps in one process (propose -> compile ->
review -> bench_fn(batch) -> record -> next), for the benchmark runs on a GPU host and for tests.
The benchmark is an argument (`bench_fn(batch: dict) -> results: dict`, docs/CONTRACTS.md
formats), so the factory never imports the GPU worker.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from factory import evidence as ev
from factory.agents.context import build_context
from factory.agents.offline import propose_offline
from factory.agents.review import review
from factory.agents.types import CandidateDraft, Plan, zero_usage
from factory.costmodel import prune as prune_items

__all__ = [
    "CandidateDraft",
    "GenerationRecord",
    "JobHistory",
    "ProposeReport",
    "propose",
    "propose_with_report",
    "records_from_results",
    "run_job",
    "should_stop",
]


@dataclass
class ProposeReport:
    """What `propose` decided besides the drafts: the plan, and the cost model's state."""

    plan: Plan
    model_fitted: bool
    model_train_records: int
    unsupported: str = ""
    notes: list[str] = field(default_factory=list)
    usage: dict = field(default_factory=zero_usage)  # all model use, even if nothing came of it


def propose_with_report(
    workload,
    *,
    generation: int,
    population: int,
    evidence: list[dict],
    backend: str = "offline",
    seed: int = 0,
    settings: dict | None = None,
) -> tuple[list[CandidateDraft], ProposeReport]:
    settings = dict(settings or {})
    evidence = _evidence_list(workload, evidence, settings)
    ctx = build_context(
        workload,
        generation=generation,
        population=population,
        evidence=evidence,
        seed=seed,
        settings=settings,
    )
    notes: list[str] = []
    if backend == "offline":
        drafts, plan = propose_offline(ctx)
    elif backend == "anthropic":
        from factory.agents.anthropic_backend import propose_anthropic

        drafts, plan, notes = propose_anthropic(ctx)
    else:
        raise ValueError(f"backend must be 'offline' or 'anthropic', got {backend!r}")
    report = ProposeReport(
        plan=plan,
        model_fitted=bool(ctx.model and ctx.model.fitted),
        model_train_records=ctx.model.n_train if ctx.model else 0,
        unsupported=ctx.unsupported,
        notes=notes + plan.notes + settings.get("_emit_errors", [])[:5],
    )
    if "_usage" in settings:
        report.usage = dict(settings["_usage"])
    else:
        for d in drafts:
            for k in report.usage:
                report.usage[k] += d.usage.get(k, 0)
    return drafts, report


def _evidence_list(workload, evidence, settings: dict) -> list[dict]:
    """Evidence as a list of dicts: a list is taken as is; a store (anything with `query`, such
    as the portal's DbEvidenceStore) is asked for the family's records and, when it knows the job
    asking (`store.job.code`), that job's records; the job then names this job's records."""
    if isinstance(evidence, list | tuple):
        return list(evidence)
    from factory.evidence import family_of

    records = list(evidence.query(family=family_of(workload)))
    asking = getattr(evidence, "job", None)
    code = getattr(asking, "code", asking)
    if code is not None and "job" not in settings:
        settings["job"] = str(code)
    if settings.get("job") is not None:
        seen = {id(r) for r in records}
        records += [r for r in evidence.query(job=settings["job"]) if id(r) not in seen]
    return records


def propose(
    workload,
    *,
    generation: int,
    population: int,
    evidence: list[dict],
    backend: str = "offline",
    seed: int = 0,
    settings: dict | None = None,
) -> list[CandidateDraft]:
    """Up to `population` new candidates for generation `generation` of a job.

    `evidence` holds this job's records so far and other jobs' records (CONTRACTS, issue 6), as
    a list of dicts or an evidence store (`query`);
    `settings["job"]` names this job (without it, records of the same workload sha256 count as
    this job's). Deterministic for a given seed and evidence with the offline backend. Never
    proposes a schedule or PTX this job has already tried. Returns fewer drafts when the spaces
    are exhausted (or none: offline cannot write PTX for an operator the generator cannot
    express and that has no customer kernel). Raises ValueError for an unknown backend."""
    drafts, _ = propose_with_report(
        workload,
        generation=generation,
        population=population,
        evidence=evidence,
        backend=backend,
        seed=seed,
        settings=settings,
    )
    return drafts


def should_stop(
    best_us_by_generation: list[float | None],
    *,
    generation: int,
    max_generations: int,
    deadline_s_left: float | None = None,
    deadline=None,
    plateau_generations: int = 3,
    min_gain: float = 0.01,
) -> str | None:
    """Why the job stops after `generation` (0-based), or None to go on.

    "budget": `max_generations` are done; "time": the deadline has passed; "plateau": the best
    time (best so far) improved by less than `min_gain` (relative) over the last
    `plateau_generations` generations. None entries are generations with no passing candidate.
    The deadline is either seconds left (`deadline_s_left`) or an aware datetime (`deadline`)."""
    if deadline is not None and deadline_s_left is None:
        from datetime import UTC, datetime

        deadline_s_left = (deadline - datetime.now(UTC)).total_seconds()
    if generation + 1 >= max_generations:
        return f"budget: {max_generations} generations done"
    if deadline_s_left is not None and deadline_s_left <= 0:
        return "time: the job's deadline has passed"
    running, best = [], math.inf
    for t in best_us_by_generation[: generation + 1]:
        if t is not None:
            best = min(best, t)
        running.append(best)
    if len(running) > plateau_generations and math.isfinite(running[-1]):
        before = running[-1 - plateau_generations]
        if math.isfinite(before) and running[-1] > before * (1 - min_gain):
            return (
                f"plateau: under {min_gain:.0%} gain over the last {plateau_generations} "
                "generations"
            )
    return None


# --- the local driver ---------------------------------------------------------------------------


@dataclass
class GenerationRecord:
    generation: int
    proposed: int
    rejected: list[dict]
    benched: int
    passed: int
    best_us: float | None  # best objective this generation (sum of median_us over shapes)
    best_so_far_us: float | None
    best_ptx_sha256: str | None
    best_schedule: dict | None
    population: list[dict]  # each candidate: ptx_sha256, role, note, schedule, status, us
    plan: dict
    wall_s: float
    prune: dict | None = None
    usage: dict = field(default_factory=zero_usage)


@dataclass
class JobHistory:
    job: str
    workload: str
    backend: str
    generations: list[GenerationRecord] = field(default_factory=list)
    stop_reason: str = ""
    best_us: float | None = None
    best_ptx_sha256: str | None = None
    best_schedule: dict | None = None
    best_draft: CandidateDraft | None = None
    baselines: list[dict] = field(default_factory=list)
    gpu_seconds: float = 0.0
    gpu_seconds_saved_by_pruning: float = 0.0
    usage: dict = field(default_factory=zero_usage)

    @property
    def best_us_by_generation(self) -> list[float | None]:
        return [g.best_so_far_us for g in self.generations]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("best_draft")
        d["best_us_by_generation"] = self.best_us_by_generation
        return d


def _compile_default(ptx: str, arch: str):
    from factory.compile import compile_ptx

    return compile_ptx(ptx, arch)


def build_batch(workload, drafts_by_id: dict[str, CandidateDraft], *, baselines, options) -> dict:
    from factory import families

    base = workload.baseline
    return {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": families.name_for(workload),
        "manifest": workload.manifest,
        "baseline_source": base.source if base is not None else None,
        "shapes": [dict(d) for d in workload.shapes],
        "heldout_shapes": [dict(d) for d in workload.heldout_shapes],
        "candidates": [d.to_batch_candidate(cid) for cid, d in drafts_by_id.items()],
        "baselines": list(baselines),
        "options": dict(options),
    }


def records_from_results(
    workload,
    results: dict,
    drafts_by_id: dict[str, CandidateDraft],
    *,
    job: str,
    generation: int,
) -> list[dict]:
    """Evidence records (one per candidate and benchmarked shape; one for a failure) from a
    results file."""
    common = {
        "job": job,
        "workload_sha256": workload.sha256,
        "family": ev.family_of(workload),
        "signature": ev.signature_of(workload),
        "dtype": ev.dtype_of(workload),
        "gpu": results.get("env", {}).get("sm") or workload.target,
        "generation": generation,
    }
    out = []
    for c in results.get("candidates", []):
        d = drafts_by_id.get(c.get("id"))
        if d is None:
            continue
        base = dict(
            common,
            schedule=d.schedule,
            ptx_sha256=d.ptx_sha256,
            role=d.role,
            backend=d.backend,
            status=c.get("status", "crashed"),
            reason=c.get("reason", ""),
            **d.evidence_fields(),  # a model-written kernel's PTX, lineage and token use
        )
        timing = c.get("timing") or []
        if c.get("status") == "passed" and timing:
            for t in timing:
                out.append(
                    dict(
                        base,
                        dims=dict(t.get("dims") or {}),
                        median_us=t.get("median_us"),
                        tbps=t.get("tbps"),
                        bytes=t.get("bytes"),
                    )
                )
        else:
            out.append(dict(base, dims=dict(workload.shapes[0]), median_us=None, tbps=None))
    return out


def _kind(d: CandidateDraft) -> str:
    if d.schedule is None:
        return "freeform"
    return "edit" if d.schedule.get("ptx_edit") else "generator"


def _prune_by_kind(items, population: int, model_fitted: bool, per_candidate_s: float):
    """Keep `population` of the survivors, each kind (generator schedule, edit of the customer's
    kernel, free-form PTX) in proportion to its share of the proposal (at least one each), so
    the planner's split survives. Within a kind: the cost model's predicted fastest when it is
    fitted, else the planner's order. Returns (kept, prune report dict or None)."""
    groups: dict[str, list] = {}
    for cid, d in items:
        groups.setdefault(_kind(d), []).append((cid, d))
    quota = {k: max(1, round(population * len(v) / len(items))) for k, v in groups.items()}
    while sum(quota.values()) > population:
        biggest = max(quota, key=quota.get)
        quota[biggest] -= 1
    kept = []
    for k, group in groups.items():
        if model_fitted:
            predicted = [d.predicted_us or math.inf for _, d in group]
            chosen, _ = prune_items(group, predicted, keep=quota[k])
        else:
            chosen = group[: quota[k]]
        kept += chosen
    if not model_fitted:
        return kept, None
    pruned = len(items) - len(kept)
    report = {
        "kept": len(kept),
        "pruned": pruned,
        "gpu_seconds_saved": pruned * per_candidate_s,
        "note": f"cost model kept {len(kept)} of {len(items)} by kind {quota}",
        "pruned_ptx_sha256": sorted(
            {d.ptx_sha256 for _, d in items} - {d.ptx_sha256 for _, d in kept}
        ),
    }
    return kept, report


def run_job(
    workload,
    bench_fn: Callable[[dict], dict],
    *,
    generations: int,
    population: int,
    backend: str = "offline",
    evidence_store,
    seed: int = 0,
    job: str | None = None,
    deadline_s: float | None = None,
    compile_fn: Callable | None = None,
    baselines: tuple[str, ...] = (),
    options: dict | None = None,
    settings: dict | None = None,
    plateau_generations: int = 3,
    gpu_seconds_per_candidate: float | None = None,
    prune_factor: int = 1,
    on_generation: Callable[[GenerationRecord], None] | None = None,
) -> JobHistory:
    """Run a whole job in this process and return its history.

    Each generation: propose -> compile (nvJitLink, `compile_fn(ptx, arch)`) -> review -> the
    survivors go to `bench_fn` as one batch -> results become evidence in `evidence_store`
    (rejections too) -> the next generation reads them. Stops on the generation budget, the
    deadline (`deadline_s` from the start) or a plateau. Baselines are asked for in generation 0
    only. With `prune_factor` k > 1 the agents propose k x population candidates and, once the
    cost model is fitted, only the `population` predicted fastest survivors of review are
    benchmarked; the rest are counted as GPU time saved (at the per-candidate time budget, or
    `gpu_seconds_per_candidate`). A bench_fn that raises propagates."""
    job = job or f"job-{uuid.uuid4().hex[:8]}"
    compile_fn = compile_fn or _compile_default
    history = JobHistory(job=job, workload=workload.name, backend=backend)
    settings = dict(settings or {}, job=job)
    options = options or {"time_budget_s_per_candidate": 1.0, "timeout_s_per_candidate": 20}
    per_candidate_s = gpu_seconds_per_candidate or float(
        options.get("time_budget_s_per_candidate", 1.0)
    )
    started = time.monotonic()
    best_so_far = math.inf
    common = {
        "job": job,
        "workload_sha256": workload.sha256,
        "family": ev.family_of(workload),
        "signature": ev.signature_of(workload),
        "dtype": ev.dtype_of(workload),
        "gpu": workload.target,
    }
    ptx_by_sha: dict[str, str] = {}  # what the model-backed tuner reads back
    settings["ptx_by_sha256"] = ptx_by_sha
    for g in range(generations):
        t0 = time.monotonic()
        evidence = evidence_store.query(family=common["family"]) + [
            r for r in evidence_store.query(job=job) if r.get("family") != common["family"]
        ]
        drafts, report = propose_with_report(
            workload,
            generation=g,
            population=population * max(1, prune_factor),
            evidence=evidence,
            backend=backend,
            seed=seed,
            settings=settings,
        )
        usage = dict(report.usage)
        rejected, survivors = [], {}
        # nvJitLink releases the GIL while it compiles: threads compile a population in parallel
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            reports = list(pool.map(lambda d: compile_fn(d.ptx, workload.target), drafts))
        for d, rep in zip(drafts, reports, strict=True):
            ok, reason = review(d, rep)
            if not ok:
                rejected.append({"ptx_sha256": d.ptx_sha256, "note": d.note, "reason": reason})
                status = "compile_error" if reason.startswith("compile error") else "rejected"
                evidence_store.add(
                    [
                        dict(
                            common,
                            dims=dict(workload.shapes[0]),
                            schedule=d.schedule,
                            ptx_sha256=d.ptx_sha256,
                            status=status,
                            reason=reason,
                            median_us=None,
                            tbps=None,
                            generation=g,
                            role=d.role,
                            backend=d.backend,
                            **d.evidence_fields(),
                        )
                    ]
                )
                continue
            survivors[str(uuid.uuid4())] = d
        prune = None
        if len(survivors) > population:
            kept, pr = _prune_by_kind(
                list(survivors.items()), population, report.model_fitted, per_candidate_s
            )
            if pr is not None:
                prune = pr
                history.gpu_seconds_saved_by_pruning += pr["gpu_seconds_saved"]
            survivors = dict(kept)
        results: dict = {"candidates": []}
        if survivors or (g == 0 and baselines):
            batch = build_batch(
                workload,
                survivors,
                baselines=baselines if g == 0 else (),
                options=options,
            )
            bench_t0 = time.monotonic()
            results = bench_fn(batch)
            history.gpu_seconds += time.monotonic() - bench_t0
            if g == 0:
                history.baselines = results.get("baselines", [])
        records = records_from_results(workload, results, survivors, job=job, generation=g)
        evidence_store.add(records)
        # the generation's population and best
        by_id = {c.get("id"): c for c in results.get("candidates", [])}
        pop, gen_best, gen_best_id = [], math.inf, None
        need = len(workload.shapes)
        for cid, d in survivors.items():
            c = by_id.get(cid, {})
            timing = c.get("timing") or []
            us = (
                sum(float(t["median_us"]) for t in timing)
                if c.get("status") == "passed" and len(timing) >= need
                else None
            )
            pop.append(
                {
                    "ptx_sha256": d.ptx_sha256,
                    "role": d.role,
                    "note": d.note,
                    "schedule": d.schedule,
                    "status": c.get("status", "missing"),
                    "reason": c.get("reason", ""),
                    "us": us,
                    "predicted_us": d.predicted_us,
                    "backend": d.backend,
                    "parent_ptx_sha256": d.parent_ptx_sha256,
                    "usage": dict(d.usage),  # its share of the generation's model use
                }
            )
            if us is not None:
                ptx_by_sha[d.ptx_sha256] = d.ptx
            if us is not None and us < gen_best:
                gen_best, gen_best_id = us, cid
        if gen_best_id is not None and gen_best < best_so_far:
            best_so_far = gen_best
            best = survivors[gen_best_id]
            history.best_us, history.best_ptx_sha256 = gen_best, best.ptx_sha256
            history.best_schedule, history.best_draft = best.schedule, best
        rec = GenerationRecord(
            generation=g,
            proposed=len(drafts),
            rejected=rejected,
            benched=len(survivors),
            passed=sum(1 for p in pop if p["us"] is not None),
            best_us=gen_best if math.isfinite(gen_best) else None,
            best_so_far_us=best_so_far if math.isfinite(best_so_far) else None,
            best_ptx_sha256=history.best_ptx_sha256,
            best_schedule=history.best_schedule,
            population=pop,
            plan={
                "strategy": report.plan.strategy,
                "n_writer": report.plan.n_writer,
                "n_tuner": report.plan.n_tuner,
                "notes": report.notes,
                "model_fitted": report.model_fitted,
            },
            wall_s=round(time.monotonic() - t0, 3),
            prune=prune,
            usage=usage,
        )
        for k in history.usage:
            history.usage[k] += usage[k]
        history.generations.append(rec)
        if on_generation:
            on_generation(rec)
        left = None if deadline_s is None else deadline_s - (time.monotonic() - started)
        if not drafts:
            history.stop_reason = "exhausted: nothing new to propose"
            break
        reason = should_stop(
            history.best_us_by_generation,
            generation=g,
            max_generations=generations,
            deadline_s_left=left,
            plateau_generations=plateau_generations,
        )
        if reason:
            history.stop_reason = reason
            break
    return history
