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


_CANDIDATE_COLUMNS = (
    "pk",
    "schedule",
    "ptx_sha256",
    "status",
    "reason",
    "role",
    "backend",
    "generation__index",
    "job__code",
    "job__target_gpu",
    "job__workload_id",
)


def candidate_records(candidates) -> list[dict]:
    """Evidence records for a queryset of candidates. Plain columns only (no model instances,
    no PTX, no raw timing samples): the agents read thousands of these every generation."""
    rows = list(candidates.values(*_CANDIDATE_COLUMNS))
    workload_ids = {r["job__workload_id"] for r in rows}
    workloads = {
        w.pk: w
        for w in Workload.objects.filter(pk__in=workload_ids).only(
            "pk", "sha256", "family", "manifest", "baseline_source", "baseline_filename"
        )
    }
    timings: dict[int, list[tuple]] = {}
    for cid, dims, median_us, tbps in (
        TimingResult.objects.filter(candidate_id__in=[r["pk"] for r in rows])
        .order_by("candidate_id", "dims_key")
        .values_list("candidate_id", "dims", "median_us", "tbps")
    ):
        timings.setdefault(cid, []).append((dims, median_us, tbps))
    records = []
    for c in rows:
        workload = workloads[c["job__workload_id"]]
        signature, dtype = workload_facts(workload)
        base = {
            "job": str(c["job__code"]),
            "workload_sha256": workload.sha256,
            "family": workload.family,
            "signature": signature,
            "dtype": dtype,
            "gpu": c["job__target_gpu"],
            "schedule": c["schedule"] or None,
            "ptx_sha256": c["ptx_sha256"],
            "status": c["status"],
            "reason": c["reason"],
            "generation": c["generation__index"],
            "role": c["role"],
            "backend": c["backend"],
        }
        measured = timings.get(c["pk"]) or []
        if not measured:
            records.append({**base, "dims": None, "median_us": None, "tbps": None})
        for dims, median_us, tbps in measured:
            records.append({**base, "dims": dims, "median_us": median_us, "tbps": tbps})
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
        candidates = Candidate.objects.all()
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
