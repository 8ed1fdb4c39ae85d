"""The finished example every fresh install shows: a softmax job of the demo organisation whose
GPU results are a real recording, made on an H200 by `python -m gpuworker run` on exactly these
kernels (the batch in `demo_data/softmax_batch.json`, its results in
`demo_data/softmax_h200_results.json`). It goes through the same services as a live job: the
batch is recorded, the generation finished, an engineer's approval builds the artifact. The job
page says that its results are a recording, on which card and when (`RECORDING_SOURCE`)."""

from __future__ import annotations

import ast
import hashlib
import json
import logging
from pathlib import Path

from django.db import transaction

log = logging.getLogger("portal.demo")

DATA = Path(__file__).resolve().parent / "demo_data"
BATCH_FILE = DATA / "softmax_batch.json"
RESULTS_FILE = DATA / "softmax_h200_results.json"
# GpuBatch.source of a batch whose results were replayed from a recording, not run here.
RECORDING_SOURCE = "recording"
WORKLOAD_NAME = "softmax_example"
COMMENT = (
    "The finished example: every number on this page was measured on an NVIDIA H200 on "
    "2026-12-02 for exactly these kernels, and replayed onto this install. Approved so you can "
    "see the whole story, from charts to the downloadable artifact."
)


def _schedule(ptx: str) -> dict:
    """The schedule the emitter wrote into the PTX's header comment ({} when there is none)."""
    for line in ptx.splitlines()[:8]:
        if line.startswith("// schedule: "):
            try:
                value = ast.literal_eval(line.removeprefix("// schedule: "))
            except (ValueError, SyntaxError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def demo_example_create(*, org, customer, engineer):
    """The finished example job for `org`, made once: returns the job, or None when the
    organisation already has it (a second seed changes nothing)."""
    from factory import families
    from portal import services
    from portal.delivery import decide_and_deliver
    from portal.models import Candidate, Generation, GpuBatch, Job, Workload, sha256_hex

    if Workload.objects.filter(org=org, name=WORKLOAD_NAME).exists():
        return None
    batch_doc = json.loads(BATCH_FILE.read_text())
    results = json.loads(RESULTS_FILE.read_text())
    if GpuBatch.objects.filter(code=batch_doc["batch_id"]).exists():
        return None  # the recording's ids are taken (another organisation's example)
    manifest = batch_doc["manifest"].replace('name = "softmax"', f'name = "{WORKLOAD_NAME}"', 1)
    with transaction.atomic():
        workload = services.workload_create(org=org, user=customer, manifest=manifest)
        job = Job.objects.create(
            workload=workload,
            status=Job.WAITING_GPU,
            stage=Job.STAGE_GPU,
            created_by=customer,
            max_generations=1,
            current_generation=0,
            population=len(batch_doc["candidates"]),
            target_gpu=workload.target_gpu,
        )
        generation = Generation.objects.create(job=job, index=0, status=Generation.GPU)
        recorded = {e["id"]: e for e in results["candidates"]}
        for c in batch_doc["candidates"]:
            schedule = _schedule(c["ptx"])
            Candidate.objects.create(
                code=c["id"],
                job=job,
                generation=generation,
                ptx=c["ptx"],
                ptx_sha256=sha256_hex(c["ptx"]),
                status=Candidate.QUEUED,
                role="writer",
                backend="offline",
                schedule=schedule,
                schedule_label=families.label(schedule)[:200] if schedule else "",
                entry=c["entry"],
                params=c["params"],
                launch=c["launch"],
                compile_report=recorded.get(c["id"], {}).get("compile"),
                note="recorded example",
            )
            # The results answer this batch's kernels: say so by their hash.
            if c["id"] in recorded:
                recorded[c["id"]]["ptx_sha256"] = hashlib.sha256(c["ptx"].encode()).hexdigest()
        GpuBatch.objects.create(
            code=batch_doc["batch_id"],
            job=job,
            generation=generation,
            arch=job.target_gpu,
            status=GpuBatch.DISPATCHED,
            batch=batch_doc,
        )
        services.results_record(results=results, source=RECORDING_SOURCE)
        services.generation_finish(generation=Generation.objects.get(pk=generation.pk))
        job.refresh_from_db()
        if job.status != Job.REVIEW:
            raise RuntimeError(f"the recorded example ended {job.status}, not in review")
        checks, _, _ = _checklist(job)
        decide_and_deliver(
            job=job,
            reviewer=engineer,
            decision="approve",
            comment=COMMENT,
            checklist=checks,
        )
    job.refresh_from_db()
    return job


def _checklist(job):
    """The review checklist as the review page records it, with the default baseline."""
    from portal import selectors as q

    best = job.best_candidate
    checks, speed, baselines = q.review_checklist(job, best, None)
    chosen = q.default_baseline(baselines, q.candidate_timings(best))
    out = {c.key: {"ok": c.ok, "detail": c.detail} for c in checks}
    out["baseline"] = chosen
    out["override"] = not all(c.ok for c in checks)
    return out, speed, baselines


def recording_of(job) -> dict | None:
    """For a job whose GPU results were replayed from a recording: the card and the date it was
    measured on ({"gpu": ..., "date": ...}); None for a job measured here."""
    from portal.models import GpuBatch

    batch = (
        GpuBatch.objects.filter(job=job, source=RECORDING_SOURCE)
        .select_related("environment")
        .order_by("-id")
        .first()
    )
    if batch is None:
        return None
    env = (batch.results or {}).get("env") or {}
    return {
        "gpu": env.get("gpu") or "a GPU",
        "sm": env.get("sm") or job.target_gpu,
        "date": str(env.get("started_at") or "")[:10],
    }


def demo_example_seed(
    *, org_name: str = "Acme", customer: str = "demo", engineer: str = "engineer"
):
    """`seed_demo`'s one call: the finished example for the demo organisation, once. Returns the
    job made, or None (already there, or the demo accounts are missing)."""
    from django.contrib.auth import get_user_model

    from portal.models import Organisation

    User = get_user_model()
    org = Organisation.objects.filter(name=org_name).first()
    who = {u.username: u for u in User.objects.filter(username__in=[customer, engineer])}
    if org is None or customer not in who or engineer not in who:
        return None
    try:
        return demo_example_create(org=org, customer=who[customer], engineer=who[engineer])
    except Exception:  # noqa: BLE001 - the portal starts without its example rather than not at all
        log.exception("the finished example could not be made")
        return None
