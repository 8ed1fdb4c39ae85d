"""The search benchmark's report: markdown from lab.search.replay's result.

    PYTHONPATH=. python3 -m lab.search.report DIR/replay.json [-o DIR/README.md]

Per job (one shape of the sweep): the sweep's best, how many schedules are within 2% of it, and
per strategy the median GPU-seconds to get there (quartiles beside it; "never" when half or more
of its runs did not get there), then the two ratios the issue's Done-when line names, their
medians over jobs and whether they hold; last, each strategy's median curve: the best so far
over the sweep's best after each generation, with the GPU-seconds spent by then.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics


def _num(x) -> float | None:
    if x in ("inf", "-inf"):
        return math.inf if x == "inf" else -math.inf
    return x


def _s(x) -> str:
    x = _num(x)
    if x is None:
        return "-"
    if math.isinf(x):
        return "never"
    return f"{x:.3f}"  # a sweep's cell costs about 0.01 GPU-second


def _r(x) -> str:
    x = _num(x)
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.4f}" if x < 0.1 else f"{x:.2f}"  # an agents / random ratio can be ~0.003


NAMES = {
    "random": "random search",
    "agents_cold": "offline agents, cold",
    "agents_warm": "offline agents, warm (other shapes)",
    "costmodel": "cost model alone (warm)",
}


def curves(result: dict, job: str, strategy: str, generations: int = 12) -> list[tuple]:
    """Median over runs, per generation: (generation, GPU-seconds spent, best so far / sweep
    best). A run that stopped (it reached the target) keeps its last step."""
    row = next(j for j in result["jobs"] if j["job"] == job)
    runs = [r for r in result["runs"] if r["job"] == job and r["strategy"] == strategy]
    out = []
    for g in range(generations):
        spent, rel = [], []
        for r in runs:
            steps = r["steps"]
            if not steps:
                continue
            s = steps[min(g, len(steps) - 1)]
            if s["best_us"] is None:
                continue
            rel.append(s["best_us"] / row["best_us"])
            spent.append(s["gpu_s"] if g < len(steps) else steps[-1]["gpu_s"])
        if rel:
            out.append((g, statistics.median(spent), statistics.median(rel)))
    return out


def render(result: dict) -> str:
    p = result.get("params") or {}
    sweep = result.get("sweep") or {}
    env = sweep.get("env") or {}
    lines = [
        "# Search benchmark, replayed from a sweep (issue 53)",
        "",
        f"Sweep: `{sweep.get('path', '?')}` on {env.get('gpu', 'an unrecorded GPU')}"
        + ("" if sweep.get("complete", True) else " (cut short: a sample of each shape)")
        + ". GPU-seconds are the sweep's recorded check and timing seconds per schedule"
        + (" plus its compile seconds" if sweep.get("with_compile") else "")
        + f". Population {p.get('population')} a generation; warm starts read "
        f"{p.get('warm_generations')} generations of cold agents' jobs at every other shape.",
        "",
        "## GPU-seconds to reach within 2% of the sweep's best (median over runs)",
        "",
        "| job (MxNxK) | timed | within 2% | best us | "
        + " | ".join(NAMES[s] for s in NAMES)
        + " | agents / random | warm / cold | model / random |",
        "|---|---|---|---|" + "---|" * len(NAMES) + "---|---|---|",
    ]
    for j in result["jobs"]:
        cells = []
        for s in NAMES:
            st = j["strategies"].get(s)
            if not st:
                cells.append("-")
                continue
            cells.append(
                f"{_s(st['median_s'])} ({_s(st['p25_s'])}-{_s(st['p75_s'])}; "
                f"{st['reached']}/{st['runs']})"
            )
        lines.append(
            f"| {j['job']} | {j['timed']}/{j['space']} | {j['within_2pct']} | "
            f"{j['best_us']:.1f} | "
            + " | ".join(cells)
            + f" | {_r(j['agents_over_random'])} | {_r(j['warm_over_cold'])} | "
            f"{_r(j['costmodel_over_random'])} |"
        )
    a = _num(result.get("median_agents_over_random"))
    w = _num(result.get("median_warm_over_cold"))
    m = _num(result.get("median_costmodel_over_random"))
    lines += [
        "",
        "Cells: median GPU-seconds (quartiles; runs that reached / runs).",
        "",
        "## The issue's lines",
        "",
        f"- Offline agents over random search, median over jobs: **{_r(a)}** (needs <= 0.33): "
        + ("holds." if result.get("agents_third_of_random") else "does not hold."),
        f"- Warm start over a cold job, median over jobs: **{_r(w)}** (needs <= 0.50): "
        + ("holds." if result.get("warm_half_of_cold") else "does not hold."),
        f"- Cost model alone over random search, median over jobs: {_r(m)}.",
        "",
        "## Median curves: best so far / sweep best, after each generation (GPU-s spent)",
        "",
    ]
    for j in result["jobs"]:
        lines.append(f"### {j['job']}")
        lines.append("")
        lines.append("| generation | " + " | ".join(NAMES[s] for s in NAMES) + " |")
        lines.append("|---|" + "---|" * len(NAMES))
        per = {s: dict((g, (sp, rel)) for g, sp, rel in curves(result, j["job"], s)) for s in NAMES}
        for g in range(12):
            cells = []
            for s in NAMES:
                v = per[s].get(g)
                cells.append("-" if v is None else f"{v[1]:.3f} ({v[0]:.3f} s)")
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
        lines.append("")
    unmeasured = sum(
        st.get("unmeasured", 0) for j in result["jobs"] for st in j["strategies"].values()
    )
    if unmeasured:
        cost = (
            "cost nothing (the sweep's sample is the space)"
            if sweep.get("measured_only") and not sweep.get("charge_unmeasured")
            else "cost the table's mean"
        )
        lines.append(
            f"{unmeasured} proposals named schedules the sweep has no time for; each {cost} and "
            "gave no time."
        )
    return "\n".join(lines) + "\n"


def write_report(result: dict, path: str) -> None:
    with open(path, "w") as f:
        f.write(render(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replay")
    ap.add_argument("-o", "--output", default="")
    args = ap.parse_args(argv)
    with open(args.replay) as f:
        result = json.load(f)
    text = render(result)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
