"""The cost model's rank correlation inside a job, on candidates it was not fitted on (issue 53).

    PYTHONPATH=. python3 -m lab.search.costmodel_eval [--out DIR] [--matmul-sweep SWEEP.json]
        [--folds 5] [--sources suite,sweep,loop]

A "job" here is one operator at one shape in one recorded run: the candidates a GPU timed side
by side. For each job, its candidates are split into folds (by schedule); each fold is predicted
by a model (factory.costmodel.CostModel, the family's features) fitted on the job's other folds
plus the same operator's records at other shapes (any run). Records of the same operator at the
same shape from other runs are left out of the fit: they are the held-out schedules measured
again. The job's score is the Spearman correlation between its out-of-fold predictions and the
measured medians; the median over jobs is the number the issue asks for (>= 0.6).

Sources (recorded GPU runs under bench/results/):
- suite: every `raw_<op>.json` of the suite runs (the screened candidates of each operator, every
  one timed at three or four shapes: each (run, op, shape) is a job);
- sweep: `2026-12-02-h200-sweep/run*-shape*.json` (62 to 200 schedules per operator and shape);
- loop: the loop runs' `evidence.jsonl` and `sweep.jsonl` (jobs of 8 to 32 verified candidates);
- matmul: a lab.search.sweep_matmul file (--matmul-sweep), each shape a job of the tensor-core
  family (there is no such file yet when this was written).
Prints a markdown report; with --out writes it (README.md) and the per-job numbers (jobs.json).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import time

import numpy as np

from factory.costmodel import CostModel, spearman

SUITE_GLOB = "bench/results/*/**/raw_*.json"
SWEEP_GLOB = "bench/results/2026-12-02-h200-sweep/run*-shape*.json"
LOOP_GLOBS = ("bench/results/*/evidence.jsonl", "bench/results/*/sweep.jsonl")


def _dims_key(dims: dict) -> str:
    return json.dumps(dims, sort_keys=True)


def suite_records(pattern: str = SUITE_GLOB) -> list[dict]:
    """Verified candidate timings of the suite runs' raw files, tagged with run, op and job."""
    out = []
    for path in sorted(glob.glob(pattern, recursive=True)):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        suite = data.get("suite") or {}
        op, schedules = suite.get("op"), suite.get("schedules") or {}
        bytes_per = suite.get("bytes_per_shape") or {}
        if not op or not schedules:
            continue
        run = os.path.dirname(path)
        for c in data.get("candidates") or []:
            sched = schedules.get(c.get("id"))
            if c.get("status") != "passed" or not isinstance(sched, dict):
                continue
            for t in c.get("timing") or []:
                dims = t.get("dims") or {}
                label = "x".join(str(v) for v in dims.values())
                if not t.get("median_us") or not bytes_per.get(label):
                    continue
                out.append(
                    {
                        "source": "suite",
                        "family": sched.get("family", "row"),
                        "op": op,
                        "run": run,
                        "job": f"{run}|{op}|{_dims_key(dims)}",
                        "schedule": sched,
                        "dims": dims,
                        "bytes": bytes_per[label],
                        "median_us": float(t["median_us"]),
                        "status": "passed",
                    }
                )
    return out


def sweep_records(pattern: str = SWEEP_GLOB) -> list[dict]:
    """Our kernels' verified records of the row-family sweeps (read flush), per file and case."""
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            data = json.load(f)
        for case in data.get("cases") or []:
            if case.get("flush") != "read":
                continue
            for r in case.get("records") or []:
                if r.get("impl") != "ours" or r.get("status") != "passed":
                    continue
                out.append(
                    {
                        "source": "sweep",
                        "family": (r.get("schedule") or {}).get("family", "row"),
                        "op": case["op"],
                        "run": path,
                        "job": f"{path}|{case['op']}|{_dims_key(case['dims'])}",
                        "schedule": r["schedule"],
                        "dims": case["dims"],
                        "bytes": case["bytes"],
                        "median_us": float(r["median_us"]),
                        "status": "passed",
                    }
                )
    return out


def loop_records(patterns=LOOP_GLOBS) -> list[dict]:
    """Verified records of the loop runs' evidence and reference sweeps, per file and job."""
    out = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    sched = r.get("schedule")
                    if r.get("status") != "passed" or not r.get("median_us"):
                        continue
                    if not isinstance(sched, dict) or sched.get("ptx_edit"):
                        continue  # the customer's kernel edits: no family features
                    op = str(r.get("job", "")).split("-", 1)[-1]
                    out.append(
                        dict(
                            r,
                            source="loop",
                            family=sched.get("family", r.get("family", "row")),
                            op=op,
                            run=path,
                            job=f"{path}|{r.get('job')}|{_dims_key(r['dims'])}",
                        )
                    )
    return out


def matmul_records(path: str) -> list[dict]:
    """A tensor-core sweep's verified timings (lab.search.sweep_matmul), each shape a job."""
    with open(path) as f:
        data = json.load(f)
    schedules = data["schedules"]
    out = []
    for m in data["measurements"]:
        if m.get("status") != "passed" or not m.get("median_us"):
            continue
        d = m["dims"]
        out.append(
            {
                "source": "matmul",
                "family": "matmul",
                "op": data.get("op", "matmul"),
                "run": path,
                "job": f"{path}|{_dims_key(d)}",
                "schedule": schedules[m["id"]],
                "dims": d,
                "flops": 2.0 * d["M"] * d["N"] * d["K"],
                "bytes": 2.0 * (d["M"] * d["K"] + d["N"] * d["K"] + d["N"] + d["M"] * d["N"]),
                "median_us": float(m["median_us"]),
                "status": "passed",
            }
        )
    return out


class _Model(CostModel):
    """CostModel whose feature rows are computed once per (one-hot vocabulary, schedule, shape)
    object: the evaluation fits thousands of models on the same record objects. Results equal
    CostModel's."""

    _family_cache: dict = {}
    _row_cache: dict = {}

    def _vocab(self, records: list[dict]) -> None:
        super()._vocab(records)
        self._vocab_key = hash(tuple(self.onehot))

    def _family_features(self, schedule: dict, dims: dict) -> list[float]:
        key = (self.family, tuple(self.dim_order), id(schedule), id(dims))
        hit = self._family_cache.get(key)
        if hit is None:
            hit = self._family_cache[key] = super()._family_features(schedule, dims)
        return list(hit)

    def _features(self, schedule, dims):
        key = (self._vocab_key, self.family, tuple(self.dim_order), id(schedule), id(dims))
        hit = self._row_cache.get(key)
        if hit is None:
            if len(self._row_cache) > 400_000:  # bounded memory
                self._row_cache.clear()
            hit = self._row_cache[key] = super()._features(schedule, dims)
        return hit


def fast_end(rows: list[dict], factor: float) -> list[dict]:
    """The training rows within `factor` x the fastest of their own shape (run and dims), that
    fastest taken among `rows` only (never from held-out candidates): a fit on the fast end of
    each shape. `factor` <= 1 keeps every row."""
    if factor <= 1.0:
        return rows
    best: dict[tuple, float] = {}
    for r in rows:
        key = (r.get("run"), _dims_key(r["dims"]))
        best[key] = min(best.get(key, math.inf), r["median_us"])
    return [
        r for r in rows if r["median_us"] <= factor * best[(r.get("run"), _dims_key(r["dims"]))]
    ]


def _schedule_id(r: dict) -> str:
    return json.dumps(r["schedule"], sort_keys=True, default=str)


def evaluate_job(
    job_rows: list[dict],
    pool: list[dict],
    *,
    folds: int,
    seed: int = 0,
    dim_order=None,
    fit_near: float = 0.0,
) -> dict | None:
    """Out-of-fold predictions for one job's candidates: each fold predicted by a model fitted on
    the job's other folds and `pool` (the same operator at other shapes); the Spearman
    correlation with the measured times, or None with fewer than 5 distinct schedules."""
    by_sched: dict[str, list[dict]] = {}
    for r in job_rows:
        by_sched.setdefault(_schedule_id(r), []).append(r)
    keys = sorted(by_sched)
    if len(keys) < 5:
        return None
    k = max(2, min(folds, len(keys)))
    perm = np.random.default_rng(seed).permutation(len(keys))
    fold_of = {keys[i]: j % k for j, i in enumerate(perm)}
    family = job_rows[0].get("family", "row")
    predicted, measured = [], []
    for f in range(k):
        test = [r for r in job_rows if fold_of[_schedule_id(r)] == f]
        train = [r for r in job_rows if fold_of[_schedule_id(r)] != f] + pool
        train = fast_end(train, fit_near)
        model = _Model(family=family, dim_order=list(dim_order or [])).fit(train)
        predicted += model.predict_records(test)
        measured += [r["median_us"] for r in test]
    rho = spearman(predicted, measured)
    spread = max(measured) / min(measured)
    return {"n": len(keys), "rho": rho, "spread": spread}


def evaluate(
    records: list[dict], *, folds: int = 5, near: float = 0.0, fit_near: float = 0.0, log=None
) -> list[dict]:
    """evaluate_job for every job of `records`; with `near` > 1, each job keeps only its
    candidates within that factor of its fastest (what one job of a single row length holds:
    a suite job also times the kernels made for the other row length, which the model tells
    apart easily). With `fit_near` > 1 each fit keeps only its rows within that factor of their
    shape's fastest (fast_end)."""
    jobs: dict[str, list[dict]] = {}
    for r in records:
        jobs.setdefault(r["job"], []).append(r)
    if near > 1.0:
        for job, rows in jobs.items():
            best = min(r["median_us"] for r in rows)
            jobs[job] = [r for r in rows if r["median_us"] <= near * best]
    by_op: dict[tuple, list[dict]] = {}
    for r in records:
        by_op.setdefault((r["family"], r["op"]), []).append(r)
    out = []
    for i, (_job, rows) in enumerate(sorted(jobs.items())):
        r0 = rows[0]
        shape = _dims_key(r0["dims"])
        pool = [r for r in by_op[(r0["family"], r0["op"])] if _dims_key(r["dims"]) != shape]
        order = list(r0["dims"])  # the record's own dim order (row: the last is the length)
        res = evaluate_job(rows, pool, folds=folds, dim_order=order, fit_near=fit_near)
        if res is None:
            continue
        out.append(
            {
                "source": r0["source"],
                "family": r0["family"],
                "op": r0["op"],
                "run": r0["run"],
                "dims": r0["dims"],
                "train_other_shapes": len(pool),
                **res,
            }
        )
        if log and i % 50 == 0:
            log(f"{i}/{len(jobs)} jobs")
    return out


def held_out_shapes(records: list[dict], *, near: float = 0.0, fit_near: float = 0.0) -> list[dict]:
    """Each shape of a family's records predicted by a model fitted on the other shapes only
    (no candidate of the job itself in the fit: a new job's first ranking), beside the
    family's analytic estimate alone (no fit; the matmul family's `estimate`). Spearman over
    the shape's candidates, or over those within `near` x its fastest when `near` > 1."""
    from factory.families.matmul import features as mm

    by_shape: dict[str, list[dict]] = {}
    for r in records:
        by_shape.setdefault(_dims_key(r["dims"]), []).append(r)
    out = []
    for shape, rows in sorted(by_shape.items()):
        r0 = rows[0]
        test = rows
        if near > 1.0:
            best = min(r["median_us"] for r in rows)
            test = [r for r in rows if r["median_us"] <= near * best]
        train = fast_end([r for s, rs in by_shape.items() if s != shape for r in rs], fit_near)
        model = _Model(family=r0["family"], dim_order=list(r0["dims"])).fit(train)
        measured = [r["median_us"] for r in test]
        fitted = spearman(model.predict_records(test), measured)
        analytic = None
        if r0["family"] == "matmul":
            est = []
            for r in test:
                m, n, k, nb = mm.gemm_dims(r["schedule"], r["dims"], list(r["dims"]))
                est.append(mm.estimate(r["schedule"], m, n, k, nb)["us"])
            analytic = spearman(est, measured)
        out.append(
            {
                "family": r0["family"],
                "op": r0["op"],
                "dims": r0["dims"],
                "n": len(test),
                "train_other_shapes": len(train),
                "rho": fitted,
                "rho_estimate_alone": analytic,
                "spread": max(measured) / min(measured),
            }
        )
    return out


def held_out_shapes_report(rows: list[dict], *, near: float = 0.0) -> str:
    scope = "every candidate"
    if near > 1.0:
        scope = f"candidates within {near:g}x of the shape's fastest"
    lines = [
        "",
        f"## Held-out shape ({scope})",
        "",
        "The model fitted on the other shapes only; the analytic estimate alone needs no fit.",
        "",
        "| op | shape | candidates | spread | rho fitted | rho estimate alone |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        shape = " ".join(f"{k}={v}" for k, v in r["dims"].items())
        lines.append(
            f"| {r['op']} | {shape} | {r['n']} | {r['spread']:.3f} | {fmt(r['rho'])} "
            f"| {fmt(r['rho_estimate_alone'])} |"
        )
    lines.append(
        f"| median | | | | {fmt(_median([r['rho'] for r in rows]))} "
        f"| {fmt(_median([r['rho_estimate_alone'] for r in rows]))} |"
    )
    return "\n".join(lines) + "\n"


def _median(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def report(results: list[dict], *, folds: int, commit: str = "") -> str:
    lines = [
        "# The cost model inside a job, held out (issue 53)",
        "",
        f"`PYTHONPATH=. python3 -m lab.search.costmodel_eval` at {commit or 'this commit'}: "
        f"{folds}-fold by schedule inside each job (one operator at one shape in one recorded "
        "run), each fold predicted by factory.costmodel.CostModel fitted on the job's other "
        "folds and the same operator at other shapes; Spearman between the out-of-fold "
        "predictions and the measured medians. Spread: the job's slowest over its fastest.",
        "",
        "| source | family | jobs | median rho | quartiles | jobs >= 0.6 | median spread |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["source"], r["family"]), []).append(r)
        groups.setdefault(("all", r["family"]), []).append(r)
    for (source, family), rows in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rhos = sorted(r["rho"] for r in rows if r["rho"] is not None)
        if not rhos:
            continue
        q1 = rhos[len(rhos) // 4]
        q3 = rhos[(3 * len(rhos)) // 4]
        good = sum(1 for x in rhos if x >= 0.6)
        lines.append(
            f"| {source} | {family} | {len(rows)} | {_median(rhos):.2f} | {q1:.2f} to {q3:.2f} "
            f"| {good} | {_median([r['spread'] for r in rows]):.3f} |"
        )
    # The suite runs repeat one plan: each (operator, shape) once, as the median of its runs.
    per_shape: dict[tuple, list[float]] = {}
    for r in results:
        if r["rho"] is not None:
            key = (r["family"], r["op"], json.dumps(r["dims"], sort_keys=True))
            per_shape.setdefault(key, []).append(r["rho"])
    lines += [
        "",
        "## Each operator and shape once (the median of its recorded runs)",
        "",
        "| family | distinct (op, shape) | median of their medians | at least 0.6 |",
        "|---|---|---|---|",
    ]
    for family in sorted({k[0] for k in per_shape}):
        meds = [_median(v) for k, v in per_shape.items() if k[0] == family]
        lines.append(
            f"| {family} | {len(meds)} | {_median(meds):.2f} | {sum(1 for m in meds if m >= 0.6)} |"
        )
    lines += ["", "| family | op | shape | jobs | median rho |", "|---|---|---|---|---|"]
    for (family, op, dims), rhos in sorted(per_shape.items()):
        shape = " ".join(f"{k}={v}" for k, v in json.loads(dims).items())
        lines.append(f"| {family} | {op} | {shape} | {len(rhos)} | {_median(rhos):.2f} |")
    lines += [
        "",
        "## Per operator (all sources)",
        "",
        "| family | op | jobs | median rho |",
        "|---|---|---|---|",
    ]
    per_op: dict[tuple, list[float]] = {}
    for r in results:
        if r["rho"] is not None:
            per_op.setdefault((r["family"], r["op"]), []).append(r["rho"])
    for (family, op), rhos in sorted(per_op.items()):
        lines.append(f"| {family} | {op} | {len(rhos)} | {_median(rhos):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--sources", default="suite,sweep,loop")
    ap.add_argument("--matmul-sweep", default="")
    ap.add_argument("--commit", default="")
    ap.add_argument("--near", type=float, default=0.0, help="keep candidates within this x best")
    ap.add_argument("--from-jobs", default="", help="report a jobs.json again, no refitting")
    ap.add_argument(
        "--fit-near",
        type=float,
        default=0.0,
        help="fit each model on its rows within this x their shape's fastest only",
    )
    ap.add_argument(
        "--held-out-shape",
        action="store_true",
        help="also fit on the other shapes only and score each tensor-core shape whole",
    )
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.from_jobs:
        with open(args.from_jobs) as f:
            print(report(json.load(f), folds=args.folds, commit=args.commit))
        return 0
    records: list[dict] = []
    sources = set(args.sources.split(","))
    if "suite" in sources:
        records += suite_records()
    if "sweep" in sources:
        records += sweep_records()
    if "loop" in sources:
        records += loop_records()
    if args.matmul_sweep:
        records += matmul_records(args.matmul_sweep)
    results = evaluate(
        records,
        folds=args.folds,
        near=args.near,
        fit_near=args.fit_near,
        log=lambda m: print(m, flush=True),
    )
    text = report(results, folds=args.folds, commit=args.commit)
    if args.fit_near > 1.0:
        text += (
            f"\nEach model was fitted only on its training rows within {args.fit_near:g}x of "
            "their own shape's fastest (the fastest among those training rows).\n"
        )
    shape_rows = []
    if args.held_out_shape:
        mm_records = [r for r in records if r["family"] == "matmul"]
        shape_rows = held_out_shapes(mm_records, near=args.near, fit_near=args.fit_near)
        text += held_out_shapes_report(shape_rows, near=args.near)
    text += (
        f"\n{len(records)} records, {len(results)} jobs scored in {time.monotonic() - t0:.0f} s.\n"
    )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "jobs.json"), "w") as f:
            json.dump(results, f, indent=1)
        if shape_rows:
            with open(os.path.join(args.out, "held_out_shapes.json"), "w") as f:
                json.dump(shape_rows, f, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
