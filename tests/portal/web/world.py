"""Jobs with recorded evidence for the page, API and review tests, made through the real
services (results recorded from a results file in the contract's format)."""

from __future__ import annotations

import uuid

from portal import services
from portal.models import Candidate, Generation, GpuBatch, Job, Workload, sha256_hex
from tests.portal.conftest import SIMPLE_PTX
from tests.portal.results_files import results_for

SHAPES = [{"M": 64, "N": 1024}, {"M": 4096, "N": 4096}]
HELDOUT = [{"M": 1, "N": 4095}]


def job_in_review(
    org, user, *, name="softmax", candidates=3, failing=(), flagged=False, base_us=10.0
):
    """A one-generation job whose batch came back from the GPU and which now waits for review.
    Candidate 0 is the fastest (results_for gives candidate i a time of base_us + i)."""
    job, results = job_on_the_gpu(
        org,
        user,
        name=name,
        candidates=candidates,
        failing=failing,
        flagged=flagged,
        base_us=base_us,
    )
    services.results_record(results=results)
    services.generation_finish(generation=job.generations.get(index=0))
    job.refresh_from_db()
    assert job.status == Job.REVIEW, job.status
    return job


def job_on_the_gpu(
    org, user, *, name="softmax", candidates=3, failing=(), flagged=False, base_us=10.0
):
    """A one-generation job whose batch is out to a GPU, and the results file that batch will
    bring back (not yet recorded)."""
    manifest = f'name = "{name}"\n# {uuid.uuid4()}\n'
    workload = Workload.objects.create(
        org=org, name=name, manifest=manifest, sha256=sha256_hex(manifest), created_by=user
    )
    job = Job.objects.create(
        workload=workload,
        status=Job.WAITING_GPU,
        created_by=user,
        max_generations=1,
        current_generation=0,
        stage=Job.STAGE_GPU,
    )
    generation = Generation.objects.create(job=job, index=0, status=Generation.GPU)
    results = batch_on_the_gpu(
        generation, candidates=candidates, failing=failing, flagged=flagged, base_us=base_us
    )
    return job, results


def batch_on_the_gpu(generation, *, candidates=3, failing=(), flagged=False, base_us=10.0):
    """`candidates` new candidates of `generation`, in a batch out to a GPU; the results file
    it will bring back (not yet recorded)."""
    job = generation.job
    made = []
    for i in range(candidates):
        tag = f"variant {i}" if generation.index == 0 else f"g{generation.index} v{i}"
        ptx = SIMPLE_PTX.replace("//", f"// {tag}", 1)
        made.append(
            Candidate.objects.create(
                job=job,
                generation=generation,
                ptx=ptx,
                ptx_sha256=sha256_hex(ptx),
                status=Candidate.QUEUED,
                role="writer",
                backend="offline",
                entry="copy_k",
                params=[
                    {"kind": "tensor", "ptx_type": "u64", "name": "x"},
                    {"kind": "tensor", "ptx_type": "u64", "name": "y"},
                    {"kind": "dim", "ptx_type": "u32", "name": "N"},
                ],
                launch={"grid": [64, 1, 1], "block": [256, 1, 1], "smem_bytes": 0, "cluster": None},
                compile_report={"ok": True, "arch": "sm_90", "registers": 10},
                note=tag,
            )
        )
    code = uuid.uuid4()
    batch_doc = {
        "format": 1,
        "batch_id": str(code),
        "shapes": SHAPES,
        "heldout_shapes": HELDOUT,
        "candidates": [{"id": str(c.code)} for c in made],
    }
    GpuBatch.objects.create(
        code=code, job=job, generation=generation, status=GpuBatch.DISPATCHED, batch=batch_doc
    )
    results = results_for(batch_doc, failing={str(made[i].code) for i in failing}, base_us=base_us)
    if flagged:
        results["candidates"][0]["flags"] = ["above_copy_ceiling: 5.1 TB/s > 4.28 TB/s"]
    return results


def job_between_generations(job: Job) -> Job:
    """`job` (one generation recorded, its candidates verified) put back to searching, with its
    next generation being proposed: what a job looks like between generations."""
    Job.objects.filter(pk=job.pk).update(
        status=Job.RUNNING,
        stage=Job.STAGE_PROPOSING,
        max_generations=4,
        current_generation=1,
        stop_reason="",
        finished=None,
    )
    Generation.objects.create(job=job, index=1)
    job.refresh_from_db()
    return job
