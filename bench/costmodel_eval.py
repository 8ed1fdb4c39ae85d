"""How well the cost model ranks schedules, recomputed from recorded H200 evidence (no GPU).

    PYTHONPATH=. python3 -m bench.costmodel_eval [--sweeps 'GLOB'] [--loop EVIDENCE.jsonl]

1. Per operator, five-fold Spearman (folds by schedule) on the verified records of the schedule
   sweeps (bench/sweep.py output: every record has its schedule, shape, bytes and median).
2. Shape transfer within the sweeps: fitted on one suite shape's records, Spearman on the other
   shape's (both ways, the mean).
3. Transfer: fitted on the sweeps (suite shapes), Spearman on a loop run's verified job records
   (other shapes), per operator, next to five-fold Spearman on those job records alone.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys

from factory.costmodel import CostModel, held_out_spearman

SWEEPS = "bench/results/2026-12-02-h200-sweep/run*-shape*.json"
LOOP = "bench/results/2026-12-02-h200-loop2/evidence.jsonl"


def sweep_records(pattern: str) -> dict[str, list[dict]]:
    """Verified records of our kernels, per operator, from sweep files timed on a read flush."""
    out: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            data = json.load(f)
        for case in data["cases"]:
            if case.get("flush") != "read":
                continue
            for r in case["records"]:
                if r.get("impl") != "ours" or r.get("status") != "passed":
                    continue
                out.setdefault(case["op"], []).append(
                    {
                        "schedule": r["schedule"],
                        "dims": case["dims"],
                        "bytes": case["bytes"],
                        "median_us": r["median_us"],
                        "status": "passed",
                    }
                )
    return out


def loop_records(path: str) -> dict[str, list[dict]]:
    """Verified job records of a loop run, per operator (from the job name)."""
    out: dict[str, list[dict]] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") != "passed" or not r.get("median_us") or not r.get("schedule"):
                continue
            op = r["job"].split("-", 1)[-1]
            out.setdefault(op, []).append(r)
    return out


def shape_transfer(records: list[dict]) -> float | None:
    """Mean Spearman of a model fitted at one shape and scored at another, over ordered pairs."""
    by_shape: dict[str, list[dict]] = {}
    for r in records:
        by_shape.setdefault(json.dumps(r["dims"], sort_keys=True), []).append(r)
    scores = [
        CostModel().fit(train).score(test)
        for a, train in by_shape.items()
        for b, test in by_shape.items()
        if a != b
    ]
    scores = [x for x in scores if x is not None]
    return sum(scores) / len(scores) if scores else None


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", default=SWEEPS)
    p.add_argument("--loop", default=LOOP)
    a = p.parse_args(argv)
    sweeps = sweep_records(a.sweeps)
    loop = loop_records(a.loop) if a.loop else {}
    lines = [
        "| operator | sweep records | 5-fold on sweeps | shape to shape | loop records | "
        "sweeps -> loop | 5-fold on loop |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in sorted(set(sweeps) | set(loop)):
        s, lp = sweeps.get(op, []), loop.get(op, [])
        transfer = CostModel().fit(s).score(lp) if s and lp else None
        lines.append(
            f"| {op} | {len(s)} | {fmt(held_out_spearman(s) if s else None)} | "
            f"{fmt(shape_transfer(s) if s else None)} | {len(lp)} | "
            f"{fmt(transfer)} | {fmt(held_out_spearman(lp) if lp else None)} |"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
