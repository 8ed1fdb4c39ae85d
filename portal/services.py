"""Writes. Every function here is `<entity>_<action>(*, ...)`, runs in a transaction, and is safe
to call twice: state changes are claimed with conditional UPDATEs and rows are keyed by natural
unique keys, so a redelivered Celery task finds what the first delivery made.

The pipeline (each step is one task in portal/tasks.py that loads by id and calls one service):

    job_start -> generation_propose -> candidate_build (each) -> gpu_batch_dispatch
      -> [gpu.<arch>: gpuworker.run_batch] -> results_record -> generation_finish
      -> generation_propose (next) ... or job to review.

A service that moves a row into a new state calls `pipeline.advance(row)`: the transitions table
in portal/pipeline.py names the task that follows, queued on commit, so a worker never sees a
row before it exists. Facts that pages would otherwise derive on every render (portal/derived.py)
are computed here, when the row is written.
"""

from __future__ import annotations

import importlib
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal import derived, pipeline, quotas, results_schema
from portal.models import (
    ApiToken,
    Artifact,
    AuditEvent,
    Baseline,
    BaselineMeasurement,
    Candidate,
    Environment,
    Flag,
    Generation,
    GpuBatch,
    Job,
    Membership,
    Organisation,
    ReviewDecision,
    TimingResult,
    VerificationResult,
    Workload,
    canonical_json,
    dims_key,
    sha256_hex,
)

log = logging.getLogger("portal.services")

BATCH_FORMAT = 1


class StageUnavailable(RuntimeError):
    """A pipeline stage named in the settings cannot be imported."""


def stage(dotted: str) -> Callable:
    """The callable at `dotted` ("package.module.function" or "package.module:function")."""
    module_name, _, attr = dotted.replace(":", ".").rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StageUnavailable(f"{dotted}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise StageUnavailable(f"{dotted}: {module_name} has no {attr}") from None


def _plain(value):
    """Dataclasses (and tuples of them) to JSON-ready data."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


# --- Accounts and audit -------------------------------------------------------------------------


def audit_record(*, actor=None, org=None, verb: str, target: str = "", data=None) -> AuditEvent:
    if actor is not None and not actor.is_authenticated:
        actor = None
    return AuditEvent.objects.create(
        actor=actor, org=org, verb=verb, target=target, data=data or {}
    )


def organisation_create(*, name: str) -> Organisation:
    org, _ = Organisation.objects.get_or_create(name=name)
    return org


def membership_set(*, user, org: Organisation, role: str) -> Membership:
    if role not in dict(Membership.ROLE_CHOICES):
        raise ValidationError(f"role must be customer or engineer, not {role!r}")
    membership, _ = Membership.objects.update_or_create(user=user, org=org, defaults={"role": role})
    return membership


def api_token_revoke(*, user, code) -> bool:
    """Delete one of the user's own tokens; False when they have none of that code."""
    deleted, _ = ApiToken.objects.filter(user=user, code=code).delete()
    if deleted:
        audit_record(actor=user, verb="token.revoke", target=f"token:{code}")
    return bool(deleted)


def api_token_create(
    *, user, name: str = "", scope: str = "write", days: int | None = None
) -> tuple[str, object]:
    """(key, token): the key is shown once; only its hash is kept. It expires after `days`
    (settings.API_TOKEN_DAYS; 0: never); scope "read" allows GET only."""
    if scope not in ("read", "write"):
        raise ValidationError("scope must be read or write")
    days = settings.API_TOKEN_DAYS if days is None else days
    expires = timezone.now() + timedelta(days=days) if days else None
    key, prefix, key_sha256 = ApiToken.new_key()
    token = ApiToken.objects.create(
        user=user, name=name, prefix=prefix, key_sha256=key_sha256, scope=scope, expires=expires
    )
    audit_record(actor=user, verb="token.create", target=f"token:{token.code}")
    return key, token


# --- Workloads and jobs -------------------------------------------------------------------------


def workload_create(
    *,
    org: Organisation,
    user,
    manifest: str,
    baseline_source: str | None = None,
    baseline_filename: str | None = None,
) -> Workload:
    """Validate the manifest (and the customer's kernel) with factory.spec and store it. Raises
    factory.spec.SpecError naming the field; nothing is stored when it does. The same manifest
    and kernel uploaded again by the same organisation returns the existing workload."""
    from factory.spec import load_manifest

    spec = load_manifest(
        manifest, baseline_source=baseline_source, baseline_filename=baseline_filename
    )
    tags = list(spec.tags)
    family = ""
    for tag in tags:
        if tag.startswith("family:"):
            family = tag.split(":", 1)[1].strip().lower()
    baseline_sha = sha256_hex(baseline_source) if baseline_source else ""
    with transaction.atomic():
        workload, created = Workload.objects.get_or_create(
            org=org,
            sha256=spec.sha256,
            baseline_sha256=baseline_sha,
            defaults={
                "name": spec.name,
                "description": spec.description,
                "manifest": spec.manifest,
                "family": family or spec.name.lower(),
                "row_lengths": derived.row_lengths(spec),
                "tags": tags,
                "target_gpu": spec.target,
                "baseline_source": baseline_source or "",
                "baseline_filename": baseline_filename or "",
                "created_by": user,
            },
        )
        if created:
            audit_record(
                actor=user, org=org, verb="workload.create", target=f"workload:{workload.code}"
            )
    return workload


def job_create(
    *,
    workload: Workload,
    user=None,
    target_gpu: str | None = None,
    max_generations: int | None = None,
    population: int | None = None,
    deadline: datetime | None = None,
    backend: str | None = None,
    seed: int | None = None,
    start: bool = True,
) -> Job:
    target_gpu = target_gpu or workload.target_gpu or settings.FACTORY_DEFAULT_GPU
    from portal.celery import GPU_ARCHS

    if target_gpu not in GPU_ARCHS:
        raise ValidationError(f"target_gpu must be one of {', '.join(GPU_ARCHS)}")
    backend = backend or settings.FACTORY_BACKEND
    if backend not in ("offline", "anthropic"):
        raise ValidationError("backend must be offline or anthropic")
    with transaction.atomic():
        quotas.check_running_jobs(org=workload.org)  # a clear refusal past the org's limit
        job = Job.objects.create(
            workload=workload,
            target_gpu=target_gpu,
            backend=backend,
            seed=seed if seed is not None else uuid.uuid4().int % (2**31),
            max_generations=max_generations or settings.FACTORY_GENERATIONS,
            population=population or settings.FACTORY_POPULATION,
            deadline=deadline,
            created_by=user,
        )
        audit_record(actor=user, org=workload.org, verb="job.create", target=f"job:{job.code}")
        if start:
            pipeline.advance(job)
    return job


def submit(
    *,
    org: Organisation,
    user,
    manifests: list[str],
    baseline_source: str | None = None,
    baseline_filename: str | None = None,
    max_generations: int | None = None,
) -> list[Job]:
    """A workload and a job for each manifest (one upload, or its parts by row length), all or
    none: a part the spec refuses leaves nothing behind."""
    # Validate first, outside the transaction: compiling a customer's CUDA (NVRTC) and then its
    # PTX (nvJitLink) takes seconds (up to the compilers' caps), and must not hold the database's
    # write lock meanwhile. Both compiles are cached, so workload_create does not run them again.
    from factory.spec import load_manifest
    from portal.uploads import compile_customer_ptx

    for manifest in manifests:
        spec = load_manifest(
            manifest, baseline_source=baseline_source, baseline_filename=baseline_filename
        )
        if spec.baseline is not None:  # PTX that ptxas refuses is refused now, not on a GPU host
            compile_customer_ptx(spec.baseline.ptx, target=spec.target)
    with transaction.atomic():
        jobs = []
        for manifest in manifests:
            workload = workload_create(
                org=org,
                user=user,
                manifest=manifest,
                baseline_source=baseline_source,
                baseline_filename=baseline_filename,
            )
            jobs.append(job_create(workload=workload, user=user, max_generations=max_generations))
    return jobs


def user_email_set(
    *, user, email: str, on_review: bool = True, on_decision: bool = True, on_failure: bool = True
) -> None:
    """Where news of the user's jobs is emailed (blank: nowhere), and which news."""
    from portal.models import NotificationSettings

    with transaction.atomic():
        user.email = email.strip()
        user.save(update_fields=["email"])
        NotificationSettings.objects.update_or_create(
            user=user,
            defaults={
                "email_on_review": on_review,
                "email_on_decision": on_decision,
                "email_on_failure": on_failure,
            },
        )
        audit_record(actor=user, org=None, verb="user.email", target=f"user:{user.pk}")


class JobControlRefused(ValueError):
    """A job cannot be stopped, cancelled or started again as asked (the message says why)."""


def _fastest_verified(candidates) -> Candidate | None:
    """The fastest candidate of `candidates` (a queryset) that passed verification and was timed."""
    return (
        candidates.filter(status=Candidate.PASSED, score_us__isnull=False)
        .order_by("score_us")
        .first()
    )


def _who(user) -> str:
    return user.get_username() if user is not None else "the portal"


def job_cancel(*, job: Job, user) -> bool:
    """Stop an active job for good: nothing more is proposed, built or sent to the GPU. A batch
    already on a GPU still lands as evidence, but moves the job no further. False when the job
    had already stopped."""
    with transaction.atomic():
        ok = job.claim(
            Job.ACTIVE,
            Job.CANCELLED,
            stop_reason=f"cancelled by {_who(user)}",
            finished=timezone.now(),
        )
        if ok:
            audit_record(actor=user, org=job.org, verb="job.cancel", target=f"job:{job.code}")
            pipeline.advance(job)
    return ok


def job_stop_early(*, job: Job, user) -> Job:
    """End the search now and send the best verified kernel so far to review, as if the budget
    were spent. Raises JobControlRefused when the job is not searching or nothing has passed
    verification yet (there would be nothing to review: cancel it instead)."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.status not in Job.ACTIVE:
            raise JobControlRefused(
                f"The job is {locked.get_status_display().lower()}, not searching."
            )
        best = _fastest_verified(locked.candidates)
        if best is None:
            raise JobControlRefused(
                "No kernel has passed verification yet, so there is nothing to review: "
                "wait for the first GPU results, or cancel the job."
            )
        if not locked.claim(
            [Job.RUNNING, Job.WAITING_GPU],
            Job.REVIEW,
            stage=Job.STAGE_DONE,
            stop_reason=f"stopped early by {_who(user)}",
            best_candidate=best,
            finished=timezone.now(),
        ):  # it stopped meanwhile (SQLite takes no row lock)
            raise JobControlRefused("The job stopped meanwhile: reload the page.")
        audit_record(actor=user, org=locked.org, verb="job.stop", target=f"job:{locked.code}")
        job_notify(job=locked, event=JOB_EMAIL_REVIEW)
    job.refresh_from_db()
    return job


def job_rerun(*, workload: Workload, user, max_generations: int | None = None) -> Job:
    """Another job on a stored workload: it starts from the evidence its earlier jobs left.
    Raises JobControlRefused while one of the workload's jobs is still searching."""
    with transaction.atomic():
        Workload.objects.select_for_update().filter(pk=workload.pk).first()
        running = workload.jobs.filter(status__in=Job.ACTIVE).order_by("-created").first()
        if running is not None:
            raise JobControlRefused(
                f"Job {str(running.code)[:8]} of this workload is still searching: stop or "
                "cancel it first."
            )
        return job_create(workload=workload, user=user, max_generations=max_generations)


def job_fail(*, job: Job, reason: str) -> bool:
    """An active job fails for good with `reason` (the agents cannot run, or keep failing)."""
    with transaction.atomic():
        failed = job.claim(
            Job.ACTIVE, Job.FAILED, stop_reason=reason[:300], finished=timezone.now()
        )
        if failed:
            job_notify(job=job, event=JOB_EMAIL_FAILED)
        return failed


JOB_EMAIL_REVIEW = "review"
JOB_EMAIL_FAILED = "failed"


def job_notify(*, job: Job, event: str) -> None:
    """Email the job's owner, once the transaction commits, that the search is done and an
    engineer reviews it (`JOB_EMAIL_REVIEW`) or that the job failed (`JOB_EMAIL_FAILED`).
    Nothing without an address; a mail server that is down loses the email, never the change
    (the job page says the same). Decisions are emailed by `portal.delivery`."""
    job_id = job.pk
    transaction.on_commit(lambda: _job_email_send(job_id, event))


def _job_email_send(job_id: int, event: str) -> None:
    from django.core.mail import send_mail
    from django.urls import reverse

    job = Job.objects.select_related("workload", "created_by").filter(pk=job_id).first()
    user = job.created_by if job else None
    if user is None or not user.email:
        return
    from portal.models import NotificationSettings

    wanted = {JOB_EMAIL_REVIEW: NotificationSettings.REVIEW}.get(event, NotificationSettings.FAILED)
    if not NotificationSettings.wants(user, wanted):
        return
    name = job.workload.name
    url = reverse("web-job", args=[job.code])
    if event == JOB_EMAIL_REVIEW:
        subject = f"[PTX Kernel Factory] {name}: the search is done, an engineer reviews it"
        body = f"The search for {name} has stopped ({job.stop_reason}).\n"
    else:
        subject = f"[PTX Kernel Factory] {name}: the job failed"
        body = f"The job for {name} failed: {job.stop_reason}\n"
    try:
        send_mail(subject, body + f"\nSee it at {url}\n", None, [user.email])
    except Exception:  # noqa: BLE001 - the job's change stands even if the mail server is down
        log.exception("could not email %s about job %s", user.email, job.code)


def job_start(*, job: Job) -> Generation | None:
    """queued -> running, and generation 0, queued to be proposed. Returns that generation, or
    None when the job was already started (a redelivery) and its generation is past proposing."""
    with transaction.atomic():
        if job.claim(
            [Job.QUEUED],
            Job.RUNNING,
            started=timezone.now(),
            stage=Job.STAGE_PROPOSING,
            current_generation=0,
        ):
            audit_record(org=job.org, verb="job.start", target=f"job:{job.code}")
        if job.status != Job.RUNNING:
            return None
        generation, _ = Generation.objects.get_or_create(job=job, index=0)
        if generation.status != Generation.PROPOSING:
            return None
        pipeline.advance(generation)
    return generation


# --- Proposing ----------------------------------------------------------------------------------


def _field(obj, name, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def generation_propose(*, generation: Generation) -> list[int]:
    """Ask the agents (factory.loop.propose) for this generation's candidates and store them,
    each queued to be built (none: the generation goes on to its batch). Returns their ids. The
    agents run outside any transaction; their drafts are stored in one transaction together
    with the claim proposing -> building, so a redelivered task stores them once (a second run
    that loses the claim discards its drafts, and queues the builds still to do)."""
    job = generation.job
    if generation.status != Generation.PROPOSING or job.status != Job.RUNNING:
        waiting = list(generation.candidates.filter(status=Candidate.PROPOSED))
        for candidate in waiting:
            pipeline.advance(candidate)
        return [c.pk for c in waiting]
    from portal.evidence_store import DbEvidenceStore

    name = settings.FACTORY_PROPOSE
    if name == "factory.loop.propose":
        name = "factory.loop.propose_with_report"  # the same drafts, and the generation's spend
    result = stage(name)(
        job.workload.spec(),
        generation=generation.index,
        population=job.population,
        evidence=DbEvidenceStore(job=job),
        backend=job.backend,
        seed=job.seed + generation.index,
    )
    drafts, report = result if isinstance(result, tuple) else (result, None)
    usage = _generation_usage(drafts, report)
    with transaction.atomic():
        if not generation.claim([Generation.PROPOSING], Generation.BUILDING):
            return []
        Generation.objects.filter(pk=generation.pk).update(usage=usage)
        Job.objects.filter(pk=job.pk).update(stage=Job.STAGE_BUILDING, updated=timezone.now())
        made = []
        for draft in drafts:
            candidate = candidate_from_draft(job=job, generation=generation, draft=draft)
            if candidate is not None:
                made.append(candidate.pk)
                pipeline.advance(candidate)
        if not made:
            pipeline.advance(generation)  # building, with nothing to build: to the batch
    return made


def _generation_usage(drafts, report) -> dict:
    """What proposing one generation spent: the loop's report's whole spend when there is one,
    else the sum of the drafts' shares; plain JSON."""
    if report is not None and getattr(report, "usage", None):
        usage = _plain(dict(report.usage))
    else:
        usage = {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
        for draft in drafts:
            for key, value in (_field(draft, "usage") or {}).items():
                if key in usage:
                    usage[key] += value or 0
    usage["cost_usd"] = round(float(usage.get("cost_usd", 0.0) or 0.0), 6)
    return usage


def _finite_or_none(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def candidate_from_draft(*, job: Job, generation: Generation, draft) -> Candidate | None:
    """Store one draft (a factory.agents CandidateDraft or a dict with the same fields). A PTX
    text this job has already seen is not stored again (None)."""
    ptx = _field(draft, "ptx")
    ptx_sha = _field(draft, "ptx_sha256") or sha256_hex(ptx)
    parent_sha = _field(draft, "parent_ptx_sha256")
    parent = None
    if parent_sha:
        parent = Candidate.objects.filter(job=job, ptx_sha256=parent_sha).first()
    usage = _field(draft, "usage") or {}
    schedule = _plain(_field(draft, "schedule")) or {}
    params = _field(draft, "params")
    launch = _field(draft, "launch")
    if launch is not None and not isinstance(launch, dict):
        from factory.agents.types import launch_to_dict

        launch = launch_to_dict(launch)
    try:
        with transaction.atomic():
            return Candidate.objects.create(
                job=job,
                generation=generation,
                ptx=ptx,
                ptx_sha256=ptx_sha,
                parent=parent,
                role=_field(draft, "role", "") or "",
                backend=_field(draft, "backend", "") or "",
                schedule=schedule,
                schedule_label=derived.schedule_label(schedule),
                note=_field(draft, "note", "") or "",
                entry=_field(draft, "entry", "") or "",
                params=_plain(params) if params is not None else None,
                launch=launch,
                predicted_us=_finite_or_none(_field(draft, "predicted_us")),
                tokens_in=int(usage.get("tokens_in", 0)),
                tokens_out=int(usage.get("tokens_out", 0)),
                cost_usd=round(float(usage.get("cost_usd", 0.0)), 6),
            )
    except IntegrityError:
        return None


# --- Building -----------------------------------------------------------------------------------


def _draft_of(candidate: Candidate):
    from factory.agents.types import CandidateDraft, launch_from_dict, params_from_list

    if candidate.params is not None and candidate.launch:
        params = params_from_list(candidate.params)
        launch = launch_from_dict(candidate.launch)
    else:
        # No binding of its own: the candidate is an edit of the customer's kernel.
        baseline = candidate.job.workload.spec().baseline
        params = baseline.params if baseline else ()
        launch = baseline.launch if baseline else None
    role = candidate.role if candidate.role in ("planner", "writer", "tuner") else "writer"
    backend = candidate.backend if candidate.backend in ("offline", "anthropic") else "offline"
    return CandidateDraft(
        ptx=candidate.ptx,
        entry=candidate.entry,
        params=params,
        launch=launch,
        schedule=candidate.schedule or None,
        parent_ptx_sha256=candidate.parent.ptx_sha256 if candidate.parent_id else None,
        role=role,
        backend=backend,
        note=candidate.note,
        ptx_sha256=candidate.ptx_sha256,
    )


def candidate_build(*, candidate: Candidate) -> bool:
    """Compile with nvJitLink (CPU) and let the reviewer read the report: proposed -> compiled or
    rejected (with the reason); the last build of a generation sends it on to its batch. Returns
    True when this call settled the candidate."""
    settled = _candidate_compile(candidate=candidate)
    # Whoever sees "all built" queues the dispatch; if two builders both do, the dispatch's own
    # claim lets only one of them through.
    generation = Generation.objects.filter(pk=candidate.generation_id).first()
    if generation is not None:  # gone with its job meanwhile: nothing follows
        pipeline.advance(generation)
    return settled


def _candidate_compile(*, candidate: Candidate) -> bool:
    if candidate.status != Candidate.PROPOSED or candidate.job.status not in Job.ACTIVE:
        return False  # built already, or its job stopped: no CPU spent on a kernel nobody runs
    from factory.compile import compile_ptx

    report = compile_ptx(candidate.ptx, arch=candidate.job.target_gpu)
    review = stage(settings.FACTORY_REVIEW)
    try:
        ok, reason = review(_draft_of(candidate), report)
    except Exception as exc:  # a reviewer bug must not stall the generation
        log.exception("review of candidate %s failed", candidate.code)
        ok, reason = False, f"review error: {type(exc).__name__}: {exc}"[:500]
    status = Candidate.COMPILED if ok else Candidate.REJECTED
    with transaction.atomic():
        settled = candidate.claim(
            [Candidate.PROPOSED],
            status,
            compile_report=report.to_dict(),
            review={"ok": bool(ok), "reason": reason},
            reason="" if ok else reason,
        )
    return settled


def generation_builds_done(*, generation: Generation) -> bool:
    return not generation.candidates.filter(status=Candidate.PROPOSED).exists()


# --- The GPU batch ------------------------------------------------------------------------------


def batch_build(*, job: Job, generation: Generation, candidates: list[Candidate], code) -> dict:
    """The batch file for the GPU worker (docs/CONTRACTS.md, format 1)."""
    from factory import families

    workload = job.workload
    spec = workload.spec()
    family = families.get(families.name_for(spec))
    baselines = [b for b in settings.GPU_BASELINES if b == "customer" or b in family.baselines]
    if spec.baseline is None and "customer" in baselines:
        baselines.remove("customer")
    return {
        "format": BATCH_FORMAT,
        "batch_id": str(code),
        "family": family.name,
        "manifest": workload.manifest,
        "baseline_source": workload.baseline_source or None,
        "baseline_filename": workload.baseline_filename or None,
        "shapes": [dict(d) for d in spec.shapes],
        "heldout_shapes": [dict(d) for d in spec.heldout_shapes],
        "candidates": [
            {
                "id": str(c.code),
                "ptx": c.ptx,
                "entry": c.entry,
                **({"params": c.params} if c.params is not None else {}),
                **({"launch": c.launch} if c.launch else {}),
            }
            for c in candidates
        ],
        "baselines": baselines,
        "options": {
            "time_budget_s_per_candidate": 2.0,
            "timeout_s_per_candidate": 20,
            "seed": None,
        },
    }


def gpu_batch_dispatch(*, generation: Generation) -> GpuBatch | None:
    """When every candidate of the generation is built: put the survivors in one batch, mark them
    queued, the job waiting for GPU results, and send the batch to gpu.<arch>. With no survivors
    the generation finishes without GPU time. Returns the batch (None without one)."""
    job = generation.job
    if job.status != Job.RUNNING or not generation_builds_done(generation=generation):
        return None  # cancelled or failed meanwhile, or a build is still running
    with transaction.atomic():
        if not generation.claim([Generation.BUILDING], Generation.GPU):
            return None
        survivors = list(generation.candidates.filter(status=Candidate.COMPILED))
        if not survivors:
            pipeline.advance(generation)  # on the GPU with no batch: straight to finishing
            return None
        code = uuid.uuid4()
        batch = GpuBatch.objects.create(
            code=code,
            job=job,
            generation=generation,
            arch=job.target_gpu,
            status=GpuBatch.DISPATCHED,
            batch=batch_build(job=job, generation=generation, candidates=survivors, code=code),
            dispatched=timezone.now(),
        )
        Candidate.objects.filter(pk__in=[c.pk for c in survivors]).update(
            status=Candidate.QUEUED, updated=timezone.now()
        )
        job.claim([Job.RUNNING], Job.WAITING_GPU, stage=Job.STAGE_GPU)
        pipeline.advance(batch)
    return batch


def gpu_batch_taken(*, code: str, worker: str, error: str = "") -> bool:
    """A GPU worker took the batch `code` off its queue (`worker` its Celery hostname), or gave
    it back unrun (`worker` empty: its host had no usable GPU), or stopped without results
    (`error` says why: the batch waits to be sent again or for an imported results file). Only
    a batch still out to the GPU moves: a late word about one already recorded changes
    nothing."""
    started = timezone.now() if worker and not error else None
    return bool(
        GpuBatch.objects.filter(code=code, status=GpuBatch.DISPATCHED).update(
            started=started, worker=worker[:200] if started else "", error=error[:500]
        )
    )


class ResendRefused(ValueError):
    """The batch cannot be sent to the GPU queue again (the message says why)."""


def gpu_batch_resend(*, job: Job, user) -> GpuBatch:
    """An engineer sends the job's batch to its GPU queue again: after a GPU worker stopped
    without results, or when the batch's message was lost. A batch a worker says it is running
    is not sent twice (GPU time is dear and the first run may still land)."""
    if not settings.GPU_DISPATCH:
        raise ResendRefused("This portal sends no batches to GPU workers: import a results file.")
    if job.status not in Job.ACTIVE:
        raise ResendRefused(f"The job is {job.get_status_display().lower()}: it needs no GPU time.")
    with transaction.atomic():
        batch = (
            GpuBatch.objects.select_for_update()
            .filter(job=job, status=GpuBatch.DISPATCHED)
            .order_by("-id")
            .first()
        )
        if batch is None:
            raise ResendRefused("No batch of this job is waiting for a GPU.")
        if batch.started is not None and not batch.error:
            raise ResendRefused(
                f"Batch {str(batch.code)[:8]} is on {batch.worker or 'a GPU worker'} now; "
                "if that worker is gone, run manage.py requeue_stuck --gpu on the portal host."
            )
        audit_record(
            actor=user,
            org=job.workload.org,
            verb="gpu_batch.resend",
            target=f"batch:{batch.code}",
            data={"job": str(job.code), "error": batch.error},
        )
        Job.objects.filter(pk=job.pk).update(updated=timezone.now())
        pipeline.advance(batch)
    return batch


# --- Recording results --------------------------------------------------------------------------


def environment_get(*, env: dict, timing_protocol: dict | None = None) -> Environment:
    stable = Environment.describe(env, timing_protocol)
    digest = sha256_hex(canonical_json(stable))
    environment, _ = Environment.objects.get_or_create(
        sha256=digest,
        defaults={
            "gpu": str(env.get("gpu", "unknown")),
            "sm": str(env.get("sm", "")),
            "driver": str(env.get("driver", "")),
            "versions": stable,
        },
    )
    return environment


def _timing_fields(t: dict) -> dict:
    return {
        "dims": t.get("dims") or {},
        "median_us": float(t["median_us"]),
        "p20_us": t.get("p20_us"),
        "p80_us": t.get("p80_us"),
        "ci_low_us": t.get("ci_low_us"),
        "ci_high_us": t.get("ci_high_us"),
        "samples_us": t.get("samples_us") or [],
        "bytes": t.get("bytes"),
        "tbps": t.get("tbps"),
        "sm_clock_mhz": t.get("sm_clock_mhz"),
    }


class ResultsError(ValueError):
    """A results file that does not belong to any batch, or is not format 1."""


def results_record(*, results: dict, source: str = "worker") -> GpuBatch:
    """Record a results file idempotently: the batch is locked and recorded once; a second call
    (a redelivery, or the same file imported twice) changes nothing. Queues generation_finish."""
    if not isinstance(results, dict) or results.get("format") != 1:
        raise ResultsError("not a results file of format 1")
    try:
        batch_code = uuid.UUID(str(results.get("batch_id")))
    except ValueError:
        raise ResultsError("the results file has no valid batch_id") from None
    with transaction.atomic():
        batch = GpuBatch.objects.select_for_update().filter(code=batch_code).first()
        if batch is None:
            raise ResultsError(f"no batch {batch_code}")
        # One schema for every way in (worker, import command, import form): nothing is
        # recorded from a file with a bad value or one that does not answer this batch.
        refusal = results_schema.problem(results, batch)
        if refusal:
            raise ResultsError(refusal)
        if batch.status == GpuBatch.RECORDED:
            return batch
        job = batch.job
        env = environment_get(
            env=results.get("env") or {}, timing_protocol=results.get("timing_protocol")
        )
        by_code = {str(c.code): c for c in batch.generation.candidates.all()}
        for entry in results.get("candidates") or []:
            candidate = by_code.get(str(entry.get("id")))
            if candidate is None:
                continue
            _record_candidate(batch=batch, candidate=candidate, entry=entry, env=env)
        for entry in results.get("baselines") or []:
            _record_baseline(batch=batch, job=job, entry=entry, env=env)
        # Candidates the worker did not report on are failed, not left queued forever.
        batch.generation.candidates.filter(status=Candidate.QUEUED).update(
            status=Candidate.FAILED, reason="no result from the GPU worker"
        )
        batch.status = GpuBatch.RECORDED
        batch.results = results
        batch.source = source
        batch.environment = env
        batch.finished = timezone.now()
        batch.save()
        Job.objects.filter(pk=job.pk).update(stage=Job.STAGE_RECORDING, updated=timezone.now())
        pipeline.advance(Generation.objects.get(pk=batch.generation_id))
    return batch


def _record_candidate(*, batch: GpuBatch, candidate: Candidate, entry: dict, env) -> None:
    for v in entry.get("verification") or []:
        dims = v.get("dims") or {}
        VerificationResult.objects.get_or_create(
            candidate=candidate,
            batch=batch,
            dims_key=dims_key(dims) + (" heldout" if v.get("heldout") else ""),
            defaults={
                "dims": dims,
                "heldout": bool(v.get("heldout")),
                "passed": bool(v.get("passed")),
                "rel_err": v.get("rel_err"),
                "max_abs_err": v.get("max_abs_err"),
                "reason": v.get("reason") or "",
            },
        )
    medians = []
    for t in entry.get("timing") or []:
        fields = _timing_fields(t)
        medians.append(fields["median_us"])
        TimingResult.objects.get_or_create(
            candidate=candidate,
            batch=batch,
            dims_key=dims_key(fields["dims"]),
            defaults={**fields, "environment": env},
        )
    for text in entry.get("flags") or []:
        Flag.objects.get_or_create(
            candidate=candidate,
            batch=batch,
            message_sha256=sha256_hex(text),
            defaults={"kind": text.split(":", 1)[0].strip(), "message": text},
        )
    gpu_status = str(entry.get("status", "failed"))
    passed = gpu_status == "passed"
    candidate.claim(
        [Candidate.QUEUED],
        Candidate.PASSED if passed else Candidate.FAILED,
        gpu_status=gpu_status,
        reason="" if passed else (entry.get("reason") or gpu_status),
        score_us=geomean(medians) if passed else None,
        compile_report=entry.get("compile") or candidate.compile_report,
    )


def _record_baseline(*, batch: GpuBatch, job: Job, entry: dict, env) -> None:
    config = entry.get("config") or {}
    baseline, _ = Baseline.objects.get_or_create(
        name=str(entry.get("name", "unknown")),
        version=str(entry.get("version") or ""),
        config_sha256=sha256_hex(canonical_json(config)),
        defaults={"config": config},
    )
    timings = entry.get("timing") or []
    passed = entry.get("status") == "passed"
    measurement, created = BaselineMeasurement.objects.get_or_create(
        baseline=baseline,
        batch=batch,
        defaults={
            "job": job,
            "status": str(entry.get("status", "")),
            "reason": entry.get("reason") or "",
            "verification": entry.get("verification") or [],
            "score_us": geomean([t["median_us"] for t in timings]) if passed else None,
            "environment": env,
        },
    )
    for t in timings:
        fields = _timing_fields(t)
        TimingResult.objects.get_or_create(
            baseline_measurement=measurement,
            dims_key=dims_key(fields["dims"]),
            defaults={**fields, "batch": batch, "environment": env},
        )


def results_import(*, results: dict, user=None) -> GpuBatch:
    """A results file carried back from an air-gapped GPU host."""
    batch = results_record(results=results, source="import")
    audit_record(actor=user, org=batch.job.org, verb="results.import", target=f"batch:{batch.code}")
    return batch


# --- Between generations ------------------------------------------------------------------------


def _history(job: Job) -> list[float | None]:
    return list(
        job.generations.filter(status=Generation.DONE)
        .order_by("index")
        .values_list("best_score_us", flat=True)
    )


def job_should_stop(*, job: Job, generation: Generation) -> str:
    """Why the search stops after `generation` ("" to go on). The budget and the deadline are
    ours; the plateau rule is the loop's (factory.loop.should_stop) when it is installed."""
    if generation.index + 1 >= job.max_generations:
        n = job.max_generations
        return f"budget: {n} generation{'' if n == 1 else 's'}"
    if job.deadline and timezone.now() >= job.deadline:
        return "deadline reached"
    try:
        should_stop = stage(settings.FACTORY_SHOULD_STOP)
    except StageUnavailable:
        should_stop = None
    history = _history(job)
    if should_stop is not None:
        reason = should_stop(
            history,
            generation=generation.index,
            max_generations=job.max_generations,
            deadline=job.deadline,
        )
        return reason or ""
    # Without the loop's rule: stop after two generations without a 1% improvement.
    scores = [s for s in history if s is not None]
    if len(history) >= 3 and scores:
        best_before = min([s for s in history[:-2] if s is not None], default=None)
        recent = min([s for s in history[-2:] if s is not None], default=None)
        if best_before is not None and (recent is None or recent > 0.99 * best_before):
            return "plateau: no improvement in two generations"
    return ""


def costmodel_rho(*, job: Job, generation: Generation | None = None) -> float | None:
    """The cost model's rank correlation with the measured times over the verified candidates it
    ranked: of `generation`, or of the whole job. Stored when a generation finishes, so the pages
    read it rather than rank every candidate on each render."""
    from portal.selectors import costmodel_rows

    rows = costmodel_rows(job, generation)
    return derived.rank_correlation([(r["predicted_us"], r["runtime_us"]) for r in rows])


def generation_finish(*, generation: Generation) -> Generation | None:
    """gpu -> done; the job's best candidate updated; then the next generation (returned, to be
    proposed) or the job to review. Idempotent: a second call finds the generation done."""
    with transaction.atomic():
        if not generation.claim([Generation.GPU], Generation.DONE):
            return None
        job = Job.objects.select_for_update().get(pk=generation.job_id)
        best = _fastest_verified(generation.candidates)
        generation.best_candidate = best
        generation.best_score_us = best.score_us if best else None
        generation.finished = timezone.now()
        generation.model_rho = costmodel_rho(job=job, generation=generation)
        generation.save(update_fields=["best_candidate", "best_score_us", "finished", "model_rho"])
        job.model_rho = costmodel_rho(job=job)
        Job.objects.filter(pk=job.pk).update(model_rho=job.model_rho)
        overall = _fastest_verified(job.candidates)
        if (
            job.status == Job.REVIEW
            and overall is not None
            and overall != job.best_candidate
            and (job.best_candidate is None or overall.score_us < job.best_candidate.score_us)
        ):
            # A batch that was on a GPU when the search was stopped early landed with a faster
            # verified kernel: that is the best to review (the review page names the kernel it
            # showed, so a decision is never about one the engineer did not see).
            audit_record(
                org=job.org,
                verb="job.best",
                target=f"job:{job.code}",
                data={"candidate": str(overall.code), "score_us": overall.score_us},
            )
            job.claim([Job.REVIEW], Job.REVIEW, best_candidate=overall)
        if job.status not in (Job.RUNNING, Job.WAITING_GPU):
            return None
        reason = job_should_stop(job=job, generation=generation)
        if reason:
            if overall is None:
                reason = f"{reason}; no candidate passed verification"
            to_review = job.claim(
                [Job.RUNNING, Job.WAITING_GPU],
                Job.REVIEW,
                stage=Job.STAGE_DONE,
                stop_reason=reason,
                best_candidate=overall,
                finished=timezone.now(),
            )
            audit_record(org=job.org, verb="job.review", target=f"job:{job.code}")
            if to_review:
                job_notify(job=job, event=JOB_EMAIL_REVIEW)
            return None
        nxt, _ = Generation.objects.get_or_create(job=job, index=generation.index + 1)
        job.claim(
            [Job.RUNNING, Job.WAITING_GPU],
            Job.RUNNING,
            stage=Job.STAGE_PROPOSING,
            current_generation=nxt.index,
            best_candidate=overall,
        )
        if job.status == Job.RUNNING:
            pipeline.advance(nxt)
    return nxt


# --- Review and delivery ------------------------------------------------------------------------


def review_decide(
    *,
    job: Job,
    reviewer,
    decision: str,
    comment: str = "",
    checklist: dict | None = None,
    candidate: Candidate | None = None,
) -> ReviewDecision:
    """An engineer approves or rejects the job's best candidate (or the one named)."""
    from portal.selectors import is_engineer

    if not is_engineer(reviewer):
        raise PermissionDenied("only engineers review")
    if decision not in (ReviewDecision.APPROVE, ReviewDecision.REJECT):
        raise ValidationError("decision must be approve or reject")
    candidate = candidate or job.best_candidate
    if candidate is None or candidate.job_id != job.pk:
        raise ValidationError("no candidate of this job to review")
    if decision == ReviewDecision.APPROVE and candidate.status != Candidate.PASSED:
        raise ValidationError("only a candidate that passed verification can be approved")
    to_status = Job.APPROVED if decision == ReviewDecision.APPROVE else Job.REJECTED
    with transaction.atomic():
        if not job.claim([Job.REVIEW], to_status, best_candidate=candidate):
            raise ValidationError(f"the job is {job.get_status_display().lower()}, not in review")
        review = ReviewDecision.objects.create(
            job=job,
            candidate=candidate,
            reviewer=reviewer,
            decision=decision,
            comment=comment,
            checklist=checklist or {},
        )
        audit_record(
            actor=reviewer,
            org=job.org,
            verb=f"review.{decision}",
            target=f"job:{job.code}",
            data={"candidate": str(candidate.code), "comment": comment},
        )
    return review


def artifact_record(
    *, job: Job, candidate: Candidate, filename: str, content: bytes, user=None
) -> Artifact:
    """Store a built artifact (portal/artifacts.py builds the bytes). Only for an approved job;
    the same bytes stored twice are one artifact."""
    if job.status != Job.APPROVED:
        raise ValidationError("artifacts are made only for approved jobs")
    digest = sha256_hex(content)
    with transaction.atomic():
        existing = Artifact.objects.filter(job=job, sha256=digest).first()
        if existing:
            return existing
        artifact = Artifact(
            job=job, candidate=candidate, filename=filename, sha256=digest, size_bytes=len(content)
        )
        artifact.file.save(filename, ContentFile(content), save=False)
        artifact.save()
        audit_record(
            actor=user, org=job.org, verb="artifact.create", target=f"artifact:{artifact.code}"
        )
    return artifact
