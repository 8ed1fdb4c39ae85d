"""Tables of one round2_run.sh folder, generated from its JSON files (so a README's numbers are
the files' numbers).

    python3 -m lab.matmul.round2_report bench/results/2026-12-07-h100-matmul-2/round1
    python3 -m lab.matmul.round2_report bench/results/2026-12-07-h100-matmul-3 \
        --gemm-steps unaligned/unaligned_check,unaligned/unaligned_time,cluster,kprobe

Sections: the checks of every step (and any that failed), each gemm_bench step's timings (our
kernels interleaved with cuBLAS through torch, medians, speed ratio torch time / ours), and each
issue48_bench step's records (best verified schedule against eager and max-autotune) with its
summary.
"""

from __future__ import annotations

import argparse
import json
import os

from lab.matmul.issue48_report import _short

GEMM_STEPS = ("verify", "skinny", "maxnreg", "align")
ISSUE_STEPS = ("fused", "plain")


def _load(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _shape(s) -> str:
    return "x".join(str(x) for x in s)


def checks_table(folder: str, gemm_steps=GEMM_STEPS, issue_steps=ISSUE_STEPS) -> list[str]:
    out = ["| step | checks | passed | failed (op, schedule, shape) |", "|---|---|---|---|"]
    for step in (*gemm_steps, *issue_steps):
        name = "gemm_bench.json" if step in gemm_steps else "issue48_bench.json"
        data = _load(os.path.join(folder, step, name))
        if data is None:
            out.append(f"| {step} | no results | | |")
            continue
        checks = data.get("checks", [])
        bad = [c for c in checks if not c.get("ok")]
        fails = "; ".join(f"{c['op']} {c['schedule']} {_shape(c['shape'])}" for c in bad) or "-"
        extra = []
        if data.get("hang"):
            extra.append(f"hang: {data['hang']}")
        if data.get("errors"):
            extra.append(f"errors: {len(data['errors'])}")
        note = f" ({', '.join(extra)})" if extra else ""
        out.append(f"| {step} | {len(checks)} | {len(checks) - len(bad)} | {fails}{note} |")
    return out


def gemm_timings(folder: str, step: str) -> list[str]:
    data = _load(os.path.join(folder, step, "gemm_bench.json"))
    if not data or not data.get("timings"):
        return [f"({step}: no timings)"]
    comp = data.get("compile", {})
    out = [
        "| op | shape | kernel | compiled by | regs | us (p20-p80) | TFLOP/s | vs torch | SM MHz |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in data["timings"]:
        rows = sorted(t["rows"].items(), key=lambda kv: kv[1]["median_us"])
        for name, r in rows:
            c = comp.get(f"{t['op']}/{name}", {})
            by = "cuBLAS" if name == "torch" else c.get("compiler", "nvjitlink")
            lab = "torch eager" if name == "torch" else name
            clk = "-".join(str(x) for x in t.get("sm_clock_mhz", []) if x)
            out.append(
                f"| {t['op']} | {_shape(t['shape'])} | {lab} | {by} | {c.get('registers', '')} "
                f"| {r['median_us']:.1f} ({r['p20_us']:.1f}-{r['p80_us']:.1f}) "
                f"| {r['tflops']:.1f} | {r.get('vs_torch', 1.0):.3f} | {clk} |"
            )
    return out


def issue_records(folder: str, step: str) -> list[str]:
    data = _load(os.path.join(folder, step, "issue48_bench.json"))
    if not data or not data.get("records"):
        return [f"({step}: no records)"]
    out = [
        "| shape | op | ours: best verified | us | eager us | max-autotune us | vs eager "
        "| vs best baseline | others (us) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["records"]:
        rows = r.get("rows", {})
        best = r.get("best")
        ours = {k: v for k, v in rows.items() if k not in ("eager", "max_autotune")}
        if not best or best not in rows:
            out.append(f"| {_shape(r['shape'])} | {r['op']} | none verified | | | | | | |")
            continue
        ma = rows.get("max_autotune", {}).get("median_us")
        others = ", ".join(
            f"{_short(k)} {v['median_us']:.1f}"
            for k, v in sorted(ours.items(), key=lambda kv: kv[1]["median_us"])
            if k != best
        )
        star = "*" if r.get("heldout") else ""
        out.append(
            f"| {_shape(r['shape'])}{star} | {r['op']} | {_short(best)} | "
            f"{rows[best]['median_us']:.1f} | {rows['eager']['median_us']:.1f} | "
            f"{f'{ma:.1f}' if ma else '-'} | {r.get('vs_eager', float('nan')):.3f} | "
            f"{r.get('vs_best_baseline', float('nan')):.3f} | {others} |"
        )
    if data.get("summary"):
        out += ["", f"summary: `{json.dumps(data['summary'])}`"]
    return out


def report(folder: str, gemm_steps=GEMM_STEPS, issue_steps=ISSUE_STEPS) -> str:
    """The checks of every step, then the timings of each gemm_bench step that has any, then
    each issue48_bench step's records."""
    parts = ["### Checks (float64 reference, before any timing)", ""]
    parts += checks_table(folder, gemm_steps, issue_steps)
    for step in gemm_steps:
        data = _load(os.path.join(folder, step, "gemm_bench.json"))
        if data is not None and not data.get("timings"):
            continue  # a checks-only step
        parts += ["", f"### {step}/ (gemm_bench: interleaved with torch, medians)", ""]
        parts += gemm_timings(folder, step)
    for step in issue_steps:
        parts += ["", f"### {step}/ (issue48_bench; * = held-out shape)", ""]
        parts += issue_records(folder, step)
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument(
        "--gemm-steps",
        default=",".join(GEMM_STEPS),
        help="comma-separated gemm_bench step folders (default: round2_run.sh's)",
    )
    ap.add_argument(
        "--issue-steps",
        default=None,
        help="comma-separated issue48_bench step folders (default: round2_run.sh's; with "
        "--gemm-steps given and this not, none)",
    )
    args = ap.parse_args(argv)
    gemm = tuple(x for x in args.gemm_steps.split(",") if x)
    if args.issue_steps is not None:
        issue = tuple(x for x in args.issue_steps.split(",") if x)
    else:
        issue = ISSUE_STEPS if gemm == GEMM_STEPS else ()
    print(report(args.folder, gemm, issue), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
