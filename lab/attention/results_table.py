"""Markdown tables of an attention GPU run (lab/attention/bench.py's JSON files), for its README.

    python -m lab.attention.results_table bench/results/2026-12-07-h100-attention

Reads `run1/attention_check.json` (the check phase), `run1/attention_time.json` (the time
phase: its first pass gives our kernels, SDPA and eager) and, where present,
`run2-flex/attention_time.json` (the flex pass re-run after the score_mod fix: flex and our
kernels timed side by side). Flex
numbers from run1 are not used: that bench rebuilt flex's closures every call (see the README).
Prints markdown: the check summary, then one table per variant.

A folder holding attention_check.json and attention_time.json itself (the one-pass bench of
round 2 on) gets per variant the best kernel beside SDPA / flex, and every schedule's TFLOP/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PEAK_BF16 = 989.0  # H100 SXM dense bf16 tensor-core peak, TFLOP/s
SDPA = ("sdpa flash", "sdpa cudnn")


def shape_label(shape: list) -> str:
    b, h, hkv, s, d = shape
    gqa = f"({hkv} kv)" if hkv != h else ""
    return f"{b}x{h}{gqa}x{s}x{d}"


def best_ours(rows: dict) -> tuple[str, float]:
    """(schedule label, TFLOP/s) of our fastest kernel among the rows."""
    ours = {k[5:]: v["tflops"] for k, v in rows.items() if k.startswith("ours ")}
    lab = max(ours, key=ours.get)
    return lab, ours[lab]


def load(folder: Path) -> dict:
    run1 = json.loads((folder / "run1" / "attention_time.json").read_text())
    first = {}
    for t in run1["timings"]:
        if t["pass"] == "first":  # noqa: S105
            first[(t["variant"], t["causal"], tuple(t["shape"]))] = t
    flex = {}
    run2 = folder / "run2-flex" / "attention_time.json"
    if run2.exists():
        for t in json.loads(run2.read_text())["timings"]:
            if t["pass"] == "flex":  # noqa: S105
                flex[(t["variant"], t["causal"], tuple(t["shape"]))] = t
    check = json.loads((folder / "run1" / "attention_check.json").read_text())
    return {"first": first, "flex": flex, "check": check, "run1": run1}


def check_summary(check: dict) -> list[str]:
    cs = check["checks"]
    out = ["| variant | causal | checks | passed | max rel. error O | max rel. error LSE |"]
    out.append("|---|---|---|---|---|---|")
    keys = sorted({(c["variant"], c["causal"]) for c in cs}, key=str)
    for v, causal in keys:
        sel = [c for c in cs if c["variant"] == v and c["causal"] == causal]
        o = max(c["o"]["rel_norm"] for c in sel)
        lse = max(c["lse"]["rel_norm"] for c in sel if c.get("lse"))
        n_ok = sum(bool(c["ok"]) for c in sel)
        out.append(f"| {v} | {causal} | {len(sel)} | {n_ok} | {o:.2e} | {lse:.2e} |")
    shapes = sorted({shape_label(c["shape"]) for c in cs})
    scheds = sorted({c["schedule"] for c in cs})
    out.append("")
    out.append(
        f"{sum(bool(c['ok']) for c in cs)} of {len(cs)} checks passed; shapes: "
        + ", ".join(shapes)
        + "; schedules: "
        + ", ".join(scheds)
        + "."
    )
    return out


def fmt(x: float | None, nd: int = 0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def variant_table(data: dict, variant: str) -> list[str]:
    first, flex = data["first"], data["flex"]
    keys = [k for k in first if k[0] == variant]
    out = [
        "| shape | causal | ours best (schedule) | % of peak | sdpa flash | sdpa cudnn | eager "
        "| flex (run2) | ours in run2 | ours/flex | ours / best plain SDPA |"
    ]
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        t = first[k]
        rows = t["rows"]
        lab, ours = best_ours(rows)
        sd = {n: rows[n]["tflops"] if n in rows else None for n in SDPA}
        eager = rows["eager"]["tflops"] if "eager" in rows else None
        plain = first.get(("plain", k[1], k[2]))
        best_plain = max(plain["rows"][n]["tflops"] for n in SDPA if n in plain["rows"])
        fx = flex.get(k)
        if fx and "flex compiled" in fx["rows"]:
            f_tf = fx["rows"]["flex compiled"]["tflops"]
            lab2, ours2 = best_ours(fx["rows"])
            f_cell, o2_cell, ratio = fmt(f_tf), f"{ours2:.0f} ({lab2})", f"{ours2 / f_tf:.2f}x"
        else:
            f_cell = "invalid (run1)"
            o2_cell, ratio = "-", "-"
        out.append(
            f"| {shape_label(list(k[2]))} | {k[1]} | {ours:.0f} ({lab}) "
            f"| {100 * ours / PEAK_BF16:.0f}% "
            f"| {fmt(sd['sdpa flash'])} | {fmt(sd['sdpa cudnn'])} | {fmt(eager, 1)} | {f_cell} "
            f"| {o2_cell} | {ratio} | {ours / best_plain:.2f}x |"
        )
    return out


def agreement(data: dict) -> str:
    """Largest relative error of our kernels against a baseline after timing (timed shapes)."""
    worst = 0.0
    n = 0
    for t in list(data["first"].values()) + list(data["flex"].values()):
        for r in t["rows"].values():
            for v in (r.get("after_timing_rel_vs") or {}).values():
                worst, n = max(worst, v), n + 1
    return (
        f"{n} comparisons of our output against a baseline after timing, "
        f"largest relative error {worst:.4f}"
    )


def load_one(folder: Path) -> dict:
    """A run of the one-pass bench (round 2 on): attention_check.json and attention_time.json
    in `folder`, every case timed once beside its baselines (SDPA for plain, flex for the
    variants)."""
    run = json.loads((folder / "attention_time.json").read_text())
    cases = {(t["variant"], t["causal"], tuple(t["shape"])): t for t in run["timings"]}
    check = json.loads((folder / "attention_check.json").read_text())
    return {"cases": cases, "check": check, "run": run}


def one_pass_table(data: dict, variant: str) -> list[str]:
    """Per case: our best kernel, the baselines, ours over flex and over the best plain SDPA
    back end (same shape and causality, same run)."""
    cases = data["cases"]
    out = [
        "| shape | causal | ours best (schedule) | % of peak | sdpa flash | sdpa cudnn | flex "
        "| ours/flex | ours / best plain SDPA |"
    ]
    out.append("|---|---|---|---|---|---|---|---|---|")
    for k, t in cases.items():
        if k[0] != variant:
            continue
        rows = t["rows"]
        if not any(n.startswith("ours ") for n in rows):
            continue
        lab, ours = best_ours(rows)
        sd = {n: rows[n]["tflops"] if n in rows else None for n in SDPA}
        plain = cases.get(("plain", k[1], k[2]))
        best_plain = None
        if plain is not None and any(n in plain["rows"] for n in SDPA):
            best_plain = max(plain["rows"][n]["tflops"] for n in SDPA if n in plain["rows"])
        f_tf = rows["flex compiled"]["tflops"] if "flex compiled" in rows else None
        out.append(
            f"| {shape_label(list(k[2]))} | {k[1]} | {ours:.0f} ({lab}) "
            f"| {100 * ours / PEAK_BF16:.0f}% "
            f"| {fmt(sd['sdpa flash'])} | {fmt(sd['sdpa cudnn'])} | {fmt(f_tf)} "
            f"| {'-' if f_tf is None else f'{ours / f_tf:.2f}x'} "
            f"| {'-' if best_plain is None else f'{ours / best_plain:.2f}x'} |"
        )
    return out


def schedule_table(data: dict, variant: str) -> list[str]:
    """TFLOP/s of each of our kernels per case (the schedules side by side)."""
    cases = {k: t for k, t in data["cases"].items() if k[0] == variant}
    labs: list[str] = []
    for t in cases.values():
        for n in t["rows"]:
            if n.startswith("ours ") and n[5:] not in labs:
                labs.append(n[5:])
    if not labs:
        return []
    out = ["| shape | causal | " + " | ".join(labs) + " |"]
    out.append("|---|---|" + "---|" * len(labs))
    for k, t in cases.items():
        cells = [
            fmt(t["rows"][f"ours {lab}"]["tflops"]) if f"ours {lab}" in t["rows"] else "-"
            for lab in labs
        ]
        out.append(f"| {shape_label(list(k[2]))} | {k[1]} | " + " | ".join(cells) + " |")
    return out


def main_one(folder: Path) -> int:
    data = load_one(folder)
    env = data["run"]["env"]
    print(f"<!-- generated by python -m lab.attention.results_table {folder} -->")
    print(f"GPU {env['gpu']} ({env['sms']} SMs), torch {env['torch']}, CUDA {env['cuda']}.")
    print("TFLOP/s of the unmasked work; medians of the timed runs; dense bf16 peak 989 TFLOP/s.")
    print()
    print("### Correctness (check phase)")
    print()
    print("\n".join(check_summary(data["check"])))
    print()
    print(agreement({"first": data["cases"], "flex": {}}) + ".")
    for v in ("plain", "softcap", "alibi", "window", "document"):
        if not any(k[0] == v for k in data["cases"]):
            continue
        print()
        print(f"### {v}")
        print()
        print("\n".join(one_pass_table(data, v)))
        print()
        print("\n".join(schedule_table(data, v)))
    errors = data["run"].get("errors", []) + data["check"].get("errors", [])
    if errors:
        print()
        print("### Errors and skipped cases")
        print()
        for e in errors:
            print(f"- {e}")
    return 0


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else "bench/results/2026-12-07-h100-attention")
    if (folder / "attention_time.json").exists():
        return main_one(folder)
    data = load(folder)
    env = data["run1"]["env"]
    print(f"<!-- generated by python -m lab.attention.results_table {folder} -->")
    print(f"GPU {env['gpu']} ({env['sms']} SMs), torch {env['torch']}, CUDA {env['cuda']}.")
    print("TFLOP/s of the unmasked work; medians of 7 timed runs; dense bf16 peak 989 TFLOP/s.")
    print()
    print("### Correctness (check phase)")
    print()
    print("\n".join(check_summary(data["check"])))
    print()
    print(agreement(data) + ".")
    for v in ("plain", "softcap", "alibi", "window", "document"):
        if not any(k[0] == v for k in data["first"]):
            continue
        print()
        print(f"### {v}")
        print()
        print("\n".join(variant_table(data, v)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
