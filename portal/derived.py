"""Facts derived from what the pipeline writes, computed once when the row is written and stored
beside it, so that no page computes them again on every render:

- a workload's row lengths: the distinct lengths of the axis its operator family splits on,
  from lowering the manifest (`Workload.row_lengths`);
- a schedule's human label, through its operator family (`Candidate.schedule_label`);
- the cost model's rank correlation with the measured times over a generation's verified
  candidates, and over the whole job (`Generation.model_rho`, `Job.model_rho`).

Pure functions of plain data (no models), so the services and the migration that backfills old
rows compute them the same way. Each returns a neutral value ([], "", None) for data it cannot
read: a derived fact never stops a write.
"""

from __future__ import annotations

import math

HAND_WRITTEN = "hand-written PTX"


def row_lengths(spec) -> list[int]:
    """The distinct row lengths (the first axis the workload's family splits on) of a parsed
    workload's shapes, in order; [] when no family lowers it or the family splits on nothing.
    One kernel serves every shape of a job, so with more than one the workload page says what
    that costs."""
    if spec is None:
        return []
    try:
        from factory import families

        fam, ir = families.family_for(spec)
        split = fam.split_dims(ir)
        if not split:
            return []
        out: list[int] = []
        for dims in spec.shapes:
            n = int(dims[split[0]])
            if n not in out:
                out.append(n)
        return out
    except Exception:  # noqa: BLE001 - an operator the generator does not express
        return []


def manifest_row_lengths(
    manifest: str, baseline_source: str = "", baseline_filename: str = ""
) -> list[int]:
    """row_lengths of a stored manifest's text; [] when the spec refuses it."""
    try:
        from factory.spec import load_manifest

        spec = load_manifest(
            manifest,
            baseline_source=baseline_source or None,
            baseline_filename=baseline_filename or None,
        )
    except Exception:  # noqa: BLE001 - an old manifest the spec no longer reads
        return []
    return row_lengths(spec)


def schedule_label(schedule: dict | None, limit: int = 200) -> str:
    """What a candidate's schedule is, in a few words: its family's label, "customer kernel:
    ..." for an edit of the customer's kernel, "hand-written PTX" without a schedule."""
    if not schedule:
        return HAND_WRITTEN
    if not isinstance(schedule, dict):
        return str(schedule)[:limit]
    try:
        if schedule.get("ptx_edit"):
            from factory.agents.ptxedit import PtxEdit

            return ("customer kernel: " + PtxEdit.from_schedule(schedule).describe())[:limit]
        from factory import families

        return (families.label(schedule) or HAND_WRITTEN)[:limit]
    except Exception:  # noqa: BLE001 - a schedule the families no longer read
        return str(schedule)[:limit]


def rank_correlation(pairs: list[tuple[float, float]]) -> float | None:
    """Spearman rank correlation of (predicted, measured) pairs; None with fewer than three
    finite pairs or when either side is constant."""
    clean = [
        (float(p), float(m))
        for p, m in pairs
        if p is not None and m is not None and math.isfinite(p) and math.isfinite(m)
    ]
    if len(clean) < 3:
        return None
    try:
        from factory.costmodel import spearman

        rho = spearman([p for p, _ in clean], [m for _, m in clean])
    except Exception:  # noqa: BLE001 - no cost model installed
        return None
    return None if rho is None or not math.isfinite(rho) else float(rho)


def search_gains(rows: list[dict]) -> list[dict]:
    """Each generation row (`index`, `best_score_us` of its own candidates, `gpu_s` its GPU
    batch took, None when not run) with what the search has earned by then: `best_so_far_us`
    (the fastest of this and every earlier generation), `gain_pct` (how much faster that is than
    generation 0's best, in percent; None until generation 0 has a time) and `gpu_s_total` (the
    GPU-seconds of this and every earlier generation). Rows in index order; new dicts."""
    out = []
    best = None
    base = None
    spent = 0.0
    for row in sorted(rows, key=lambda r: r["index"]):
        score = row.get("best_score_us")
        if score is not None and math.isfinite(score) and score > 0:
            best = score if best is None else min(best, score)
            if row["index"] == 0:
                base = score
        gpu_s = row.get("gpu_s")
        if gpu_s is not None and math.isfinite(gpu_s) and gpu_s > 0:
            spent += gpu_s
        gain = (base / best - 1.0) * 100.0 if base is not None and best is not None else None
        out.append(dict(row, best_so_far_us=best, gain_pct=gain, gpu_s_total=spent))
    return out


def speedup_over_best_baseline(best_us: float | None, baseline_us: list[float]) -> float | None:
    """How many times faster the best kernel (`best_us`, its geometric-mean time) is than the
    fastest of `baseline_us` (the baselines' geometric-mean times from the same GPU run): above
    1 faster, below 1 slower; None without a finite positive time on either side."""

    def usable(x) -> bool:
        return x is not None and isinstance(x, int | float) and math.isfinite(x) and x > 0

    times = [float(x) for x in baseline_us if usable(x)]
    if not usable(best_us) or not times:
        return None
    return min(times) / float(best_us)
