"""A wide schedule sweep on the GPU, for generator development (not the suite's record).

    PYTHONPATH=. python3 -m lab.probes.sweep --out DIR [--ops softmax,...] [--per-op 40]
        [--flush write|read|both] [--shape-index 0 | --dims M=2048,N=65536]

For each operator at one suite shape it takes a broad slice of the schedule space (16-byte
accesses, the nc load hint, plain stores, fast math where allowed; every thread/row/chunk/mode
layout, with and without register caps, a third at most streaming), screens it on the CPU
(compiled: no spills, no stack; `--save-plan FILE` does only this, `--plan FILE` reads it back),
then verifies every survivor against the float64 reference (bench.direct) and times them
interleaved with the plain Triton and torch eager baselines and a device-to-device copy of the
same bytes, with the chosen L2 flush before every run:
  write: a 256 MB memset (leaves the L2 full of dirty lines that the timed kernel must evict);
  read:  a 256 MB read (the L2 holds only clean lines that no entrant uses);
  both:  the whole sweep once with each, to see what the flush itself costs the entrants.
Writes DIR/sweep.json (every record, raw samples) and DIR/sweep.md (per operator, fastest
first), and prints the short table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from factory.families.row.schedules import default_schedule, fast_math_allowed, is_valid, space


def sweep_schedules(ir, dims, per_op: int) -> list:
    """A broad, deterministic slice of the space at `dims`, screened on the CPU."""
    from bench.suite import compile_cached
    from factory.compile import rejection_reason
    from factory.emit import emit

    vec = 16 // ir.min_elem_bytes()
    pool = []
    for s in space(ir, [dims]):
        if s.vec_elems != vec or s.store_hint != "none" or s.load_hint != "nc":
            continue
        if s.prefetch_rows or s.fast_math != fast_math_allowed(ir):
            continue
        if s.mode == "stream" and (s.min_threads_per_sm or (ir.online and not s.online)):
            continue  # streaming: the online pair where there is one, no register caps
        pool.append(s)
    # Rows in registers first (fewer threads per row first), then streaming; within each, the
    # plain register allocation before the caps.
    pool.sort(
        key=lambda s: (
            s.mode != "cached",
            s.threads_per_row,
            s.rows_per_block,
            s.chunks,
            s.min_threads_per_sm,
            not s.online,
            not s.keep_intermediates,
        )
    )
    # The generator's default first: every sweep says how far its best is from the default.
    default = default_schedule(ir, dims)
    if is_valid(ir, default, dims)[0]:
        pool.insert(0, default)
    out, streamed = [], 0
    for s in pool:
        if s in out:
            continue
        if not is_valid(ir, s, dims)[0]:
            continue
        if s.mode == "stream" and s is not default:
            if streamed >= per_op // 3:
                continue
            streamed += 1
        rep = compile_cached(emit(ir, s).ptx)
        if rejection_reason(rep, s.threads_per_block):
            continue
        out.append(s)
        if len(out) >= per_op:
            break
    # The L1::no_allocate hint on the first few, to keep measuring whether the hint matters.
    for s in list(out[:2]):
        alt = replace(s, load_hint="nc_noalloc")
        if alt not in out:
            out.append(alt)
    return out


def _dims(a, w) -> dict[str, int]:
    """The shape to sweep: --dims (names as in the operator's manifest) or a suite shape."""
    if not a.dims:
        return dict(w.shapes[min(a.shape_index, len(w.shapes) - 1)])
    dims = {k.strip(): int(v) for k, v in (kv.split("=") for kv in a.dims.split(","))}
    if set(dims) != set(w.shapes[0]):
        raise SystemExit(f"--dims {a.dims}: {w.name} needs {sorted(w.shapes[0])}")
    return dims


def main(argv=None) -> int:
    from bench import direct
    from bench.suite import OPS, _catalogue

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--per-op", type=int, default=40)
    p.add_argument("--flush", default="both", choices=("write", "read", "both"))
    p.add_argument("--shape-index", type=int, default=0)
    p.add_argument(
        "--dims", help="a shape of your own instead of a suite shape, e.g. M=2048,N=65536"
    )
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--save-plan", metavar="FILE", help="screen on this host, write FILE, stop")
    p.add_argument("--plan", metavar="FILE", help="the screened schedules from --save-plan")
    a = p.parse_args(argv)
    from pathlib import Path

    from factory.families.row.schedules import Schedule

    if a.save_plan:
        cat = _catalogue()
        plan = {}
        for op in a.ops.split(","):
            w, _m, ir = cat[op]
            dims = _dims(a, w)
            plan[op] = [s.to_dict() for s in sweep_schedules(ir, dims, a.per_op)]
        Path(a.save_plan).write_text(json.dumps(plan, indent=0))
        return 0
    plan = json.loads(Path(a.plan).read_text()) if a.plan else {}

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def log(m):
        print(f"[{time.monotonic() - t0:6.1f}] {m}", file=sys.stderr, flush=True)

    cat = _catalogue()
    bench = direct.Bench()
    env = direct.environment()
    flushes = ("write", "read") if a.flush == "both" else (a.flush,)
    ceilings = {}
    for f in flushes:
        bench.flush_mode = f
        ceilings[f] = bench.copy_ceiling_tbps()
        log(f"copy ceiling (2 GiB, {f} flush): {ceilings[f]:.3f} TB/s")
    results = []
    for op in a.ops.split(","):
        w, _manifest, ir = cat[op]
        dims = _dims(a, w)
        if op in plan:
            scheds = [Schedule.from_dict(d) for d in plan[op]]
        else:
            scheds = sweep_schedules(ir, dims, a.per_op)
        log(f"{op} {dims}: {len(scheds)} schedules after the CPU screen")
        for f in flushes:
            bench.flush_mode = f
            case = direct.run_case(
                bench, w, ir, dims, scheds, ["triton", "torch_eager", "copy"], reps=a.reps
            )
            case |= {"op": op, "flush": f}
            results.append(case)
            best = sorted(
                (r for r in case["records"] if r.get("status") == "passed"),
                key=lambda r: r["median_us"],
            )
            log(f"  {f}: " + ", ".join(f"{r['tag']} {r['median_us']:.1f}" for r in best[:4]))
    (out / "sweep.json").write_text(
        json.dumps({"env": env, "ceilings": ceilings, "cases": results}, indent=1)
    )
    lines = [f"# Sweep, {env.get('gpu')} driver {env.get('driver')}", ""]
    lines.append(
        "copy ceiling (2 GiB): " + ", ".join(f"{k} flush {v:.3f} TB/s" for k, v in ceilings.items())
    )
    summary = [
        "",
        "| op | flush | copy same bytes us | best ours | us | TB/s | triton us | eager us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in results:
        recs = {r["tag"]: r for r in case["records"]}
        ours = sorted(
            (r for r in case["records"] if r["impl"] == "ours" and r.get("status") == "passed"),
            key=lambda r: r["median_us"],
        )
        lines += [
            "",
            f"## {case['op']} {case['dims']} flush={case['flush']}",
            "",
            "| entrant | regs | status | median us | TB/s |",
            "|---|---|---|---|---|",
        ]
        for r in sorted(case["records"], key=lambda r: r.get("median_us", 1e18)):
            lines.append(
                f"| {r['tag']} | {r.get('registers', '')} | {r.get('status')} | "
                f"{r.get('median_us', float('nan')):.1f} | {r.get('tbps', 0):.3f} |"
            )

        def us(k, recs=recs):
            return f"{recs[k]['median_us']:.1f}" if recs.get(k, {}).get("median_us") else "-"

        b = ours[0] if ours else None
        summary.append(
            f"| {case['op']} | {case['flush']} | {us('copy')} | {b['tag'] if b else '-'} | "
            f"{b['median_us'] if b else float('nan'):.1f} | {b['tbps'] if b else 0:.3f} | "
            f"{us('triton')} | {us('torch_eager')} |"
        )
    (out / "sweep.md").write_text("\n".join(lines + summary) + "\n")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
