"""The same suite cases in several runs, side by side: how far each entrant's median moves from
run to run, and whether "never slower than the best baseline" holds in each run.

    PYTHONPATH=. python3 -m lab.probes.repeats RUN_DIR [RUN_DIR ...] [--out FILE]

Each RUN_DIR holds a suite run's rows.json (`bench.suite` writes it). Where one run's verdict at
a case is decided by less than the run-to-run spread of the medians, that case is a tie that a
single run cannot settle; this table shows which cases those are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict


def load_runs(dirs: list[str]) -> list[list[dict]]:
    """Each run's rows, in the order given; a folder without rows.json is an error."""
    runs = []
    for d in dirs:
        path = os.path.join(d, "rows.json")
        if not os.path.exists(path):
            raise SystemExit(f"{d}: no rows.json (not a suite run's folder)")
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    return runs


def _entrant(row: dict) -> str:
    return "ours" if row["ours"] else row["implementation"]


def compare(runs: list[list[dict]]) -> list[dict]:
    """One record per (op, shape) present in every run: each entrant's verified medians by run,
    the best baseline and our ratio to it by run, and the spread of each entrant's medians
    across runs, relative to its fastest."""
    by_case: dict[tuple, list[dict]] = defaultdict(lambda: [{} for _ in runs])
    for k, rows in enumerate(runs):
        for r in rows:
            if r.get("verified") and r.get("median_us"):
                by_case[(r["op"], r["shape"])][k][_entrant(r)] = r["median_us"]
    out = []
    for (op, shape), per_run in sorted(by_case.items()):
        if not all("ours" in m for m in per_run):
            continue
        entrants = sorted({e for m in per_run for e in m}, key=lambda e: (e != "ours", e))
        medians = {e: [m.get(e) for m in per_run] for e in entrants}
        verdicts = []
        for m in per_run:
            base = {e: t for e, t in m.items() if e != "ours"}
            best = min(base, key=base.get) if base else None
            verdicts.append(
                {"best": best, "ratio": base[best] / m["ours"] if best else None}  # >1: ours faster
            )
        pooled = {e: statistics.median(t for t in v if t) for e, v in medians.items()}
        pooled_base = {e: t for e, t in pooled.items() if e != "ours"}
        pooled_best = min(pooled_base, key=pooled_base.get) if pooled_base else None
        spread = {
            e: (max(v) / min(v) - 1.0) if all(v) and len(v) > 1 else None
            for e, v in medians.items()
        }
        out.append(
            {
                "op": op,
                "shape": shape,
                "medians_us": medians,
                "verdicts": verdicts,
                "never_slower_runs": sum(1 for v in verdicts if v["ratio"] and v["ratio"] >= 1.0),
                "run_to_run_spread": spread,
                "pooled_us": pooled,
                "pooled_best": pooled_best,
                "pooled_ratio": pooled_base[pooled_best] / pooled["ours"] if pooled_best else None,
            }
        )
    return out


def table(records: list[dict], names: list[str]) -> list[str]:
    """Markdown: per case and entrant, the median of each run and the spread across runs; then
    per case, our ratio to the best baseline in each run."""
    n = len(names)
    head = "| op | shape | entrant | " + " | ".join(names) + " | spread across runs |"
    lines = [head, "|---|---|---|" + "---|" * n + "---|"]
    for rec in records:
        for e, meds in rec["medians_us"].items():
            cells = " | ".join("-" if t is None else f"{t:.1f}" for t in meds)
            sp = rec["run_to_run_spread"][e]
            lines.append(
                f"| {rec['op']} | {rec['shape']} | {e} | {cells} | "
                f"{'-' if sp is None else f'{sp:.1%}'} |"
            )
    lines += [
        "",
        "| op | shape | " + " | ".join(names) + " | never slower | median of the runs |",
        "|---|---|" + "---|" * n + "---|---|",
    ]
    for rec in records:
        cells = " | ".join(
            "-" if not v["best"] else f"{v['ratio']:.3f}x vs {v['best']}" for v in rec["verdicts"]
        )
        pooled = (
            f"{rec['pooled_ratio']:.3f}x vs {rec['pooled_best']}" if rec["pooled_best"] else "-"
        )
        lines.append(
            f"| {rec['op']} | {rec['shape']} | {cells} | {rec['never_slower_runs']} of {n} "
            f"| {pooled} |"
        )
    lines += [
        "",
        "Medians in us, verified entrants only. Spread: the slowest run's median over the "
        "fastest's, minus one. Ratio: the best baseline's median over ours (above 1: ours faster); "
        "median of the runs: the same with each entrant's median over the runs.",
    ]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="suite run folders (each with rows.json)")
    p.add_argument("--out", help="also write the table here (and FILE.json with the records)")
    args = p.parse_args(argv)
    records = compare(load_runs(args.runs))
    names = [f"run {k + 1}" for k in range(len(args.runs))]
    text = "\n".join(table(records, names)) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(
                "Runs: "
                + ", ".join(f"{n} = {d}" for n, d in zip(names, args.runs, strict=True))
                + "\n\n"
            )
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
            json.dump({"runs": args.runs, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
