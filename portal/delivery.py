"""From an approved candidate's records to the artifact's plain inputs, and the stored artifact.

Kept apart from the views so the API and the pages deliver exactly the same bytes.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from django.core.mail import send_mail
from django.db import transaction
from django.urls import reverse

from portal import selectors as q
from portal import services
from portal.artifacts import ArtifactInputs, build_artifact
from portal.models import Artifact, Candidate, GpuBatch, Job, ReviewDecision

log = logging.getLogger("portal.delivery")

HARNESS_FALLBACK = "gpuworker (unrecorded version)"


def _tensor(decl) -> dict:
    return {"name": decl.name, "shape": list(decl.shape), "dtype": decl.dtype}


def artifact_inputs(job: Job, candidate: Candidate, decision: ReviewDecision) -> ArtifactInputs:
    spec = q.spec_or_none(job.workload)
    timings = q.candidate_timings(candidate)
    verifications = q.candidate_verifications(candidate)
    batch = (
        GpuBatch.objects.filter(job=job, timings__candidate=candidate)
        .select_related("environment")
        .order_by("-id")
        .only("id", "environment", "finished")
        .first()
    )
    env_row = batch.environment if batch else None
    env = {}
    if env_row is not None:
        env = {"gpu": env_row.gpu, "sm": env_row.sm, "driver": env_row.driver, **env_row.versions}
    # The results file may name the harness; the JSON key lookup avoids loading the whole file.
    harness = None
    copy_ceiling = q.copy_ceiling_tbps(job)
    if batch is not None:
        # The worker does not stamp a harness version yet: name its results format instead.
        named, fmt = (
            GpuBatch.objects.filter(pk=batch.pk)
            .values_list("results__harness", "results__format")
            .first()
        )
        harness = named or (f"gpuworker, results format {fmt}" if fmt else None)
    params = candidate.params
    launch = candidate.launch
    if (params is None or not launch) and spec is not None and spec.baseline is not None:
        params = params if params is not None else [asdict(p) for p in spec.baseline.params]
        launch = launch or {
            "grid": list(spec.baseline.launch.grid),
            "block": list(spec.baseline.launch.block),
            "smem_bytes": spec.baseline.launch.smem_bytes,
            "cluster": list(spec.baseline.launch.cluster) if spec.baseline.launch.cluster else None,
        }
    baselines = []
    for b in q.job_baselines(job):
        baselines.append(
            {
                "name": b.name,
                "version": b.version,
                "status": b.status,
                "reason": b.reason,
                "timing": [_timing_dict(t) for t in b.timings.values()],
            }
        )
    return ArtifactInputs(
        workload_name=job.workload.name,
        workload_code=str(job.workload.code),
        job_code=str(job.code),
        candidate_code=str(candidate.code),
        entry=candidate.entry,
        ptx=candidate.ptx,
        params=list(params or []),
        launch=dict(launch or {"grid": [1, 1, 1], "block": [1, 1, 1]}),
        shapes=[dict(s) for s in spec.shapes] if spec else [t.dims for t in timings],
        heldout_shapes=[dict(s) for s in spec.heldout_shapes] if spec else [],
        inputs=[_tensor(t) for t in spec.inputs] if spec else [],
        outputs=[_tensor(o) for o in spec.outputs] if spec else [],
        tolerances={k: asdict(v) for k, v in spec.tolerance.items()} if spec else {},
        target=job.target_gpu,
        manifest_toml=job.workload.manifest,
        env=env,
        harness_version=str(harness) if harness else HARNESS_FALLBACK,
        copy_ceiling_tbps=copy_ceiling,
        verification=[
            {
                "dims": v.dims,
                "heldout": v.heldout,
                "passed": v.passed,
                "rel_err": v.rel_err,
                "max_abs_err": v.max_abs_err,
                "reason": v.reason,
            }
            for v in verifications
        ],
        timing=[_timing_dict(t, samples=True) for t in timings],
        baselines=baselines,
        flags=[f.message for f in q.candidate_flags(candidate)],
        lineage={
            "parent": str(candidate.parent.code) if candidate.parent_id else None,
            "role": candidate.role,
            "backend": candidate.backend,
            "generation": candidate.generation.index,
            "note": candidate.note,
            "schedule": candidate.schedule,
        },
        review={
            "decision": decision.decision,
            "by": decision.reviewer.get_username(),
            "at": decision.created.isoformat(),
            "comment": decision.comment,
        },
    )


def _timing_dict(t, samples: bool = False) -> dict:
    d = {
        "dims": t.dims,
        "median_us": t.median_us,
        "p20_us": t.p20_us,
        "p80_us": t.p80_us,
        "ci_low_us": t.ci_low_us,
        "ci_high_us": t.ci_high_us,
        "bytes": t.bytes,
        "tbps": t.tbps,
        "sm_clock_mhz": t.sm_clock_mhz,
    }
    if samples:
        d["samples_us"] = t.samples_us
    return d


def artifact_filename(job: Job) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in job.workload.name)[:60]
    return f"{safe or 'kernel'}-{str(job.code)[:8]}.zip"


def decide_and_deliver(
    *, job: Job, reviewer, decision: str, comment: str, checklist: dict
) -> tuple[ReviewDecision, Artifact | None]:
    """Record the decision and, for an approval, build and store the artifact, all in one
    transaction: an approval whose artifact cannot be built is not recorded."""
    with transaction.atomic():
        review = services.review_decide(
            job=job, reviewer=reviewer, decision=decision, comment=comment, checklist=checklist
        )
        artifact = None
        if decision == ReviewDecision.APPROVE:
            job.refresh_from_db()
            candidate = Candidate.objects.select_related("generation", "parent").get(
                pk=review.candidate_id
            )
            built = build_artifact(
                artifact_inputs(job, candidate, review), created_at=review.created.isoformat()
            )
            artifact = services.artifact_record(
                job=job,
                candidate=candidate,
                filename=artifact_filename(job),
                content=built.data,
                user=reviewer,
            )
    notify_customer(job, review)
    return review, artifact


def notify_customer(job: Job, review: ReviewDecision) -> None:
    """Email the person who started the job (console backend in development). The job page
    shows the decision too, so a lost email loses nothing."""
    from portal.models import NotificationSettings

    user = job.created_by
    if user is None or not user.email:
        return
    if not NotificationSettings.wants(user, NotificationSettings.DECISION):
        return
    verb = "approved" if review.decision == ReviewDecision.APPROVE else "rejected"
    url = reverse("web-job", args=[job.code])
    body = (
        f"Your job for {job.workload.name} was {verb} by our engineers.\n\n"
        f"{review.comment or ''}\n\nSee it at {url}\n"
    )
    try:
        send_mail(
            f"[PTX Kernel Factory] {job.workload.name}: {verb}",
            body,
            None,
            [user.email],
            fail_silently=False,
        )
    except Exception:  # noqa: BLE001 - the decision stands even if the mail server is down
        log.exception("could not email %s about job %s", user.email, job.code)
