"""Writes still in the L2 when a kernel's end event fires: every entrant timed plain and drained.

Plain is the suite's timing: the 256 MB read flush before each run, one event pair around the
run. When the run ends, up to the L2's 60 MB of its last stores may still be dirty lines there,
not yet in DRAM, and the end event does not wait for them. Drained adds a second read flush
between the run and its end event: it evicts every dirty line, so their write-back lands inside
the pair. The flush's own time (after a flush, when no line is dirty) is timed in the same rounds
as the entrant "flush" and subtracted. What is left is the run with all of its writes in DRAM.

A rate above the copy ceiling that falls to or below it when drained was credited with writes
that had not finished; one that stays above it is the byte mix (reads outrun writes on HBM). The
copy of the same bytes and the 2 GiB copy of the ceiling are drained the same way, and where a
case reads twice what it writes (SiLU-mul), torch's a + b of the same bytes ("add_mix") is timed
beside it: the rate that mix of reads and writes reaches without any arithmetic of ours.

    python3 -m lab.probes.drain --out DIR --plan lab/plans/suite-2026-12-03s.json \\
        --ops silu_mul,relu2,rmsnorm,cross_entropy --shapes 3 --baselines torch_compile
"""

from __future__ import annotations

import argparse
import json
import os
import time


def drained_rows(op: str, plain: dict, drained: dict) -> list[dict]:
    """One row per entrant timed in both cases (run_case results at one shape): its plain time,
    its drained time less the flush's own, and the extra that the write-back took."""
    by_tag = {r["tag"]: r for r in drained["records"] if r.get("status") == "passed"}
    flush = by_tag.get("flush")
    if flush is None:
        raise ValueError("the drained case has no timed 'flush' entrant to subtract")
    nbytes = plain["bytes"]
    rows = []
    for r in plain["records"]:
        d = by_tag.get(r["tag"])
        if r["tag"] == "flush" or r.get("status") != "passed" or d is None:
            continue
        d_us = d["median_us"] - flush["median_us"]
        rows.append(
            {
                "op": op,
                "shape": "x".join(str(v) for v in plain["dims"].values()),
                "entrant": r["tag"] if r["impl"] != "ours" else "ours: " + r["tag"],
                "bytes": nbytes,
                "plain_us": r["median_us"],
                "drained_us": d_us,
                "flush_us": flush["median_us"],
                "extra_us": d_us - r["median_us"],
                "plain_tbps": nbytes / (r["median_us"] * 1e-6) / 1e12,
                "drained_tbps": nbytes / (d_us * 1e-6) / 1e12 if d_us > 0 else None,
            }
        )
    return rows


def ceiling(bench) -> dict:
    """The copy ceiling plain and drained, in TB/s (bytes read + written)."""
    out = {}
    for drain in (False, True):
        bench.drain = drain
        out["drained" if drain else "plain"] = bench.copy_ceiling_tbps()
    bench.drain = False
    return out


def table(rows: list[dict], ceil: dict) -> list[str]:
    out = [
        f"Copy ceiling (2 GiB): plain {ceil['plain']:.3f} TB/s, drained {ceil['drained']:.3f}.",
        "",
        "| op | shape | entrant | plain us | drained us | write-back us | plain of ceiling "
        "| drained of drained ceiling |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        dr = r["drained_tbps"]
        out.append(
            f"| {r['op']} | {r['shape']} | {r['entrant']} | {r['plain_us']:.1f} | "
            f"{r['drained_us']:.1f} | {r['extra_us']:+.1f} | "
            f"{r['plain_tbps'] / ceil['plain']:.1%} | "
            + (f"{dr / ceil['drained']:.1%} |" if dr else "- |")
        )
    return out


def main(argv=None) -> int:
    from bench import suite
    from bench.direct import Bench, environment, run_case
    from lab.probes import mover  # noqa: F401 - registers the "mover:" baselines

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="silu_mul,relu2,rmsnorm,cross_entropy")
    p.add_argument("--shapes", type=int, default=1, help="the first N suite shapes of each op")
    p.add_argument("--plan", help="candidates from this plan (bench.suite --make-plan)")
    p.add_argument("--top", type=int, default=3, help="the plan's first N schedules per shape")
    p.add_argument("--baselines", default="torch_compile")
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args(argv)
    if a.plan:
        with open(a.plan) as f:
            suite._PLAN.update(json.load(f))
    cat = suite._catalogue()
    bench = Bench()
    env = environment()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    ceil = ceiling(bench)
    print(f"copy ceiling {ceil}; {env}", flush=True)
    names = [b for b in a.baselines.split(",") if b] + ["copy", "add_mix", "flush"]
    rows, cases = [], []
    for op in a.ops.split(","):
        w, _, ir = cat[op]
        for dims in [dict(d) for d in w.shapes][: a.shapes]:
            scheds = suite.planned_schedules(op, ir, dims)[: a.top]
            got = {}
            for drain in (False, True):
                bench.drain = drain
                got[drain] = run_case(bench, w, ir, dims, scheds, names, reps=a.reps)
            bench.drain = False
            cases.append({"op": op, "plain": got[False], "drained": got[True]})
            new = drained_rows(op, got[False], got[True])
            rows += new
            for r in new:
                print(
                    f"[{time.monotonic() - t0:5.1f}s] {op} {r['shape']} {r['entrant']}: "
                    f"{r['plain_us']:.1f} -> {r['drained_us']:.1f} us",
                    flush=True,
                )
            for r in got[False]["records"] + got[True]["records"]:
                if r.get("status") not in ("passed", None):
                    print(f"    {r['tag']}: {r.get('status')} {r.get('reason', '')[:100]}")
    lines = table(rows, ceil)
    with open(os.path.join(a.out, "drain.json"), "w") as f:
        json.dump({"env": env, "ceiling": ceil, "rows": rows, "cases": cases}, f, indent=1)
    with open(os.path.join(a.out, "drain.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
