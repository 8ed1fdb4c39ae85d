"""How well the cost model ranks schedules, recomputed from recorded H200 evidence (no GPU).

    PYTHONPATH=. python3 -m lab.probes.costmodel_eval [--sweeps 'GLOB'] [--loop EVIDENCE.jsonl]
    PYTHONPATH=. python3 -m lab.probes.costmodel_eval --write-fixture \
        tests/fixtures/costmodel/records.json.gz     # the records tests/factory reads

1. Per operator, five-fold Spearman (folds by schedule) on the verified records of the schedule
   sweeps (lab/probes/sweep.py output: every record has its schedule, shape, bytes and median).
2. Shape transfer within the sweeps: fitted on one suite shape's records, Spearman on the other
   shape's (both ways, the mean).
3. Picks at an unseen shape (what a warm start needs): fitted at one suite shape, the best
   measured time among its k predicted-fastest schedules at the other shape, over that shape's
   best; next to the first shape's own winner timed at the second (a warm start without a
   model re-uses it).
4. Transfer: fitted on the sweeps (suite shapes), Spearman on a loop run's verified job records
   (other shapes), per operator, next to five-fold Spearman on those job records alone.
5. A loop run's reference sweep (`sweep.jsonl`: a broad slice of the space at the job's shape,
   every schedule timed): the cold job's model, fitted on the job's own records alone, on the
   recorded sweeps alone (other shapes), and on both (what a job sees when the evidence memory
   holds earlier runs): Spearman on that sweep, and what timing only its predicted-fastest
   quarter would have found and saved.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys

import numpy as np

from factory.costmodel import CostModel, held_out_spearman

SWEEPS = "bench/results/2026-12-02-h200-sweep/run*-shape*.json"
LOOP = "bench/results/2026-12-02-h200-loop2/evidence.jsonl"
RUN = "bench/results/2026-12-02-h200-loop3"


def sweep_records(pattern: str) -> dict[str, list[dict]]:
    """Verified records of our kernels, per operator, from sweep files timed on a read flush."""
    out: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            data = json.load(f)
        for case in data["cases"]:
            if case.get("flush") != "read":
                continue
            for r in case["records"]:
                if r.get("impl") != "ours" or r.get("status") != "passed":
                    continue
                out.setdefault(case["op"], []).append(
                    {
                        "schedule": r["schedule"],
                        "dims": case["dims"],
                        "bytes": case["bytes"],
                        "median_us": r["median_us"],
                        "status": "passed",
                    }
                )
    return out


def loop_records(path: str) -> dict[str, list[dict]]:
    """Verified job records of a loop run, per operator (from the job name)."""
    out: dict[str, list[dict]] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") != "passed" or not r.get("median_us") or not r.get("schedule"):
                continue
            op = r["job"].split("-", 1)[-1]
            out.setdefault(op, []).append(r)
    return out


def shape_transfer(records: list[dict]) -> float | None:
    """Mean Spearman of a model fitted at one shape and scored at another, over ordered pairs."""
    by_shape = _by_shape(records)
    scores = [
        CostModel().fit(train).score(test)
        for a, train in by_shape.items()
        for b, test in by_shape.items()
        if a != b
    ]
    scores = [x for x in scores if x is not None]
    return sum(scores) / len(scores) if scores else None


def _by_shape(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(json.dumps(r["dims"], sort_keys=True), []).append(r)
    return out


def _random_best(records: list[dict], k: int, draws: int = 2000) -> float:
    """The mean best time among k schedules drawn at random (the no-model baseline)."""
    rng = np.random.default_rng(0)
    times = np.array([r["median_us"] for r in records])
    k = min(k, len(times))
    return float(
        np.mean([times[rng.choice(len(times), k, replace=False)].min() for _ in range(draws)])
    )


def picks_at_unseen_shape(records: list[dict], ks=(1, 4, 8)) -> list[dict]:
    """Per ordered pair of shapes: how close the model's top-k picks at the second come to its
    best measured schedule (1.0 = found it), and the first shape's winner there."""
    rows = []
    groups = _by_shape(records)
    for a, train in groups.items():
        for b, test in groups.items():
            if a == b:
                continue
            predicted = CostModel().fit(train).predict_records(test)
            order = sorted(range(len(test)), key=predicted.__getitem__)
            best = min(r["median_us"] for r in test)
            winner = min(train, key=lambda r: r["median_us"])["schedule"]
            again = [r["median_us"] for r in test if r["schedule"] == winner]
            rows.append(
                {
                    "from": a,
                    "to": b,
                    "candidates": len(test),
                    **{f"top{k}": min(test[i]["median_us"] for i in order[:k]) / best for k in ks},
                    "random4": _random_best(test, 4) / best,
                    "winner_reused": again[0] / best if again else None,
                }
            )
    return rows


def run_sweeps(run_dir: str) -> dict[str, list[dict]]:
    """A loop run's reference sweep per operator (its sweep.jsonl), verified records only."""
    out: dict[str, list[dict]] = {}
    with open(f"{run_dir}/sweep.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") == "passed" and r.get("median_us"):
                out.setdefault(r["job"].removeprefix("sweep-"), []).append(r)
    return out


def top_quarter(model: CostModel, sweep: list[dict]) -> tuple[float, int]:
    """(best time among the predicted-fastest quarter / the sweep's best, schedules not timed)."""
    predicted = model.predict_records(sweep)
    order = sorted(range(len(sweep)), key=predicted.__getitem__)
    keep = max(1, len(sweep) // 4)
    best = min(r["median_us"] for r in sweep)
    return min(sweep[i]["median_us"] for i in order[:keep]) / best, len(sweep) - keep


def in_run(run_dir: str, prior: dict[str, list[dict]]) -> list[dict]:
    """Per operator of a loop run: its cold job's cost model fitted three ways, scored on the
    run's reference sweep at the job's shape."""
    jobs = loop_records(f"{run_dir}/evidence.jsonl")
    rows = []
    for op, sweep in sorted(run_sweeps(run_dir).items()):
        dims = list(sweep[0]["dims"])
        own = [r for r in jobs.get(op, []) if r["job"] == f"cold-{op}"]
        row = {"op": op, "sweep": len(sweep), "own": len(own), "prior": len(prior.get(op, []))}
        best = min(r["median_us"] for r in sweep)
        row["random_quarter"] = _random_best(sweep, max(1, len(sweep) // 4)) / best
        for key, train in (
            ("job", own),
            ("prior", prior.get(op, [])),
            ("both", own + prior.get(op, [])),
        ):
            model = CostModel(dim_order=dims).fit(train)
            row[key] = model.score(sweep) if model.fitted else None
            row[f"{key}_top"] = top_quarter(model, sweep) if model.fitted else None
        rows.append(row)
    return rows


def write_fixture(path: str, sweeps_glob: str, loop: str, run_dir: str) -> None:
    """The records the cost model's regression test reads (tests/factory/test_costmodel_recorded
    .py), gzipped JSON: each record [schedule index, dims index, bytes, median_us] into shared
    tables of schedules and dims; "sweeps" and "loop" per operator, and of loop run 3 its
    reference sweep ("run_sweep") and each cold job's own records ("run_cold")."""
    import gzip

    schedules: dict[str, int] = {}
    dims: dict[str, int] = {}

    def enc(r: dict) -> list:
        s = json.dumps(r["schedule"], sort_keys=True)
        d = json.dumps(r["dims"], sort_keys=True)
        si = schedules.setdefault(s, len(schedules))
        di = dims.setdefault(d, len(dims))
        return [si, di, r["bytes"], r["median_us"]]

    jobs = loop_records(f"{run_dir}/evidence.jsonl")
    sweep = run_sweeps(run_dir)
    out = {
        "sweeps": {op: [enc(r) for r in v] for op, v in sweep_records(sweeps_glob).items()},
        "loop": {op: [enc(r) for r in v] for op, v in loop_records(loop).items()},
        "run_sweep": {op: [enc(r) for r in v] for op, v in sweep.items()},
        "run_cold": {
            op: [enc(r) for r in jobs.get(op, []) if r["job"] == f"cold-{op}"] for op in sweep
        },
    }
    out["schedules"] = [json.loads(s) for s in schedules]
    out["dims"] = [json.loads(d) for d in dims]
    with gzip.open(path, "wt") as f:
        json.dump(out, f, separators=(",", ":"))


def fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweeps", default=SWEEPS)
    p.add_argument("--loop", default=LOOP)
    p.add_argument("--run", default=RUN, help="a lab.probes.loop_run output with sweep.jsonl")
    p.add_argument("--write-fixture", metavar="PATH", help="write the test fixture and stop")
    a = p.parse_args(argv)
    if a.write_fixture:
        write_fixture(a.write_fixture, a.sweeps, a.loop, a.run)
        return 0
    sweeps = sweep_records(a.sweeps)
    loop = loop_records(a.loop) if a.loop else {}
    lines = [
        "| operator | sweep records | 5-fold on sweeps | shape to shape | loop records | "
        "sweeps -> loop | 5-fold on loop |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in sorted(set(sweeps) | set(loop)):
        s, lp = sweeps.get(op, []), loop.get(op, [])
        transfer = CostModel().fit(s).score(lp) if s and lp else None
        lines.append(
            f"| {op} | {len(s)} | {fmt(held_out_spearman(s) if s else None)} | "
            f"{fmt(shape_transfer(s) if s else None)} | {len(lp)} | "
            f"{fmt(transfer)} | {fmt(held_out_spearman(lp) if lp else None)} |"
        )
    lines += [
        "",
        "| operator | fitted at | picking at | measured there | best of top 1 | top 4 | top 8 | "
        "4 at random | winner of the first shape |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def shape(key: str) -> str:
        return "x".join(str(v) for v in json.loads(key).values())

    for op in sorted(sweeps):
        for row in picks_at_unseen_shape(sweeps[op]):
            reused = (
                "not timed there" if row["winner_reused"] is None else f"{row['winner_reused']:.3f}"
            )
            lines.append(
                f"| {op} | {shape(row['from'])} | {shape(row['to'])} | {row['candidates']} | "
                f"{row['top1']:.3f} | {row['top4']:.3f} | {row['top8']:.3f} | "
                f"{row['random4']:.3f} | {reused} |"
            )
    if a.run:
        lines += [
            "",
            f"In-run ({a.run}): the cold job's model on the run's reference sweep. Spearman; in "
            "brackets the best of the predicted-fastest quarter over the sweep's best.",
            "",
            "| operator | sweep | job records | fitted on the job | recorded sweeps | "
            "both | a random quarter | not timed (quarter kept) |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def cell(row, key):
            top = row[f"{key}_top"]
            return f"{fmt(row[key])} ({top[0]:.3f})" if top else fmt(row[key])

        for row in in_run(a.run, sweeps):
            skipped = row["both_top"][1] if row["both_top"] else "-"
            lines.append(
                f"| {row['op']} | {row['sweep']} | {row['own']} | {cell(row, 'job')} | "
                f"{cell(row, 'prior')} | {cell(row, 'both')} | ({row['random_quarter']:.3f}) | "
                f"{skipped} |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
