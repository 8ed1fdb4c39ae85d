"""Issue 6 on a GPU host: the self-improving loop against the generator's best, warm starts, the
cost model, and a customer's kernel made faster.

    PYTHONPATH=. python3 -m lab.probes.loop_run --out $OUT            # on the H200 (gpuworker)
    PYTHONPATH=. python3 -m lab.probes.loop_run --out /tmp/x --fake   # plumbing check on a CPU box
    PYTHONPATH=. python3 -m lab.probes.loop_run --render results.json --out DIR   # charts only

What it runs (each stage is skipped, and says so, once the time budget is spent):
1. per catalogue operator (softmax, rmsnorm, cross_entropy by default), at one benchmarked shape:
   a sweep of the generator's schedule space (all of it when small, else a stratified sample
   that includes the default schedule) and a cold job of the offline loop; per-generation best
   curves, and whether the loop came within 5% of the sweep's best;
2. for the first operator: a warm-start job at a similar shape (half the rows) seeded from the
   cold job's evidence, against a cold job at that same shape (separate evidence);
3. the cost model: Spearman rank correlation of its predictions, fitted on the loop's evidence,
   against the sweep's measurements (held out), and the GPU time the loop saved (candidates it
   never benchmarked: pruned by the model, or never needed compared with the sweep);
4. a customer's CUDA C kernel from factory/examples through the loop, against itself;
5. with `--prior GLOB` (schedule sweeps recorded by lab/probes/sweep.py on the same GPU, at other
   shapes): per operator, a job whose evidence memory holds only that recorded evidence, against
   the cold job's curve, and the cost model fitted on it alone ranking this run's sweep.
Writes results.json, report.md, evidence.jsonl, sweep.jsonl and charts.html (plotly, when
importable) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

from bench.plotly_js import plotly_src
from factory import evidence as ev
from factory import families
from factory.agents.context import workload_bytes
from factory.costmodel import CostModel, held_out_spearman
from factory.loop import JobHistory, records_from_results, run_job

MAX_SHAPE_BYTES = 160 * 2**20  # keeps the float64 references and input sets quick
JOB_CAP_S = 40.0  # no one job may take the time the other stages need
OPTIONS = {"time_budget_s_per_candidate": 0.12, "timeout_s_per_candidate": 20}


def log(msg: str) -> None:
    print(f"[loop_run {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- shapes ------------------------------------------------------------------------------------


def fit_shape(w, dims: dict, row_dim: str | None) -> dict:
    """Halve the non-row dims until the operator moves at most MAX_SHAPE_BYTES."""
    dims = dict(dims)
    while workload_bytes(w, dims) > MAX_SHAPE_BYTES:
        others = [d for d in dims if d != row_dim and dims[d] > 1]
        if not others:
            break
        big = max(others, key=lambda d: dims[d])
        dims[big] = max(1, dims[big] // 2)
    return dims


def small_heldout(w, dims: dict, row_dim: str | None) -> list[dict]:
    picks = [dict(h) for h in w.heldout_shapes if workload_bytes(w, h) <= 32 * 2**20][:2]
    if not picks:
        h = {d: 3 for d in dims}
        if row_dim:
            h[row_dim] = max(1, dims[row_dim] - 1)
        picks = [h]
    return picks


def with_shapes(w, shapes: list[dict], heldout: list[dict]):
    return dataclasses.replace(w, shapes=tuple(shapes), heldout_shapes=tuple(heldout))


# --- the sweep ---------------------------------------------------------------------------------


def sweep_schedules(gen, ir, dims: dict, limit: int, seed: int) -> tuple[list, int]:
    space = gen.space(ir, [dims])
    if len(space) <= limit:
        return list(space), len(space)
    rng = random.Random(seed)
    picked = []
    if gen.default_schedule is not None:
        try:
            picked.append(gen.default_schedule(ir, dims))
        except Exception as exc:  # noqa: BLE001 - a sweep without the default still stands
            log(f"no default schedule: {exc}")
    # stratified: round-robin over strata keyed by the first three fields (alphabetically), so
    # the sample covers every combination of them before it repeats one
    by_stratum: dict[str, list] = {}
    for s in space:
        d = s.to_dict()
        key = json.dumps([d.get(k) for k in sorted(d)[:3]], default=str)
        by_stratum.setdefault(key, []).append(s)
    pools = list(by_stratum.values())
    for p in pools:
        rng.shuffle(p)
    i = 0
    while len(picked) < limit and any(pools):
        pool = pools[i % len(pools)]
        if pool:
            s = pool.pop()
            if s not in picked:
                picked.append(s)
        i += 1
    return picked, len(space)


def run_sweep(w, gen, ir, bench_fn, *, limit: int, seed: int, job: str):
    from factory.agents.types import CandidateDraft

    dims = dict(w.shapes[0])
    schedules, space_size = sweep_schedules(gen, ir, dims, limit, seed)
    drafts = {}
    for i, s in enumerate(schedules):
        em = gen.emit(ir, s)
        d = CandidateDraft(
            ptx=em.ptx,
            entry=em.entry,
            params=tuple(em.params),
            launch=em.launch,
            schedule=s.to_dict(),
            parent_ptx_sha256=None,
            role="writer",
            backend="offline",
            note="sweep",
        )
        drafts[f"sweep-{i}"] = d
    from factory.loop import build_batch

    batch = build_batch(w, drafts, baselines=(), options=OPTIONS)  # torch would cost seconds
    t0 = time.monotonic()
    results = bench_fn(batch)
    wall = time.monotonic() - t0
    records = records_from_results(w, results, drafts, job=job, generation=0)
    passed = [r for r in records if r["status"] == "passed"]
    best = min(passed, key=lambda r: r["median_us"]) if passed else None
    return {
        "space_size": space_size,
        "swept": len(drafts),
        "passed": len(passed),
        "wall_s": round(wall, 2),
        "gpu_s_per_candidate": round(wall / max(1, len(drafts)), 4),
        "best_us": best["median_us"] if best else None,
        "best_schedule": best["schedule"] if best else None,
        "default_us": next(
            (r["median_us"] for r in passed if r["ptx_sha256"] == drafts["sweep-0"].ptx_sha256),
            None,
        ),
        "baselines": _baseline_times(results),
        "failures": _failure_counts(records),
    }, records


def _baseline_times(results: dict) -> dict:
    out = {}
    for b in results.get("baselines", []):
        t = b.get("timing") or []
        out[b.get("name")] = t[0]["median_us"] if b.get("status") == "passed" and t else None
    return out


def _failure_counts(records: list[dict]) -> dict:
    out: dict[str, int] = {}
    for r in records:
        if r["status"] != "passed":
            k = f"{r['status']}: {(r.get('reason') or '')[:60]}"
            out[k] = out.get(k, 0) + 1
    return out


# --- summaries ---------------------------------------------------------------------------------


def job_summary(h: JobHistory) -> dict:
    curve = h.best_us_by_generation
    per_gen = [g.best_us for g in h.generations]
    benched = [g.benched for g in h.generations]
    return {
        "job": h.job,
        "best_us": h.best_us,
        "best_schedule": h.best_schedule,
        "best_so_far_by_generation": curve,
        "best_of_generation": per_gen,
        "benched_by_generation": benched,
        "rejected_by_generation": [len(g.rejected) for g in h.generations],
        "monotone": all(
            b is None or a is None or b <= a for a, b in zip(curve, curve[1:], strict=False)
        ),
        "stop_reason": h.stop_reason,
        "gpu_seconds": round(h.gpu_seconds, 2),
        "gpu_seconds_saved_by_pruning": round(h.gpu_seconds_saved_by_pruning, 2),
        "strategies": [g.plan.get("strategy") for g in h.generations],
        "baselines": _baseline_times({"baselines": h.baselines}),
        "best_note": h.best_draft.note if h.best_draft else None,
    }


def generations_to_within(curve: list, target: float, tol: float = 0.05) -> int | None:
    for g, t in enumerate(curve):
        if t is not None and t <= target * (1 + tol):
            return g
    return None


def candidates_to_within(h: JobHistory, target: float, tol: float = 0.05) -> int | None:
    n = 0
    for g in h.generations:
        n += g.benched
        if g.best_so_far_us is not None and g.best_so_far_us <= target * (1 + tol):
            return n
    return None


# --- the customer kernel -----------------------------------------------------------------------


def find_customer_example():
    try:
        from factory.spec import load_manifest
    except ImportError as exc:
        return None, f"factory.spec.load_manifest is not available: {exc}"

    root = Path(__file__).resolve().parents[2] / "factory" / "examples"
    if not root.is_dir():
        return None, "factory/examples does not exist"
    tried = []
    for toml in sorted(root.glob("*.toml")):
        for ext in (".cu", ".ptx"):
            src = toml.with_suffix(ext)
            if not src.exists():
                continue
            try:
                w = load_manifest(
                    toml.read_text(), baseline_source=src.read_text(), baseline_filename=src.name
                )
            except Exception as exc:  # noqa: BLE001
                tried.append(f"{toml.name}: {exc}")
                continue
            if w.baseline is not None:
                return w, f"{toml.name} + {src.name}"
    for toml in sorted(root.glob("*.toml")):
        try:
            w = load_manifest(toml.read_text())
        except Exception as exc:  # noqa: BLE001
            tried.append(f"{toml.name}: {exc}")
            continue
        if w.baseline is not None:
            return w, toml.name
    return None, "no example with a customer kernel loaded: " + "; ".join(tried[:3])


# --- the run -----------------------------------------------------------------------------------


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def job_deadline(self, reserve_s: float = 20.0) -> float:
        """Seconds one job may take: at most JOB_CAP_S, and `reserve_s` short of the end."""
        return min(JOB_CAP_S, max(5.0, self.left() - reserve_s))


def run(args, catalogue: dict | None = None, customer: tuple | None = None) -> dict:
    """The whole run; `catalogue` and `customer` ((workload, label)) replace the catalogue and
    the factory/examples kernel (tests)."""

    if args.fake:
        bench_fn = FakeGpu()
    else:
        from gpuworker import run_batch

        def bench_fn(batch):
            return run_batch(batch)

    gen = families.get("row")
    if gen is None:
        raise SystemExit("the generator (factory.families.row.ir/schedules/emit) is not importable")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    store = ev.JsonlEvidenceStore(out / "evidence.jsonl")
    # kept for analysis after the run (lab/probes/costmodel_eval.py); never shown to the loop
    sweep_store = ev.JsonlEvidenceStore(out / "sweep.jsonl")
    if catalogue is None:
        from factory.spec import load_catalogue

        catalogue = load_catalogue()
    result: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": vars(args),
        "operators": {},
        "skipped": [],
    }

    def save():
        (out / "results.json").write_text(json.dumps(result, indent=1, default=str))

    def run_customer():
        if budget.left() > 30:
            result["customer"] = customer_experiment(
                bench_fn, store, args, common, customer, budget
            )
        else:
            result["customer"] = {"skipped": "time budget spent"}
        save()

    common = dict(
        population=args.population,
        backend="offline",
        seed=args.seed,
        options=OPTIONS,
        prune_factor=args.prune_factor,
    )
    for k, name in enumerate(args.ops):
        if name not in catalogue:
            result["skipped"].append(f"{name}: not in the catalogue ({sorted(catalogue)})")
            continue
        if budget.left() < 40:
            result["skipped"].append(f"{name}: time budget spent")
            continue
        w0 = catalogue[name]
        try:
            ir = gen.lower(w0)
        except Exception as exc:  # noqa: BLE001
            result["skipped"].append(f"{name}: the generator cannot express it: {exc}")
            continue
        row_dim = getattr(ir, "row_dim", None)
        dims = fit_shape(w0, dict(w0.shapes[0]), row_dim)
        w = with_shapes(w0, [dims], small_heldout(w0, dims, row_dim))
        rec: dict = {"dims": dims, "bytes": workload_bytes(w, dims)}
        log(f"{name} at {dims}: sweep")
        sweep, sweep_records = run_sweep(
            w, gen, ir, bench_fn, limit=args.sweep_limit, seed=args.seed, job=f"sweep-{name}"
        )
        sweep_store.add(sweep_records)
        rec["sweep"] = sweep
        save()
        log(f"{name}: sweep best {sweep['best_us']} us of {sweep['swept']}; cold job")
        cold = run_job(
            w,
            bench_fn,
            generations=args.generations,
            evidence_store=store,
            job=f"cold-{name}",
            deadline_s=budget.job_deadline(),
            gpu_seconds_per_candidate=sweep["gpu_s_per_candidate"],
            **common,
        )
        rec["cold"] = job_summary(cold)
        if sweep["best_us"] and cold.best_us:
            rec["cold"]["vs_sweep_best"] = round(cold.best_us / sweep["best_us"], 4)
            rec["cold"]["within_5pct_of_sweep"] = cold.best_us <= sweep["best_us"] * 1.05
            rec["cold"]["generation_within_5pct"] = generations_to_within(
                cold.best_us_by_generation, sweep["best_us"]
            )
            n = candidates_to_within(cold, sweep["best_us"])
            rec["cold"]["candidates_to_within_5pct"] = n
            if n is not None:
                saved = (sweep["swept"] - n) * sweep["gpu_s_per_candidate"]
                rec["cold"]["gpu_s_saved_vs_sweep"] = round(max(saved, 0.0), 2)
        # the cost model, fitted on the loop's evidence, ranks the sweep it never saw
        fam = ev.family_of(w)
        model = CostModel().fit(store.query(family=fam))
        rec["costmodel"] = {
            "fitted": model.fitted,
            "train_records": model.n_train,
            "spearman_on_sweep": model.score(sweep_records) if model.fitted else None,
            "spearman_kfold_sweep": held_out_spearman(sweep_records),
        }
        passed = [r for r in sweep_records if r["status"] == "passed"]
        if model.fitted and len(passed) >= 8:
            pred = model.predict_records(passed)
            order = sorted(range(len(passed)), key=lambda i: pred[i])
            top = set(order[: max(1, len(passed) // 4)])
            best_i = min(range(len(passed)), key=lambda i: passed[i]["median_us"])
            rec["costmodel"]["sweep_best_in_predicted_top_quarter"] = best_i in top
            rec["costmodel"]["best_of_predicted_top_quarter_vs_best"] = round(
                min(passed[i]["median_us"] for i in top) / passed[best_i]["median_us"], 4
            )
            rec["costmodel"]["gpu_s_saved_benching_only_top_quarter"] = round(
                (len(passed) - len(top)) * sweep["gpu_s_per_candidate"], 2
            )
        result["operators"][name] = rec
        save()
        prior = prior_records(args.prior, w0) if getattr(args, "prior", None) else []
        if prior:
            model_p = CostModel().fit(prior)
            rec["costmodel"]["spearman_on_sweep_fitted_on_prior"] = (
                model_p.score(sweep_records) if model_p.fitted else None
            )
            # what a job sees once the evidence memory holds earlier runs: both together
            model_b = CostModel().fit(prior + store.query(family=fam))
            rec["costmodel"]["spearman_on_sweep_fitted_on_prior_and_job"] = (
                model_b.score(sweep_records) if model_b.fitted else None
            )
            if budget.left() > 40:
                rec["seeded"] = seeded_experiment(
                    w, name, prior, bench_fn, args, common, cold, sweep, budget
                )
            save()
        if k == 0 and budget.left() > 60:
            rec["warm"] = warm_experiment(
                w, w0, row_dim, bench_fn, store, args, common, name, budget
            )
            save()
        if k == 0:  # the customer's kernel before the other operators: it is a must-have
            run_customer()
    if "customer" not in result:
        run_customer()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["evidence_records"] = len(store.all())
    save()
    return result


def prior_records(pattern: str, w0) -> list[dict]:
    """Evidence records for catalogue operator `w0` from recorded lab/probes/sweep.py files: the
    verified schedules of our kernels, as earlier jobs on this GPU would have left them."""
    from lab.probes.costmodel_eval import sweep_records

    out = []
    for r in sweep_records(pattern).get(w0.name, []):
        out.append(
            dict(
                r,
                job="recorded-sweep",
                workload_sha256=w0.sha256,
                family=ev.family_of(w0),
                signature=ev.signature_of(w0),
                dtype=ev.dtype_of(w0),
                gpu=getattr(w0, "target", "sm_90") or "sm_90",
                generation=0,
                role="writer",
                backend="offline",
                ptx_sha256=None,
                reason="",
                tbps=float(r["bytes"]) / (float(r["median_us"]) * 1e-6) / 1e12,
            )
        )
    return out


def seeded_experiment(w, name, prior, bench_fn, args, common, cold, sweep, budget) -> dict:
    """A job at the cold job's shape whose evidence memory holds only recorded evidence from
    other shapes: how much of the cold job's search does it skip?"""
    store = ev.JsonlEvidenceStore()
    store.add(prior)
    log(f"{name}: job seeded with {len(prior)} recorded records")
    seeded = run_job(
        w,
        bench_fn,
        generations=args.warm_generations,
        evidence_store=store,
        job=f"seeded-{name}",
        deadline_s=budget.job_deadline(),
        **common,
    )
    out = {"prior_records": len(prior), "seeded": job_summary(seeded)}
    g0 = seeded.generations[0].best_us if seeded.generations else None
    out["seeded_generation0_us"] = g0
    if g0 is not None and cold.best_us:
        out["seeded_g0_vs_cold_final"] = round(g0 / cold.best_us, 4)
        out["cold_generations_to_reach_seeded_g0_within_5pct"] = generations_to_within(
            cold.best_us_by_generation, g0
        )
    if g0 is not None and sweep.get("best_us"):
        out["seeded_g0_vs_sweep_best"] = round(g0 / sweep["best_us"], 4)
    return out


def warm_experiment(w, w0, row_dim, bench_fn, store, args, common, name, budget) -> dict:
    dims = dict(w.shapes[0])
    batch_dims = [d for d in dims if d != row_dim]
    if not batch_dims:
        return {"skipped": "no batch dim to change"}
    dims2 = dict(dims)
    dims2[batch_dims[0]] = max(1, dims2[batch_dims[0]] // 2)  # half the rows: cheaper to judge
    w2 = with_shapes(w0, [dims2], list(w.heldout_shapes))
    log(f"{name}: warm job at {dims2}")
    warm = run_job(
        w2,
        bench_fn,
        generations=args.warm_generations,
        evidence_store=store,
        job=f"warm-{name}",
        deadline_s=budget.job_deadline(),
        **common,
    )
    log(f"{name}: cold job at {dims2} (separate evidence)")
    cold2 = run_job(
        w2,
        bench_fn,
        generations=max(2, args.generations - 1),
        evidence_store=ev.JsonlEvidenceStore(),
        job=f"cold2-{name}",
        deadline_s=budget.job_deadline(),
        **common,
    )
    out = {"dims": dims2, "warm": job_summary(warm), "cold_same_shape": job_summary(cold2)}
    g0 = warm.generations[0].best_us if warm.generations else None
    out["warm_generation0_us"] = g0
    if g0 is not None:
        out["cold_generations_to_reach_warm_g0_within_5pct"] = generations_to_within(
            cold2.best_us_by_generation, g0
        )
        if cold2.best_us:
            out["warm_g0_vs_cold_final"] = round(g0 / cold2.best_us, 4)
            out["warm_g0_within_5pct_of_cold_final"] = g0 <= cold2.best_us * 1.05
            out["cold_generation_within_5pct_of_its_final"] = generations_to_within(
                cold2.best_us_by_generation, cold2.best_us
            )
    return out


def customer_experiment(bench_fn, store, args, common, customer, budget) -> dict:
    w, where = customer or find_customer_example()
    if w is None:
        return {"skipped": where}
    gen = families.get("row")
    row_dim = None
    try:
        row_dim = getattr(gen.lower(w), "row_dim", None)
    except Exception as exc:  # noqa: BLE001 - edits of the customer kernel need no generator
        log(f"the generator cannot express the customer's operator: {exc}")
    dims = fit_shape(w, dict(w.shapes[0]), row_dim)
    w = with_shapes(w, [dims], small_heldout(w, dims, row_dim))
    log(f"customer kernel {where} at {dims}")
    h = run_job(
        w,
        bench_fn,
        generations=args.customer_generations,
        evidence_store=store,
        job="customer",
        deadline_s=budget.job_deadline(10.0),
        baselines=("customer",),
        **common,
    )
    out = {"example": where, "dims": dims, "job": job_summary(h)}
    cust = out["job"]["baselines"].get("customer")
    out["customer_us"] = cust
    if cust and h.best_us:
        out["speedup_vs_customer"] = round(cust / h.best_us, 3)
        out["faster_than_customer"] = h.best_us < cust
        out["best_kind"] = (
            "edit of the customer kernel"
            if (h.best_schedule or {}).get("ptx_edit")
            else "generator schedule"
            if h.best_schedule
            else "model-written PTX"
        )
    edits = [r for r in store.query(job="customer") if (r.get("schedule") or {}).get("ptx_edit")]
    ok = [r for r in edits if r["status"] == "passed"]
    if ok:
        out["best_edit_us"] = min(r["median_us"] for r in ok)
        out["best_edit"] = min(ok, key=lambda r: r["median_us"])["schedule"]
        if cust:
            out["best_edit_speedup_vs_customer"] = round(cust / out["best_edit_us"], 3)
    out["edits_tried"] = len(edits)
    out["edits_passed"] = len(ok)
    return out


# --- a CPU stand-in for plumbing checks ------------------------------------------------------


class FakeGpu:
    """Not a measurement: validates each batch with gpuworker's parser and invents times from
    the schedule (for checking this script end to end on a machine without a GPU)."""

    def __call__(self, batch: dict) -> dict:
        try:
            from gpuworker.batch import parse_batch

            parse_batch(batch)
        except ImportError:
            pass
        out = []
        for c in batch["candidates"]:
            h = int.from_bytes(c["ptx"][-64:].encode()[:8].ljust(8, b"0"), "little")
            rnd = random.Random(h ^ len(c["ptx"]))
            timing = [
                {"dims": d, "median_us": 50 + 40 * rnd.random(), "tbps": 1.0, "bytes": 1}
                for d in batch["shapes"]
            ]
            out.append({"id": c["id"], "status": "passed", "reason": "", "timing": timing})
        base = [
            {
                "name": b,
                "status": "passed",
                "timing": [{"dims": d, "median_us": 120.0} for d in batch["shapes"]],
            }
            for b in batch["baselines"]
        ]
        return {"format": 1, "env": {"sm": "sm_90"}, "candidates": out, "baselines": base}


# --- writing it up -----------------------------------------------------------------------------


def render(result: dict, out: Path) -> None:
    (out / "report.md").write_text(markdown(result))
    try:
        charts_html(result, out / "charts.html")
    except ImportError as exc:
        log(f"no charts: {exc}")


def _fmt(x, nd=2):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def markdown(r: dict) -> str:
    lines = [
        "# Issue 6: the self-improving loop on the GPU",
        "",
        f"Run {r.get('started')} – {r.get('finished', '(unfinished)')}; "
        f"args {json.dumps({k: v for k, v in r['args'].items() if k != 'out'})}",
        "",
    ]
    if r["args"].get("fake"):
        lines += [
            "**FAKE RUN: times are invented by a CPU stand-in; nothing here is a measurement.**",
            "",
        ]
    lines += [
        "## Cold jobs against the generator's sweep",
        "",
        "| operator | shape | space | swept | sweep best us | loop best us | loop/sweep | "
        "within 5% | gen reached | benched to reach | GPU s saved vs sweep | monotone |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, o in r["operators"].items():
        s, c = o["sweep"], o.get("cold", {})
        lines.append(
            f"| {name} | {o['dims']} | {s['space_size']} | {s['swept']} | {_fmt(s['best_us'])} |"
            f" {_fmt(c.get('best_us'))} | {_fmt(c.get('vs_sweep_best'), 3)} | "
            f"{c.get('within_5pct_of_sweep')} | {c.get('generation_within_5pct')} | "
            f"{c.get('candidates_to_within_5pct')} | {_fmt(c.get('gpu_s_saved_vs_sweep'))} | "
            f"{c.get('monotone')} |"
        )
    lines += ["", "Per-generation best so far (us):", ""]
    for name, o in r["operators"].items():
        c = o.get("cold", {})
        lines.append(
            f"- {name}: {[_fmt(x) for x in c.get('best_so_far_by_generation', [])]} "
            f"(best of each generation: {[_fmt(x) for x in c.get('best_of_generation', [])]};"
            f" stop: {c.get('stop_reason')})"
        )
    lines += [
        "",
        "## Cost model",
        "",
        "| operator | fitted on | Spearman vs sweep (held out) | k-fold on sweep | "
        "sweep best in predicted top 25% | best of top 25% / best | GPU s saved (top 25%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, o in r["operators"].items():
        m = o.get("costmodel", {})
        lines.append(
            f"| {name} | {m.get('train_records')} | {_fmt(m.get('spearman_on_sweep'), 3)} |"
            f" {_fmt(m.get('spearman_kfold_sweep'), 3)} | "
            f"{m.get('sweep_best_in_predicted_top_quarter')} | "
            f"{_fmt(m.get('best_of_predicted_top_quarter_vs_best'), 3)} | "
            f"{_fmt(m.get('gpu_s_saved_benching_only_top_quarter'))} |"
        )
    for name, o in r["operators"].items():
        wm = o.get("warm")
        if not wm:
            continue
        lines += ["", f"## Warm start ({name} at {wm.get('dims')})", ""]
        if "skipped" in wm:
            lines.append(wm["skipped"])
            continue
        lines += [
            f"- warm job generation 0 best: {_fmt(wm.get('warm_generation0_us'))} us "
            f"(strategy {wm['warm']['strategies'][:1]})",
            f"- cold job at the same shape, best so far by generation: "
            f"{[_fmt(x) for x in wm['cold_same_shape']['best_so_far_by_generation']]}",
            f"- warm g0 / cold final: {_fmt(wm.get('warm_g0_vs_cold_final'), 3)}; within 5%: "
            f"{wm.get('warm_g0_within_5pct_of_cold_final')}; the cold job got within 5% of "
            f"its own final at generation {wm.get('cold_generation_within_5pct_of_its_final')}"
            f" and within 5% of warm g0 at generation "
            f"{wm.get('cold_generations_to_reach_warm_g0_within_5pct')}",
        ]
    seeded = {n: o["seeded"] for n, o in r["operators"].items() if o.get("seeded")}
    if seeded:
        lines += ["", "## Jobs seeded with recorded evidence (other shapes)", ""]
        lines += [
            "| operator | prior records | seeded g0 us | / cold final | / sweep best | "
            "cold generation reaching it | cost model on sweep, fitted on prior | "
            "on prior + the cold job |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, sd in seeded.items():
            cm = r["operators"][n].get("costmodel", {})
            lines.append(
                f"| {n} | {sd['prior_records']} | {_fmt(sd.get('seeded_generation0_us'))} | "
                f"{_fmt(sd.get('seeded_g0_vs_cold_final'), 3)} | "
                f"{_fmt(sd.get('seeded_g0_vs_sweep_best'), 3)} | "
                f"{sd.get('cold_generations_to_reach_seeded_g0_within_5pct')} | "
                f"{_fmt(cm.get('spearman_on_sweep_fitted_on_prior'), 3)} | "
                f"{_fmt(cm.get('spearman_on_sweep_fitted_on_prior_and_job'), 3)} |"
            )
    cu = r.get("customer")
    lines += ["", "## Customer kernel", ""]
    if not cu:
        lines.append("not run")
    elif "skipped" in cu:
        lines.append(f"skipped: {cu['skipped']}")
    else:
        lines += [
            f"- example {cu['example']} at {cu['dims']}: customer kernel "
            f"{_fmt(cu.get('customer_us'))} us; loop best {_fmt(cu['job'].get('best_us'))} us "
            f"({cu.get('best_kind')}); speedup {_fmt(cu.get('speedup_vs_customer'), 3)}x; "
            "verified by the GPU worker (status passed)",
            f"- edits of the customer's own PTX: {cu.get('edits_passed')} of "
            f"{cu.get('edits_tried')} passed; best edit {_fmt(cu.get('best_edit_us'))} us "
            f"({_fmt(cu.get('best_edit_speedup_vs_customer'), 3)}x): {cu.get('best_edit')}",
        ]
    if r.get("skipped"):
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in r["skipped"]]
    return "\n".join(lines) + "\n"


def charts_html(r: dict, path: Path) -> None:
    import plotly.graph_objects as go
    from plotly.io import to_html

    figs = []
    for name, o in r["operators"].items():
        c = o.get("cold")
        if not c:
            continue
        f = go.Figure()
        xs = list(range(len(c["best_so_far_by_generation"])))
        f.add_scatter(
            x=xs, y=c["best_so_far_by_generation"], mode="lines+markers", name="loop: best so far"
        )
        f.add_scatter(x=xs, y=c["best_of_generation"], mode="markers", name="best of generation")
        if o["sweep"]["best_us"]:
            f.add_hline(
                y=o["sweep"]["best_us"],
                line_dash="dash",
                annotation_text=f"sweep best ({o['sweep']['swept']} schedules)",
            )
            f.add_hline(y=o["sweep"]["best_us"] * 1.05, line_dash="dot", annotation_text="+5%")
        wm = o.get("warm")
        if wm and "warm" in wm:
            f.add_scatter(
                x=list(range(len(wm["warm"]["best_so_far_by_generation"]))),
                y=wm["warm"]["best_so_far_by_generation"],
                name=f"warm at {wm['dims']}",
            )
            f.add_scatter(
                x=list(range(len(wm["cold_same_shape"]["best_so_far_by_generation"]))),
                y=wm["cold_same_shape"]["best_so_far_by_generation"],
                name=f"cold at {wm['dims']}",
            )
        f.update_layout(
            title=f"{name} at {o['dims']}: best time by generation",
            xaxis_title="generation",
            yaxis_title="median us",
        )
        figs.append(f)
    cu = r.get("customer")
    if cu and "job" in cu:
        f = go.Figure()
        curve = cu["job"]["best_so_far_by_generation"]
        f.add_scatter(x=list(range(len(curve))), y=curve, mode="lines+markers", name="loop")
        if cu.get("customer_us"):
            f.add_hline(y=cu["customer_us"], line_dash="dash", annotation_text="customer kernel")
        f.update_layout(
            title=f"customer kernel {cu['example']}",
            xaxis_title="generation",
            yaxis_title="median us",
        )
        figs.append(f)
    src = plotly_src(path)
    parts = [
        to_html(f, include_plotlyjs=(src if i == 0 else False), full_html=False)
        for i, f in enumerate(figs)
    ]
    path.write_text(
        "<html><head><meta charset='utf-8'><title>loop run</title></head><body>"
        + "".join(parts)
        + "</body></html>"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="softmax,rmsnorm,cross_entropy")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--warm-generations", type=int, default=1)
    p.add_argument("--customer-generations", type=int, default=3)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prune-factor", type=int, default=3)
    p.add_argument("--sweep-limit", type=int, default=48)
    p.add_argument("--budget-s", type=float, default=220.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prior", default="", help="recorded lab/probes/sweep.py files (a glob)")
    p.add_argument("--fake", action="store_true", help="CPU stand-in: not a measurement")
    p.add_argument("--render", help="only render report.md and charts.html from a results.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.render:
        out.mkdir(parents=True, exist_ok=True)
        render(json.loads(Path(args.render).read_text()), out)
        return 0
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    t0 = time.monotonic()
    result = run(args)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    render(result, out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
