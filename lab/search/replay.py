"""The search benchmark replayed on the CPU from a recorded sweep (issue 53).

    PYTHONPATH=. python3 -m lab.search.replay SWEEP.json --out DIR [--seeds 5]
        [--population 8] [--generations 25] [--random-seeds 200] [--with-compile]
        [--compile-cache DIR] [--no-screen]

A sweep (lab.search.sweep_matmul, format "matmul-sweep-1") timed every valid schedule of the
tensor-core family's space at a few shapes and recorded what each cost on the GPU (check and
timing seconds; with --with-compile its compile seconds too). Each shape is one job here. Every
strategy proposes a generation of `population` schedules at a time; each proposal is "measured"
by looking its time up in the table and costs its recorded seconds; the job's GPU-seconds are
the sum. A strategy reaches the job when its best so far is within 2% of the sweep's best at
that shape; its GPU-seconds to reach are counted at the end of that generation (a batch comes
back whole). Strategies:

- random: uniform draws without replacement from the space at that shape;
- agents cold: the offline agents (factory.loop.propose_with_report, backend "offline") with no
  evidence but the job's own;
- agents warm: the same with the evidence earlier jobs at the other shapes left, those jobs
  being cold agents' runs (same seed) of `warm_generations` generations each;
- cost model: factory.costmodel.CostModel fitted on that same evidence from other shapes and
  refitted on the job's results after every generation, timing its predicted-fastest untried
  schedules.

A schedule the agents propose that the sweep did not measure costs the table's mean and gives
no time; when the sweep was cut short (a uniform sample of each shape), the sample is the space
instead: random search and the cost model draw from it, and any other proposal costs nothing and
gives nothing. The report counts such proposals. The JSON under --out holds every run's
per-generation curve; lab.search.report writes the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field

WITHIN = 0.02  # "within 2% of the sweep's best"


def schedule_key(schedule: dict) -> str:
    """A schedule's identity across IRs: its fields without the family and problem names."""
    return json.dumps(
        {k: v for k, v in schedule.items() if k not in ("family", "problem")}, sort_keys=True
    )


def shape_name(dims: dict) -> str:
    return "x".join(str(dims[d]) for d in ("M", "N", "K") if d in dims)


@dataclass
class Cell:
    """One schedule measured at one shape."""

    key: str
    schedule: dict
    status: str  # "passed", "failed" (wrong output), "error", "not_compiled"
    median_us: float | None
    cost_s: float  # GPU-seconds (check + timing; + compile with --with-compile)


@dataclass
class Table:
    """One job: every schedule of the space at one shape and what the sweep measured of it."""

    dims: dict
    space: list[dict]  # every schedule of the space (measured or not)
    cells: dict[str, Cell] = field(default_factory=dict)
    # A sweep cut short measured a sample of the space: the replay then treats that sample as
    # the space (random search draws from it; any other proposal costs nothing, gives nothing
    # and is counted).
    measured_only: bool = False
    # With the sample as the space, a proposal outside the sample would still have run on the
    # GPU: charge_unmeasured costs it the sample's mean (it still gives no time).
    charge_unmeasured: bool = False

    @property
    def name(self) -> str:
        return shape_name(self.dims)

    @property
    def best_us(self) -> float:
        return min(c.median_us for c in self.cells.values() if c.median_us)

    @property
    def target_us(self) -> float:
        return self.best_us * (1.0 + WITHIN)

    @property
    def mean_cost_s(self) -> float:
        return statistics.fmean(c.cost_s for c in self.cells.values())

    @property
    def within(self) -> int:
        """How many schedules reach the target: what random search draws against."""
        return sum(1 for c in self.cells.values() if c.median_us and c.median_us <= self.target_us)

    def measure(self, schedule: dict) -> tuple[Cell | None, float]:
        """The cell a proposal looks up (None: the sweep did not measure it) and its cost."""
        cell = self.cells.get(schedule_key(schedule))
        if cell is not None:
            return cell, cell.cost_s
        if self.measured_only and not self.charge_unmeasured:
            return None, 0.0
        return None, self.mean_cost_s

    @property
    def draw_space(self) -> list[dict]:
        """What random search draws from: the space, or the measured sample of it."""
        if self.measured_only:
            return [c.schedule for c in self.cells.values()]
        return self.space


def tables_from_sweep(
    data: dict, *, with_compile: bool = False, measured_only: bool | None = None
) -> list[Table]:
    """One Table per shape of a sweep file; compile seconds added to each cell's cost when
    asked (the compile runs on a CPU, so by default it is not GPU time). `measured_only`
    (default: when the sweep was cut short) makes each shape's measured sample its space."""
    if measured_only is None:
        measured_only = not data.get("complete", True)
    if data.get("format") != "matmul-sweep-1":
        raise ValueError(f"not a matmul sweep: format {data.get('format')!r}")
    schedules = data["schedules"]
    # compile seconds by schedule id (the sweep names the id; a list without ids is in order)
    compile_s = {
        int(c.get("id", pos)): float(c.get("compile_s") or 0.0)
        for pos, c in enumerate(data.get("compile") or [])
    }
    tables = [
        Table(dims=dict(d), space=schedules, measured_only=measured_only) for d in data["shapes"]
    ]
    by_shape = {json.dumps(t.dims, sort_keys=True): t for t in tables}
    for m in data["measurements"]:
        t = by_shape.get(json.dumps(m["dims"], sort_keys=True))
        if t is None:
            continue
        sched = schedules[m["id"]]
        cost = float(m.get("check_s") or 0.0) + float(m.get("time_s") or 0.0)
        if with_compile:
            cost += compile_s.get(m["id"], 0.0)
        ok = m.get("status") == "passed" and m.get("median_us")
        t.cells[schedule_key(sched)] = Cell(
            key=schedule_key(sched),
            schedule=sched,
            status=m.get("status", "error"),
            median_us=float(m["median_us"]) if ok else None,
            cost_s=cost,
        )
    return [t for t in tables if any(c.median_us for c in t.cells.values())]


@dataclass
class Step:
    generation: int
    proposed: int
    gpu_s: float  # cumulative, end of this generation
    best_us: float | None  # best so far
    unmeasured: int = 0  # proposals the sweep has no row for (cumulative)


@dataclass
class Run:
    strategy: str
    job: str
    seed: int
    steps: list[Step] = field(default_factory=list)
    note: str = ""

    def reach_s(self, target_us: float) -> float | None:
        """GPU-seconds at the end of the generation whose best first reached `target_us`."""
        for s in self.steps:
            if s.best_us is not None and s.best_us <= target_us:
                return s.gpu_s
        return None

    def reach_generation(self, target_us: float) -> int | None:
        for s in self.steps:
            if s.best_us is not None and s.best_us <= target_us:
                return s.generation
        return None


class Ledger:
    """A job's measurements as a strategy makes them: cost, best so far, evidence records."""

    def __init__(self, table: Table, strategy: str, seed: int, job_id: str, workload=None):
        self.table = table
        self.run = Run(strategy=strategy, job=table.name, seed=seed)
        self.job_id = job_id
        self.workload = workload
        self.gpu_s = 0.0
        self.best: float | None = None
        self.tried: set[str] = set()
        self.records: list[dict] = []
        self.unmeasured = 0

    def measure_generation(self, generation: int, schedules: list[dict], roles=None) -> None:
        for i, sched in enumerate(schedules):
            key = schedule_key(sched)
            cell, cost = self.table.measure(sched)
            self.gpu_s += cost
            self.tried.add(key)
            if cell is None:
                self.unmeasured += 1
            us = cell.median_us if cell is not None else None
            if us is not None and (self.best is None or us < self.best):
                self.best = us
            self.records.append(self._record(generation, sched, cell, roles[i] if roles else ""))
        self.run.steps.append(
            Step(
                generation=generation,
                proposed=len(schedules),
                gpu_s=round(self.gpu_s, 4),
                best_us=self.best,
                unmeasured=self.unmeasured,
            )
        )

    def reached(self) -> bool:
        return self.best is not None and self.best <= self.table.target_us

    def _record(self, generation: int, sched: dict, cell: Cell | None, role: str) -> dict:
        """An evidence record as factory.loop.records_from_results writes one."""
        from factory import evidence as ev

        dims = self.table.dims
        flops = 2.0 * dims["M"] * dims["N"] * dims["K"]
        io = 2.0 * (
            dims["M"] * dims["K"] + dims["N"] * dims["K"] + dims["N"] + dims["M"] * dims["N"]
        )
        us = cell.median_us if cell is not None else None
        w = self.workload
        return {
            "job": self.job_id,
            "workload_sha256": w.sha256 if w is not None else f"w-{self.table.name}",
            "family": ev.family_of(w) if w is not None else "matmul",
            "signature": ev.signature_of(w) if w is not None else "matmul",
            "dtype": ev.dtype_of(w) if w is not None else "bf16",
            "gpu": "sm_90",
            "generation": generation,
            "schedule": sched,
            "ptx_sha256": hashlib.sha256(schedule_key(sched).encode()).hexdigest(),
            "role": role,
            "backend": "offline",
            "status": "passed" if us else (cell.status if cell is not None else "missing"),
            "reason": "" if us else "replay: no time in the sweep",
            "dims": dict(dims),
            "median_us": us,
            "tbps": io / (us * 1e6) if us else None,
            "bytes": io,
            "flops": flops,
        }


def admissible_keys(workload) -> set[str] | None:
    """The schedules a job may run: the family's space at the job's shapes that also serves its
    held-out shapes (the agents keep to the same set, factory.agents.context). None where the
    job has no held-out shapes."""
    from factory import families
    from factory.agents.context import admissible_space

    held = [dict(d) for d in (getattr(workload, "heldout_shapes", ()) or ())]
    if not held:
        return None
    fam, ir = families.family_for(workload)
    dims = [dict(d) for d in workload.shapes]
    return {schedule_key(s.to_dict()) for s in admissible_space(fam, ir, dims, held)}


def restrict(table: Table, keys: set[str] | None) -> Table:
    """The table with only the schedules in `keys` (its space, cells, best and target): a job's
    best is the best kernel it could ship, not one that cannot run at its held-out shapes."""
    if keys is None:
        return table
    return dataclasses.replace(
        table,
        space=[s for s in table.space if schedule_key(s) in keys],
        cells={k: c for k, c in table.cells.items() if k in keys},
    )


def replay_random(table: Table, *, seed: int, population: int, max_generations: int) -> Run:
    """Uniform draws without replacement from the space, `population` per generation, until the
    target is reached, the space is spent or `max_generations`."""
    order = list(table.draw_space)
    random.Random(seed).shuffle(order)
    led = Ledger(table, "random", seed, f"random-{table.name}-{seed}")
    for g in range(max_generations):
        batch = order[g * population : (g + 1) * population]
        if not batch:
            break
        led.measure_generation(g, batch)
        if led.reached():
            break
    return led.run


_GENERATORS: dict = {}
_EMITTED: dict = {}


def _cached_emit(emit):
    """The family's emit, each (IR, schedule, arch) rendered once per process: a replay asks
    for the same schedules in every generation of every run, and a GELU epilogue takes a
    noticeable fraction of a second to render."""

    def cached(ir, schedule, arch="sm_90a"):
        try:
            key = (ir, schedule, arch)
            hash(key)
        except TypeError:  # a dict schedule: not cached
            return emit(ir, schedule, arch)
        hit = _EMITTED.get(key)
        if hit is None:
            if len(_EMITTED) > 20_000:
                _EMITTED.clear()
            hit = _EMITTED[key] = emit(ir, schedule, arch)
        return hit

    return cached


def _settings(job_id: str, screen: bool) -> dict:
    """The agents' settings for a replayed job: the matmul family with a cached emitter, and
    without compile reports when not screening (the agents then keep every pick as it is,
    Context.screened)."""
    if screen not in _GENERATORS:
        from factory import families

        fam = families.get("matmul")
        changes = {"emit": _cached_emit(fam.emit)}
        if not screen:
            changes["reports"] = None
        _GENERATORS[screen] = dataclasses.replace(fam, **changes)
    return {"job": job_id, "generator": _GENERATORS[screen]}


def replay_agents(
    table: Table,
    workload,
    *,
    seed: int,
    population: int,
    max_generations: int,
    evidence: list[dict] = (),
    strategy: str = "agents_cold",
    screen: bool = True,
    stop_at_target: bool = True,
    sample_is_space: bool = True,
) -> tuple[Run, list[dict]]:
    """The offline agents on this job, generation after generation, each proposal measured from
    the table; returns the run and the evidence records the job left."""
    from factory.loop import propose_with_report

    job_id = f"{strategy}-{table.name}-{seed}"
    led = Ledger(table, strategy, seed, job_id, workload)
    past = list(evidence)
    settings = _settings(job_id, screen)
    if table.measured_only and sample_is_space:
        # the sample is the job's space for the agents too, as it is for random search and
        # the cost model (they draw from it): a proposal outside it is never made
        measured = set(table.cells)
        settings["space_filter"] = lambda d: schedule_key(d) in measured
    for g in range(max_generations):
        drafts, _ = propose_with_report(
            workload,
            generation=g,
            population=population,
            evidence=past + led.records,
            seed=seed,
            settings=dict(settings),
        )
        scheds = [d.schedule for d in drafts if d.schedule]
        if not scheds:
            led.run.note = f"no proposal in generation {g}"
            break
        led.measure_generation(g, scheds, [d.role for d in drafts if d.schedule])
        if stop_at_target and led.reached():
            break
    return led.run, led.records


def replay_costmodel(
    table: Table, *, seed: int, population: int, max_generations: int, evidence: list[dict]
) -> Run:
    """The cost model alone: fitted on `evidence` (other shapes) and the job's results so far,
    it times its predicted-fastest untried schedules, `population` per generation."""
    from factory.costmodel import CostModel

    led = Ledger(table, "costmodel", seed, f"costmodel-{table.name}-{seed}")
    dims = table.dims
    flops = 2.0 * dims["M"] * dims["N"] * dims["K"]
    io = 2.0 * (dims["M"] * dims["K"] + dims["N"] * dims["K"] + dims["N"] + dims["M"] * dims["N"])
    rng = random.Random(seed)
    for g in range(max_generations):
        model = CostModel(family="matmul", dim_order=["M", "N", "K"]).fit(
            list(evidence) + led.records
        )
        untried = [s for s in table.draw_space if schedule_key(s) not in led.tried]
        if not untried:
            break
        if model.fitted:
            pred = model.predict_many(untried, dims, io, flops)
            ranked = [s for _, _, s in sorted(zip(pred, range(len(untried)), untried, strict=True))]
        else:  # nothing to fit on: a random generation
            ranked = rng.sample(untried, len(untried))
        led.measure_generation(g, ranked[:population])
        if led.reached():
            break
    return led.run


def benchmark(
    tables: list[Table],
    *,
    seeds: list[int],
    random_seeds: int,
    population: int,
    max_generations: int,
    warm_generations: int,
    screen: bool = True,
    workload_for=None,
    manifest: str = "factory/examples/matmul_bias_gelu.toml",
    admissible_only: bool = True,
    sample_is_space: bool = True,
    log=print,
) -> dict:
    """Every strategy on every job: the runs, and per job the median GPU-seconds to reach."""
    if workload_for is None:
        from lab.search.sweep_matmul import manifest_workload

        def workload_for(t):
            return manifest_workload([t.dims], manifest)

    workloads = {t.name: workload_for(t) for t in tables}
    if admissible_only:
        tables = [restrict(t, admissible_keys(workloads[t.name])) for t in tables]
    runs: list[Run] = []
    for t in tables:
        for s in range(random_seeds):
            runs.append(replay_random(t, seed=s, population=population, max_generations=10**6))
    # earlier jobs for the warm starts: a cold run of warm_generations at each shape, per seed
    history: dict[tuple[str, int], list[dict]] = {}
    for seed in seeds:
        for t in tables:
            t0 = time.monotonic()
            run, _ = replay_agents(
                t,
                workloads[t.name],
                seed=seed,
                population=population,
                max_generations=max_generations,
                screen=screen,
                sample_is_space=sample_is_space,
            )
            runs.append(run)
            _, records = replay_agents(
                t,
                workloads[t.name],
                seed=seed,
                population=population,
                max_generations=warm_generations,
                strategy="earlier",
                screen=screen,
                sample_is_space=sample_is_space,
                stop_at_target=False,
            )
            history[(t.name, seed)] = records
            log(
                f"cold {t.name} seed {seed}: reach {run.reach_s(t.target_us)} s "
                f"({time.monotonic() - t0:.0f} s wall)"
            )
        for t in tables:
            others = [r for o in tables if o.name != t.name for r in history[(o.name, seed)]]
            run, _ = replay_agents(
                t,
                workloads[t.name],
                seed=seed,
                population=population,
                max_generations=max_generations,
                evidence=others,
                strategy="agents_warm",
                screen=screen,
                sample_is_space=sample_is_space,
            )
            runs.append(run)
            runs.append(
                replay_costmodel(
                    t,
                    seed=seed,
                    population=population,
                    max_generations=max_generations,
                    evidence=others,
                )
            )
            log(f"warm {t.name} seed {seed}: reach {run.reach_s(t.target_us)} s")
    return summarize(tables, runs, population=population, warm_generations=warm_generations)


STRATEGIES = ("random", "agents_cold", "agents_warm", "costmodel")


def summarize(tables: list[Table], runs: list[Run], **params) -> dict:
    """Per job and strategy: how many runs reached the target, the median (and quartiles) of
    GPU-seconds and generations to reach (a run that never reached counts as infinite: the
    median is then infinite when half or more never did), and the two ratios the issue asks
    for; their medians over jobs."""
    jobs = []
    for t in tables:
        row: dict = {
            "job": t.name,
            "dims": t.dims,
            "space": len(t.space),
            "measured": len(t.cells),
            "timed": sum(1 for c in t.cells.values() if c.median_us),
            "best_us": t.best_us,
            "within_2pct": t.within,
            "mean_cost_s": t.mean_cost_s,
            "strategies": {},
        }
        for name in STRATEGIES:
            mine = [r for r in runs if r.job == t.name and r.strategy == name]
            if not mine:
                continue
            reach = [r.reach_s(t.target_us) for r in mine]
            gens = [r.reach_generation(t.target_us) for r in mine]
            vals = sorted(x if x is not None else math.inf for x in reach)
            row["strategies"][name] = {
                "runs": len(mine),
                "reached": sum(1 for x in reach if x is not None),
                "median_s": _quantile(vals, 0.5),
                "p25_s": _quantile(vals, 0.25),
                "p75_s": _quantile(vals, 0.75),
                "median_generations": _quantile(
                    sorted(g + 1 if g is not None else math.inf for g in gens), 0.5
                ),
                "unmeasured": sum(r.steps[-1].unmeasured for r in mine if r.steps),
            }
        st = row["strategies"]
        row["agents_over_random"] = _ratio(st, "agents_cold", "random")
        row["warm_over_cold"] = _ratio(st, "agents_warm", "agents_cold")
        row["costmodel_over_random"] = _ratio(st, "costmodel", "random")
        jobs.append(row)
    out = {
        "params": params,
        "within": WITHIN,
        "jobs": jobs,
        "median_agents_over_random": _median_of(jobs, "agents_over_random"),
        "median_warm_over_cold": _median_of(jobs, "warm_over_cold"),
        "median_costmodel_over_random": _median_of(jobs, "costmodel_over_random"),
        "runs": [dataclasses.asdict(r) for r in runs],
    }
    out["agents_third_of_random"] = (
        out["median_agents_over_random"] is not None and out["median_agents_over_random"] <= 1 / 3
    )
    out["warm_half_of_cold"] = (
        out["median_warm_over_cold"] is not None and out["median_warm_over_cold"] <= 0.5
    )
    return out


def _quantile(sorted_vals: list[float], q: float) -> float | None:
    """The q-quantile by linear interpolation (infinite values sort last and stay infinite)."""
    if not sorted_vals:
        return None
    pos = q * (len(sorted_vals) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = sorted_vals[lo], sorted_vals[hi]
    if math.isinf(a) or math.isinf(b):
        return a if pos == lo else (b if math.isinf(b) else a)
    return a + (b - a) * (pos - lo)


def _ratio(st: dict, a: str, b: str) -> float | None:
    if a not in st or b not in st:
        return None
    x, y = st[a]["median_s"], st[b]["median_s"]
    if x is None or y is None or y == 0 or math.isinf(y):
        return None
    return x / y  # infinite when `a` mostly never reached


def _median_of(jobs: list[dict], key: str) -> float | None:
    vals = [j[key] for j in jobs if j[key] is not None]
    return statistics.median(vals) if vals else None


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_json_safe(v) for v in x]
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--random-seeds", type=int, default=200)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--generations", type=int, default=25)
    ap.add_argument("--warm-generations", type=int, default=4)
    ap.add_argument("--with-compile", action="store_true")
    ap.add_argument("--no-screen", action="store_true", help="skip the agents' CPU compiles")
    ap.add_argument("--compile-cache", default="var/compile-cache")
    ap.add_argument(
        "--charge-unmeasured",
        action="store_true",
        help="a cut-short sweep: cost a proposal outside the sample at the sample's mean",
    )
    ap.add_argument(
        "--agents-whole-space",
        action="store_true",
        help="a cut-short sweep: let the agents propose outside the sample (each such "
        "proposal gives no time; with --charge-unmeasured it costs the sample's mean)",
    )
    ap.add_argument(
        "--whole-space",
        action="store_true",
        help="keep schedules that cannot run at a job's held-out shapes (the agents never "
        "propose them) in the space, the best and random's draws",
    )
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    from factory.compile import configure_cache

    configure_cache(args.compile_cache)
    with open(args.sweep) as f:
        data = json.load(f)
    tables = tables_from_sweep(data, with_compile=args.with_compile)
    for t in tables:
        t.charge_unmeasured = args.charge_unmeasured
    result = benchmark(
        tables,
        seeds=list(range(args.seeds)),
        random_seeds=args.random_seeds,
        population=args.population,
        max_generations=args.generations,
        warm_generations=args.warm_generations,
        screen=not args.no_screen,
        manifest=data.get("manifest") or "factory/examples/matmul_bias_gelu.toml",
        admissible_only=not args.whole_space,
        sample_is_space=not args.agents_whole_space,
    )
    result["sweep"] = {
        "path": args.sweep,
        "env": data.get("env"),
        "complete": data.get("complete"),
        "with_compile": args.with_compile,
        "measured_only": tables[0].measured_only if tables else None,
        "charge_unmeasured": args.charge_unmeasured,
        "admissible_only": not args.whole_space,
        "agents_sample_is_space": not args.agents_whole_space,
        "screen": not args.no_screen,
        "seeds": args.seeds,
        "random_seeds": args.random_seeds,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "replay.json"), "w") as f:
        json.dump(_json_safe(result), f)
    from lab.search.report import write_report

    write_report(result, os.path.join(args.out, "README.md"))
    print(open(os.path.join(args.out, "README.md")).read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
