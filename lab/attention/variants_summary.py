"""The issue-49 criteria from one time phase's JSON (lab/attention/variants_run.sh): for each
variant, shape and causal flag, our fastest kernel beside flex_attention compiled (target: at
least 2.5x faster) and beside plain SDPA's best back end at the same shape and causal flag, both
in TFLOP/s of the unmasked work (target: at least 0.9x).

    python3 -m lab.attention.variants_summary OUT/attention_time.json
"""

from __future__ import annotations

import json
import sys


def rows(data: dict) -> list[dict]:
    """One row per timed (variant, shape, causal) other than plain."""
    plain = {}
    for rec in data.get("timings", []):
        if rec["variant"] == "plain":
            best = max(
                (r["tflops"] for lab, r in rec["rows"].items() if lab.startswith("sdpa")),
                default=None,
            )
            plain[(tuple(rec["shape"]), rec["causal"])] = best
    out = []
    for rec in data.get("timings", []):
        if rec["variant"] == "plain":
            continue
        ours = {lab: r for lab, r in rec["rows"].items() if lab.startswith("ours")}
        if not ours:
            continue
        lab, best = min(ours.items(), key=lambda kv: kv[1]["median_us"])
        flex = rec["rows"].get("flex compiled")
        sdpa = plain.get((tuple(rec["shape"]), rec["causal"]))
        out.append(
            {
                "variant": rec["variant"],
                "causal": rec["causal"],
                "shape": "x".join(str(x) for x in rec["shape"]),
                "ours": lab[5:],
                "ours_us": best["median_us"],
                "ours_tflops": best["tflops"],
                "x_flex": flex["median_us"] / best["median_us"] if flex else None,
                "of_sdpa": best["tflops"] / sdpa if sdpa else None,
            }
        )
    return out


def fmt(x, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0])) if x is None else format(x, spec)


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "attention_time.json"
    with open(path) as f:
        data = json.load(f)
    table = rows(data)
    print(
        f"{'variant':9s} {'causal':6s} {'shape':18s} {'ours':16s} {'us':>9s} {'TFLOP/s':>8s} "
        f"{'x flex':>7s} {'of SDPA':>8s}  (targets: x flex >= 2.5, of SDPA >= 0.9)"
    )
    for r in table:
        print(
            f"{r['variant']:9s} {str(r['causal']):6s} {r['shape']:18s} {r['ours']:16s} "
            f"{r['ours_us']:9.1f} {r['ours_tflops']:8.1f} {fmt(r['x_flex'], '7.2f')} "
            f"{fmt(r['of_sdpa'], '8.2f')}"
        )
    checks = data.get("checked_from")
    print(
        f"{len(table)} rows; checked kernels from {checks}; errors: {len(data.get('errors', []))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
