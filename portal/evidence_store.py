"""The evidence the agents read, built from the database.

Implements factory.evidence's `EvidenceStore` protocol (`add`, `query`) over the portal's rows: one
record per candidate and benchmarked shape (or one record without dims for a candidate that never
got timed), in the format of docs/CONTRACTS.md / factory/evidence.py:

    {"job", "workload_sha256", "family", "signature", "dims", "dtype", "gpu", "schedule",
     "ptx_sha256", "status", "reason", "median_us", "tbps", "generation", "role", "backend"}

`add` is a no-op: the database is written by the pipeline's services, never by the agents.
Evidence crosses organisations only as schedules and numbers (never PTX or manifests): the
agents learn what wins for an operator family, which is the product's promise.
"""

from __future__ import annotations

from functools import lru_cache

from portal.models import Candidate, Job, TimingResult, Workload


@lru_cache(maxsize=256)
def _describe(manifest_sha256: str, manifest: str, baseline_source: str, baseline_filename: str):
    """(signature, dtype) of a workload, parsed once per manifest."""
    try:
        from factory.evidence import dtype_of, signature_of
        from factory.spec import load_manifest

        spec = load_manifest(
            manifest,
            baseline_source=baseline_source or None,
            baseline_filename=baseline_filename or None,
        )
    except Exception:
        # A workload that no longer parses (or a factory without its spec) still gives evidence
        # by family; only the structural signature and dtype are unknown.
        return "", ""
    return signature_of(spec), dtype_of(spec)


def workload_facts(workload: Workload) -> tuple[str, str]:
    return _describe(
        workload.sha256,
        workload.manifest,
        workload.baseline_source,
        workload.baseline_filename,
    )


def candidate_records(candidates) -> list[dict]:
    """Evidence records for an iterable of candidates (with job__workload selected)."""
    candidates = list(candidates)
    timings: dict[int, list[TimingResult]] = {}
    for t in TimingResult.objects.filter(candidate__in=candidates).order_by("dims_key"):
        timings.setdefault(t.candidate_id, []).append(t)
    records = []
    for c in candidates:
        workload = c.job.workload
        signature, dtype = workload_facts(workload)
        base = {
            "job": str(c.job.code),
            "workload_sha256": workload.sha256,
            "family": workload.family,
            "signature": signature,
            "dtype": dtype,
            "gpu": c.job.target_gpu,
            "schedule": c.schedule or None,
            "ptx_sha256": c.ptx_sha256,
            "status": c.status,
            "reason": c.reason,
            "generation": c.generation.index,
            "role": c.role,
            "backend": c.backend,
        }
        rows = timings.get(c.pk) or []
        if not rows:
            records.append({**base, "dims": None, "median_us": None, "tbps": None})
        for t in rows:
            records.append({**base, "dims": t.dims, "median_us": t.median_us, "tbps": t.tbps})
    return records


class DbEvidenceStore:
    """Evidence from every job's candidates. `job` (optional) is the job asking: its own rows are
    included like any other; the store never hides failures (they teach what to avoid)."""

    def __init__(self, job: Job | None = None):
        self.job = job

    def add(self, records: list[dict]) -> None:
        """The pipeline records results itself; records handed here are already stored."""

    def query(
        self,
        *,
        family: str | None = None,
        shape_class: str | None = None,
        dtype: str | None = None,
        gpu: str | None = None,
        job: str | None = None,
        workload_sha256: str | None = None,
        status: str | None = None,
    ) -> list[dict]:
        candidates = Candidate.objects.select_related("job__workload", "generation")
        if family is not None:
            candidates = candidates.filter(job__workload__family=family)
        if gpu is not None:
            candidates = candidates.filter(job__target_gpu=gpu)
        if job is not None:
            candidates = candidates.filter(job__code=job)
        if workload_sha256 is not None:
            candidates = candidates.filter(job__workload__sha256=workload_sha256)
        if status is not None:
            candidates = candidates.filter(status=status)
        records = candidate_records(candidates.order_by("pk"))
        if dtype is not None:
            records = [r for r in records if r["dtype"] == dtype]
        if shape_class is not None:
            from factory.evidence import shape_class as class_of

            records = [r for r in records if class_of(r["dims"] or {}) == shape_class]
        return records

    def all(self) -> list[dict]:
        return self.query()
