"""The benchmark suite: generated kernels against every baseline, on the GPU, in one run.

    PYTHONPATH=. python3 -m bench.suite --out bench/results            # on a GPU host
    PYTHONPATH=. python3 -m bench.suite --report bench/results/<run>    # redraw table + chart

For every suite case (operator x shape) it emits a handful of schedules (compiled and screened on
the CPU first: no spills, no stack, registers within the file), puts them in one format-1 batch
per operator with the baselines, and hands it to `gpuworker.run_batch`, which verifies every
entrant at every shape and held-out shape, measures the copy ceiling, and times candidates and
baselines interleaved on the same inputs. The fastest verified candidate per shape is "ours".
Raw results (one JSON per operator, written as soon as it finishes), `table.md` and `chart.html`
land in `<out>/<date>-<card>/`, the card's model as nvidia-smi names it (h200, h100).

Options: --max-autotune adds torch.compile(mode="max-autotune") (minutes of compiling);
--ops/--shapes N narrow the run; --budget-s sets the timing budget per entrant; --direct times
only our kernels with bench.direct (no baselines; for generator development).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime

from bench.plotly_js import plotly_src
from factory.families.row.schedules import TAG_LEGEND, Schedule
from factory.families.row.seeds import CANDIDATES_PER_SHAPE, candidate_schedules  # noqa: F401 - bench's API
from gpuworker import plausibility

OPS = ("softmax", "cross_entropy", "rmsnorm", "layernorm", "add_rmsnorm", "silu_mul", "gelu_tanh")
# The suite shapes are the catalogue manifests' own `shapes` (bf16 16384x4096, 16384x8192,
# 32768x4096; cross-entropy 4096x32000 and 4096x128256).
BASELINES = ("torch_eager", "torch_compile", "triton")


# ---------------------------------------------------------------- candidates


_COMPILED: dict[str, object] = {}


def compile_cached(ptx: str):
    """compile_ptx, once per PTX text in this process (the suite screens, then runs)."""
    from factory.compile import compile_ptx

    if ptx not in _COMPILED:
        _COMPILED[ptx] = compile_ptx(ptx)
    return _COMPILED[ptx]


_PLAN: dict = {}


def planned_schedules(name: str, ir, dims) -> list[Schedule]:
    """The candidates for (op, dims): from the plan file when one was given (screened on a
    build host beforehand, so the GPU lease is not spent compiling the search), else now."""
    got = _PLAN.get(name, {}).get(_dims_key(dims))
    if got is None:
        return candidate_schedules(ir, dims)
    from factory.compile import rejection_reason
    from factory.emit import emit

    out = []
    for s in (Schedule.from_dict(d) for d in got):
        if s in out:
            # one schedule written twice (a plan merged from records older and newer than a
            # field, one with its default spelled out): time it once
            continue
        # A plan made with an older emitter may no longer fit its register cap: a prefetching
        # layout then gets the most blocks per SM that fit now, anything else is dropped.
        if not rejection_reason(compile_cached(emit(ir, s).ptx), s.threads_per_block):
            out.append(s)
        elif s.prefetch_rows:
            t = s.threads_per_block
            pf = _prefetch_variant(
                ir, replace(s, persistent_blocks_per_sm=0), below=s.min_threads_per_sm // t
            )
            if pf is not None and pf not in out:
                out.append(pf)
    return out


def make_plan(path: str, ops, shapes: int) -> None:
    cat = _catalogue()
    plan = {}
    for name in ops:
        w, _, ir = cat[name]
        plan[name] = {
            _dims_key(dict(d)): [s.to_dict() for s in candidate_schedules(ir, dict(d))]
            for d in w.shapes[:shapes]
        }
    with open(path, "w") as f:
        json.dump(plan, f, indent=1)


def plan_from_results(
    result_dirs: list[str], plan_files: list[str], top: int = 3
) -> dict[str, dict[str, list[dict]]]:
    """A plan of the `top` fastest verified schedules per (op, shape) across earlier suite runs
    (their raw_<op>.json), each shape's list in that order. Raw results name a candidate by its
    tag; the schedules behind the tags come from the plans those runs used (`plan_files`)."""
    by_tag: dict[str, dict] = {}
    for path in plan_files:
        with open(path) as f:
            for shapes in json.load(f).values():
                for entries in shapes.values():
                    for d in entries:
                        by_tag.setdefault(Schedule.from_dict(d).tag(), d)
    best: dict[str, dict[str, dict[str, float]]] = {}
    for out_dir in result_dirs:
        for fn in sorted(os.listdir(out_dir)):
            if not (fn.startswith("raw_") and fn.endswith(".json")):
                continue
            with open(os.path.join(out_dir, fn)) as f:
                raw = json.load(f)
            op = raw["suite"]["op"]
            for c in raw.get("candidates", []):
                tag = c["id"].split(":", 1)[1]
                if c["status"] != "passed" or tag not in by_tag:
                    continue
                for t in c.get("timing", []):
                    times = best.setdefault(op, {}).setdefault(_dims_key(t["dims"]), {})
                    times[tag] = min(times.get(tag, float("inf")), t["median_us"])
    return {
        op: {
            shape: [by_tag[t] for t in sorted(times, key=times.__getitem__)[:top]]
            for shape, times in shapes.items()
        }
        for op, shapes in best.items()
    }


def _prefetch_variant(ir, s: Schedule, below: int = 0) -> Schedule | None:
    """`s` with the next row prefetched, at the most blocks per SM that compile without local
    memory (the persistent grid must not exceed what is resident, or late blocks would start
    their rows only after the first ones finish)."""
    from factory.compile import rejection_reason
    from factory.emit import emit

    t = s.threads_per_block
    top = min(2048 // t, 16) if not below else below - 1
    for k in range(top, 1, -1):
        cand = replace(s, prefetch_rows=True, persistent_blocks_per_sm=k, min_threads_per_sm=k * t)
        if k * t % 256:
            continue
        rep = compile_cached(emit(ir, cand).ptx)
        if rep.ok and not rejection_reason(rep, t):
            return cand
    return None


ROW_IR_FAMILIES = ("row", "flat", "rowsplit")  # the families that lower through the row IR


def _catalogue():
    """The catalogue operators that lower through the row IR (the suite's kind), with their
    manifest text and IR; the attention, matmul and other families have their own benches."""
    from factory import families
    from factory.families.row.ir import lower
    from factory.spec import catalogue_manifest, load_catalogue

    cat = load_catalogue()
    return {
        name: (w, catalogue_manifest(name), lower(w))
        for name, w in cat.items()
        if families.name_for(w, default="none") in ROW_IR_FAMILIES
    }


def build_batch(
    name: str, manifest: str, ir, shapes: list[dict], baselines, budget_s: float, ir_heldout=()
):
    """One format-1 batch for one operator: the union of each shape's candidates."""
    from factory.emit import emit

    cands, seen = [], set()
    for dims in shapes:
        for s in planned_schedules(name, ir, dims):
            if s in seen:
                continue
            seen.add(s)
            em = emit(ir, s)
            cands.append(
                {
                    "id": f"{name}:{s.tag()}",
                    "ptx": em.ptx,
                    "entry": em.entry,
                    "params": [
                        {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name} for p in em.params
                    ],
                    "launch": {
                        "grid": list(em.launch.grid),
                        "block": list(em.launch.block),
                        "smem_bytes": em.launch.smem_bytes,
                        "cluster": None,
                    },
                    "schedule": s.to_dict(),
                }
            )
    # The manifest's own held-out shapes (one row, N off the vector width) plus a row longer
    # than any register capacity, which takes the streaming fallback.
    heldout = [dict(h) for h in ir_heldout] + [
        {d: (7 if d != ir.row_dim else 40000) for d in shapes[0]}
    ]
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "manifest": manifest,
        "baseline_source": None,
        "shapes": shapes,
        "heldout_shapes": heldout,
        "candidates": [{k: v for k, v in c.items() if k != "schedule"} for c in cands],
        "baselines": list(baselines),
        "options": {
            "time_budget_s_per_candidate": budget_s,
            "timeout_s_per_candidate": 60,
            "seed": None,
        },
    }
    return batch, {c["id"]: c["schedule"] for c in cands}


# ---------------------------------------------------------------- the run


def card_slug(name: str | None = None) -> str:
    """The results folder's card suffix: "h200" for "NVIDIA H200", "h100" for "NVIDIA H100 80GB
    HBM3"; nvidia-smi asked when no name is given (no CUDA in this process), "gpu" if it answers
    nothing usable, so a run on another card never lands in a folder named for the H200."""
    if name is None:
        import subprocess

        try:
            name = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "--id=0"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            name = ""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", name or "")
    return m.group(1).lower() if m else "gpu"


def baseline_names(args) -> list[str]:
    """--baselines, with max-autotune added under --max-autotune (worker and direct runs alike)."""
    baselines = [b for b in args.baselines.split(",") if b]
    if args.max_autotune and "torch_compile_max_autotune" not in baselines:
        baselines.append("torch_compile_max_autotune")
    return baselines


def run_suite(args) -> int:
    import gpuworker

    cat = _catalogue()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    out_dir = os.path.join(args.out, f"{stamp}-{card_slug()}")
    os.makedirs(out_dir, exist_ok=True)
    baselines = baseline_names(args)
    t0 = time.monotonic()
    for name in args.ops:
        if name not in cat:
            print(f"{name}: not in the catalogue, skipped", flush=True)
            continue
        if args.deadline_s and time.monotonic() - t0 > args.deadline_s:
            print(f"{name}: past the deadline, skipped", flush=True)
            continue
        w, manifest, ir = cat[name]
        shapes = [dict(d) for d in w.shapes][: args.shapes]
        batch, schedules = build_batch(
            name, manifest, ir, shapes, baselines, args.budget_s, w.heldout_shapes
        )
        batch["options"]["timed_outputs"] = args.timed_outputs
        print(
            f"[{time.monotonic() - t0:6.1f} s] {name}: {len(batch['candidates'])} candidates, "
            f"{len(shapes)} shapes",
            flush=True,
        )
        t1 = time.monotonic()
        res = gpuworker.run_batch(batch)
        res["suite"] = {
            "op": name,
            "schedules": schedules,
            "wall_s": time.monotonic() - t1,
            "bytes_per_shape": {
                _dims_key(d): ir.bytes_per_row(d[ir.row_dim]) * _rows(ir, d) for d in shapes
            },
        }
        with open(os.path.join(out_dir, f"raw_{name}.json"), "w") as f:
            json.dump(res, f, indent=1)
        for line in summarise(res)[:6]:
            print("   ", line, flush=True)
    report(out_dir)
    print(f"done in {time.monotonic() - t0:.1f} s -> {out_dir}", flush=True)
    return 0


def _rows(ir, dims) -> int:
    return math.prod(int(dims[d]) for d in ir.batch_dims) if ir.batch_dims else 1


def _dims_key(d: dict) -> str:
    return "x".join(str(d[k]) for k in sorted(d))


def summarise(res: dict) -> list[str]:
    out = []
    for c in res.get("candidates", []):
        t = ", ".join(f"{x['median_us']:.1f} us {x.get('tbps', 0):.2f} TB/s" for x in c["timing"])
        out.append(f"{c['id']}: {c['status']} {t} {c.get('reason', '')[:100]}")
    for b in res.get("baselines", []):
        t = ", ".join(f"{x['median_us']:.1f} us" for x in b.get("timing", []))
        out.append(f"{b['name']}: {b['status']} {t} {b.get('reason', '')[:80]}")
    return out


# ---------------------------------------------------------------- the table and the chart


def _timing_at(rec: dict, dims: dict):
    for t in rec.get("timing", []):
        if t["dims"] == dims:
            return t
    return None


def rows_from(raw: dict) -> list[dict]:
    """One table row per (shape, implementation): our best verified candidate and each
    baseline, with bandwidth, the fraction of the copy ceiling and speedups."""
    name = raw["suite"]["op"]
    ceiling = raw.get("copy_ceiling_tbps")
    mover = raw.get("byte_mover")  # the worker's judge_mix at each shape (from mover run 1 on)
    movers = plausibility.movers_by_shape(mover if isinstance(mover, list) else [])
    shapes = []
    for rec in raw.get("candidates", []) + raw.get("baselines", []):
        for t in rec.get("timing", []):
            if t["dims"] not in shapes:
                shapes.append(t["dims"])
    rows = []
    for dims in shapes:
        ours = None
        for c in raw.get("candidates", []):
            t = _timing_at(c, dims)
            if (
                c["status"] == "passed"
                and t
                and (ours is None or t["median_us"] < ours[1]["median_us"])
            ):
                ours = (c, t)
        base = []
        for b in raw.get("baselines", []):
            t = _timing_at(b, dims)
            if b["status"] == "passed" and t:
                base.append((b, t))
        best_base = min((t["median_us"] for _, t in base), default=None)
        compiled = [t["median_us"] for b, t in base if b["name"] == "torch_compile"]
        entries = ([("ours: " + ours[0]["id"].split(":", 1)[1], ours[1], True)] if ours else []) + [
            (b["name"], t, True) for b, t in base
        ]
        for impl, t, verified in entries:
            tbps = t.get("tbps")
            rows.append(
                {
                    "op": name,
                    "shape": "x".join(str(v) for v in dims.values()),
                    "dtype": "bf16",
                    "implementation": impl,
                    "verified": verified,
                    "median_us": t["median_us"],
                    "p20_us": t.get("p20_us"),
                    "p80_us": t.get("p80_us"),
                    "tbps": tbps,
                    "copy_ceiling_tbps": ceiling,
                    "fraction_of_ceiling": (tbps / ceiling) if (tbps and ceiling) else None,
                    "byte_mover_tbps": plausibility.mover_at(movers, dims),
                    "speedup_vs_best_baseline": (best_base / t["median_us"]) if best_base else None,
                    "speedup_vs_torch_compile": (compiled[0] / t["median_us"])
                    if compiled
                    else None,
                    "ours": impl.startswith("ours"),
                }
            )
    return rows


# The issue's targets: the share of the copy ceiling per operator, never slower than the best
# baseline, and the geometric mean of speedups over torch.compile.
CEILING_TARGET = {"cross_entropy": 0.80}
CEILING_TARGET_DEFAULT = 0.90
GEOMEAN_TARGET = 1.5


def summary_lines(rows: list[dict]) -> list[str]:
    """Ours against the best baseline, one line per (op, shape), and each target met or not;
    every entrant above the copy ceiling (beyond the worker's margin) named: with a + on ours
    where the byte mover of the same bytes is as fast (not flagged), a * where it is not."""
    out = [
        "| op (bf16) | shape | ours | us | TB/s | of copy ceiling | best baseline | its us "
        "| speedup | vs torch.compile |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    margin = plausibility.COPY_CEILING_MARGIN  # the worker's, so both say the same

    def over(frac) -> bool:
        return (frac or 0) > margin

    def at_mover(r) -> bool:
        """Explained by the byte mover of the same bytes, as the worker judges it (no flag)."""
        return plausibility.within_mover(r["tbps"], r.get("byte_mover_tbps"))

    def mark(r) -> str:
        if not over(r.get("fraction_of_ceiling")):
            return ""
        return "+" if at_mover(r) else "*"

    def named(r) -> str:
        mover = r.get("byte_mover_tbps")
        said = (
            f" (the byte mover of its bytes: {mover / r['copy_ceiling_tbps']:.1%})" if mover else ""
        )
        return (
            f"{'ours' if r['ours'] else r['implementation']} at {r['op']} {r['shape']} "
            f"{r['fraction_of_ceiling']:.1%}" + said
        )

    low, slower, speedups, bounds = [], [], [], []
    high = [r for r in rows if over(r.get("fraction_of_ceiling"))]
    above = [named(r) for r in high if not at_mover(r)]
    mixed = [named(r) for r in high if at_mover(r)]
    for r in rows:
        if not r["ours"]:
            continue
        base = [
            b for b in rows if not b["ours"] and b["op"] == r["op"] and b["shape"] == r["shape"]
        ]
        best = min(base, key=lambda b: b["median_us"], default=None)
        sp = r["speedup_vs_best_baseline"]  # rows_from's, over this same best baseline
        frac = r["fraction_of_ceiling"]
        out.append(
            f"| {r['op']} | {r['shape']} | {r['implementation'][6:]} | {r['median_us']:.1f} | "
            f"{r['tbps']:.2f} | {frac:.1%}{mark(r)} | {best['implementation']} | "
            f"{best['median_us']:.1f} | {sp:.3f}x | "
            f"{r['speedup_vs_torch_compile'] or 0:.2f}x |"
            if best
            else f"| {r['op']} | {r['shape']} | {r['implementation'][6:]} | "
            f"{r['median_us']:.1f} | {r['tbps']:.2f} | {frac:.1%}{mark(r)} | - | - | - | - |"
        )
        target = CEILING_TARGET.get(r["op"], CEILING_TARGET_DEFAULT)
        if frac is not None and frac < target:
            low.append(f"{r['op']} {r['shape']} {frac:.1%} (< {target:.0%})")
        if sp is not None and sp < 1.0:
            # Whether the two medians are apart by more than the runs' spread: our 20th
            # percentile above their 80th.
            apart = (r.get("p20_us") or 0) > (best.get("p80_us") or float("inf"))
            slower.append(
                f"{r['op']} {r['shape']} {1 / sp - 1:.2%} slower than {best['implementation']}"
                + ("" if apart else " (inside the p20-p80 spreads)")
            )
        if r["speedup_vs_torch_compile"]:
            speedups.append(r["speedup_vs_torch_compile"])
            # The most any kernel could have: the copy ceiling's time for these bytes (ours,
            # where we ran faster than a copy).
            bounds.append(r["speedup_vs_torch_compile"] / min(1.0, frac or 1.0))
    geo = math.exp(sum(math.log(x) for x in speedups) / len(speedups)) if speedups else 0.0
    geo_bound = math.exp(sum(math.log(x) for x in bounds) / len(bounds)) if bounds else 0.0
    n = len(speedups)
    out += [
        "",
        "Our schedules by tag: " + TAG_LEGEND,
        "",
        "Against the targets:",
        f"- share of the copy ceiling: {'met' if not low else 'not met: ' + '; '.join(low)}",
        f"- never slower than the best baseline: "
        f"{'met' if not slower else f'not met in {len(slower)}: ' + '; '.join(slower)}",
        f"- geometric mean over torch.compile ({n} cases): {geo:.3f}x "
        f"({'met' if geo >= GEOMEAN_TARGET else 'not met'}, target {GEOMEAN_TARGET}x); "
        f"at most {geo_bound:.3f}x against this run's torch.compile times, with every case "
        f"at the copy ceiling (or at our time, where that is faster)",
        f"- above the copy ceiling by more than {margin - 1:.0%}, within "
        f"{margin - 1:.0%} of the worker's byte mover of the same bytes (+: that "
        "mix of reads and writes, with nothing computed, moves as fast, so the worker does "
        "not flag it; reads outrun writes on HBM, bench/results/2026-12-03-h200-readonly/): "
        + ("; ".join(mixed) if mixed else "none"),
        f"- above the copy ceiling by more than {margin - 1:.0%} (flagged*: a "
        "measurement bug until explained; the byte mover's rate where the run measured it): "
        + ("; ".join(above) if above else "none"),
    ]
    return out


def host_gap_warning(raws: list[dict]) -> list[str]:
    """Lines for a run whose worker timed baselines without the stream hold (before 91849a6):
    their medians can include the host's dispatch time (see lab/probes/host_gaps.py)."""
    unheld = [
        raw["suite"]["op"]
        for raw in raws
        if raw.get("mode") != "direct"
        and any(
            t.get("hold_us") is None
            for b in raw.get("baselines", [])
            for t in b.get("timing") or []
        )
    ]
    if not unheld:
        return []
    return [
        "",
        f"**Timed without the stream hold** ({', '.join(unheld)}): the baselines' medians can "
        "include their host dispatch, which makes the comparisons above too kind to us; "
        "`python3 -m lab.probes.host_gaps <this folder> --write` recomputes them from the input "
        "sets that were queued behind other work.",
    ]


def report(out_dir: str) -> None:
    """Write table.md (and chart.html when plotly is importable) from the raw JSON files."""
    raws = []
    for fn in sorted(os.listdir(out_dir)):
        if fn.startswith("raw_") and fn.endswith(".json"):
            with open(os.path.join(out_dir, fn)) as f:
                raws.append(json.load(f))
    if not raws:
        return
    rows = [r for raw in raws for r in rows_from(raw)]
    env = raws[0].get("env", {})
    lines = [
        f"# Suite results, {env.get('started_at', '')[:10]}, {env.get('gpu', '?')}",
        "",
        f"GPU {env.get('gpu')}, driver {env.get('driver')}, "
        f"SM clock {env.get('sm_clock_mhz')} MHz; "
        f"cuda-core {env.get('cuda_core')}, cuda-bindings {env.get('cuda_bindings')}, "
        f"nvJitLink {env.get('nvjitlink')}, torch {env.get('torch')}, triton {env.get('triton')}.",
        f"Measured through {raws[0].get('mode', 'gpuworker.run_batch')}. Bytes count each "
        "input read once and each output written once; copy ceiling = device-to-device copy "
        "measured in the same run.",
        "",
        "| op | shape | dtype | implementation | verified | median_us | TB/s | copy ceiling | "
        "fraction of ceiling | speedup vs best baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    for r in rows:
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['implementation']} | "
            f"{'yes' if r['verified'] else 'no'} | {f(r['median_us'], '.1f')} | "
            f"{f(r['tbps'], '.2f')} | {f(r['copy_ceiling_tbps'], '.2f')} | "
            f"{f(r['fraction_of_ceiling'], '.0%')} | {f(r['speedup_vs_best_baseline'], '.2f')} |"
        )
    ours = [r for r in rows if r["ours"]]
    sp = [r["speedup_vs_torch_compile"] for r in ours if r["speedup_vs_torch_compile"]]
    if sp:
        geo = math.exp(sum(math.log(x) for x in sp) / len(sp))
        lines += ["", f"Geomean speedup of ours over torch.compile: {geo:.2f}x ({len(sp)} cases)."]
    lines += ["", "Failed or rejected entrants:"]
    for raw in raws:
        for rec in raw.get("candidates", []) + raw.get("baselines", []):
            if rec["status"] != "passed":
                who = rec.get("id") or rec.get("name")
                lines.append(f"- {raw['suite']['op']} {who}: {rec['status']} {rec['reason'][:200]}")
    warn = host_gap_warning(raws)
    with open(os.path.join(out_dir, "table.md"), "w") as fh:
        fh.write("\n".join(lines + warn) + "\n")
    with open(os.path.join(out_dir, "summary.md"), "w") as fh:
        fh.write("\n".join(summary_lines(rows) + warn) + "\n")
    with open(os.path.join(out_dir, "rows.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    try:
        import plotly.graph_objects as go
    except ImportError:
        return
    fig = go.Figure()
    impls = sorted({("ours" if r["ours"] else r["implementation"]) for r in rows})
    for impl in impls:
        sel = [r for r in rows if ("ours" if r["ours"] else r["implementation"]) == impl]
        fig.add_bar(
            name=impl,
            x=[f"{r['op']} {r['shape']}" for r in sel],
            y=[r["fraction_of_ceiling"] for r in sel],
        )
    fig.update_layout(
        barmode="group",
        title=f"Fraction of the copy ceiling, {env.get('gpu', '')}",
        yaxis={"title": "achieved / copy bandwidth", "tickformat": ".0%"},
    )
    path = os.path.join(out_dir, "chart.html")
    fig.write_html(path, include_plotlyjs=plotly_src(path))


# ---------------------------------------------------------------- direct mode (development)


def main_direct(args) -> int:
    """Everything in one process (bench.direct): for short leases and generator development."""
    from bench.direct import Bench, as_results, environment, run_case

    cat = _catalogue()
    bench = Bench()
    env = environment()
    stamp = env["started_at"][:10]
    out_dir = os.path.join(args.out, f"{stamp}-{card_slug(env['gpu'])}")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    ceiling = bench.copy_ceiling_tbps()
    print(f"copy ceiling {ceiling:.2f} TB/s; {env}", flush=True)
    baselines = baseline_names(args)
    done = {}
    for name in args.ops:
        if name not in cat:
            continue
        if args.deadline_s and time.monotonic() - t0 > args.deadline_s:
            print(f"{name}: past the deadline, skipped", flush=True)
            continue
        try:
            w, _, ir = cat[name]
            cases, tried = [], []
            for dims in [dict(d) for d in w.shapes][: args.shapes]:
                scheds = planned_schedules(name, ir, dims)
                tried += [s for s in scheds if s not in tried]
                case = run_case(bench, w, ir, dims, scheds, baselines)
                cases.append(case)
                for r in case["records"]:
                    print(
                        f"[{time.monotonic() - t0:5.1f}s] {name:13s} {_dims_key(dims):12s} "
                        f"{r['tag']:30s} {r.get('status', '?'):8s} "
                        f"{r.get('median_us', 0):8.1f} us {r.get('tbps', 0):5.2f} TB/s "
                        f"({r.get('tbps', 0) / ceiling:4.0%}) regs {r.get('registers', '-')} "
                        f"err {r.get('rel_err', 0):.1e} {r.get('reason', '')[:80]}",
                        flush=True,
                    )
            # Every schedule tried must also be right at the held-out shapes (all rows checked),
            # including a row past any register capacity (the streaming fallback).
            long_row = {d: (7 if d != ir.row_dim else 40000) for d in w.shapes[0]}
            for dims in [dict(d) for d in w.heldout_shapes] + [long_row]:
                case = run_case(bench, w, ir, dims, tried, [], reps=0)
                cases.append(case)
                bad = [r for r in case["records"] if r.get("status") != "verified"]
                print(
                    f"[{time.monotonic() - t0:5.1f}s] {name:13s} held-out {_dims_key(dims):12s} "
                    f"{len(case['records']) - len(bad)}/{len(case['records'])} verified "
                    + "; ".join(f"{r['tag']}: {r.get('reason', '')[:60]}" for r in bad),
                    flush=True,
                )
            done[name] = cases
            res = as_results(name, cases, ceiling, env)
            with open(os.path.join(out_dir, f"raw_{name}.json"), "w") as f:
                json.dump(res, f, indent=1)
        except Exception:  # noqa: BLE001 - one operator's failure must not lose the others
            import traceback

            traceback.print_exc()
            print(f"{name}: failed, see the traceback above", flush=True)
    report(out_dir)
    # torch.compile compiles once per shape (dynamic=False): seconds each. Time it at the first
    # shape of each operator while the lease lasts.
    for name, cases in done.items():
        if not args.compile_deadline_s or time.monotonic() - t0 > args.compile_deadline_s:
            break
        w, _, ir = cat[name]
        try:
            extra = run_case(bench, w, ir, cases[0]["dims"], [], ["torch_compile"])
        except Exception as e:  # noqa: BLE001 - recorded in the log, the rest still lands
            print(f"{name}: torch.compile failed: {e}", flush=True)
            continue
        cases[0]["records"] += extra["records"]
        for r in extra["records"]:
            print(
                f"[{time.monotonic() - t0:5.1f}s] {name:13s} {_dims_key(cases[0]['dims']):12s} "
                f"{r['tag']:30s} {r.get('status', '?'):8s} {r.get('median_us', 0):8.1f} us "
                f"{r.get('tbps', 0):5.2f} TB/s {r.get('reason', '')[:80]}",
                flush=True,
            )
        with open(os.path.join(out_dir, f"raw_{name}.json"), "w") as f:
            json.dump(as_results(name, cases, ceiling, env), f, indent=1)
        report(out_dir)
    print(f"done in {time.monotonic() - t0:.1f} s -> {out_dir}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--shapes", type=int, default=3, help="the first N suite shapes of each op")
    p.add_argument("--budget-s", type=float, default=0.5, help="timing budget per entrant")
    p.add_argument("--max-autotune", action="store_true")
    p.add_argument("--baselines", default=",".join(BASELINES))
    p.add_argument(
        "--deadline-s", type=float, default=0, help="start no new operator after this many s"
    )
    p.add_argument(
        "--compile-deadline-s",
        type=float,
        default=0,
        help="--direct: then add torch.compile at each op's first shape until this many s",
    )
    p.add_argument(
        "--timed-outputs",
        choices=("shared", "guarded"),
        default="shared",
        help="where our kernels' timed runs write beside torch baselines (gpuworker Options)",
    )
    p.add_argument("--direct", action="store_true")
    p.add_argument("--report", metavar="DIR", help="only redraw table.md/chart.html in DIR")
    p.add_argument("--plan", help="read the candidates from this file (see --make-plan)")
    p.add_argument("--make-plan", metavar="FILE", help="screen candidates here, write FILE")
    p.add_argument(
        "--plan-from",
        metavar="DIR,DIR",
        help="with --make-plan: the --top fastest verified schedules of these suite runs "
        "(their plans given by --plans), instead of screening",
    )
    p.add_argument("--plans", default="bench/plans/suite-*.json", help="a glob, for --plan-from")
    p.add_argument("--top", type=int, default=3)
    args = p.parse_args(argv)
    args.ops = [o for o in args.ops.split(",") if o]
    if args.make_plan and args.plan_from:
        plan = plan_from_results(
            args.plan_from.split(","), sorted(glob.glob(args.plans)), top=args.top
        )
        with open(args.make_plan, "w") as f:
            json.dump({op: plan[op] for op in args.ops if op in plan}, f, indent=1)
        return 0
    if args.make_plan:
        make_plan(args.make_plan, args.ops, args.shapes)
        return 0
    if args.plan:
        with open(args.plan) as f:
            _PLAN.update(json.load(f))
    if args.report:
        report(args.report)
        return 0
    if args.direct:
        return main_direct(args)
    return run_suite(args)


if __name__ == "__main__":
    sys.exit(main())
