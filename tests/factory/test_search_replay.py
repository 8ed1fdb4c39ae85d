"""Issue 53's search benchmark, replayed on the CPU from a sweep table (lab.search): the table,
the GPU-seconds ledger, the strategies, the summary and the report, on a synthetic sweep (times
from the analytic estimate plus noise: a test fixture, never a result)."""

import json
import math

import pytest

from lab.search import replay as R
from lab.search.costmodel_eval import evaluate_job
from lab.search.report import render
from lab.search.synthetic import synthetic_sweep

SQUARE = {"M": 4096, "N": 4096, "K": 4096}
SKINNY = {"M": 128, "N": 4096, "K": 4096}


@pytest.fixture(scope="module")
def sweep():
    return synthetic_sweep([SKINNY, SQUARE], seed=3, failing_every=50)


@pytest.fixture(scope="module")
def tables(sweep):
    return R.tables_from_sweep(sweep)


def test_a_table_holds_each_shapes_times_and_costs(sweep, tables):
    assert [t.name for t in tables] == ["128x4096x4096", "4096x4096x4096"]
    t = tables[1]
    assert len(t.cells) == len(sweep["schedules"]) == len(t.space)
    timed = [m for m in sweep["measurements"] if m["dims"] == SQUARE and m["median_us"]]
    assert t.best_us == min(m["median_us"] for m in timed)
    assert t.target_us == pytest.approx(t.best_us * 1.02)
    assert t.within == sum(1 for m in timed if m["median_us"] <= t.target_us)
    failed = [c for c in t.cells.values() if c.status == "failed"]
    assert failed and all(c.median_us is None for c in failed)
    m0 = next(m for m in sweep["measurements"] if m["dims"] == SQUARE and m["id"] == 0)
    cell = t.cells[R.schedule_key(sweep["schedules"][0])]
    assert cell.cost_s == pytest.approx(m0["check_s"] + m0["time_s"])
    with_compile = R.tables_from_sweep(sweep, with_compile=True)[1]
    assert with_compile.cells[cell.key].cost_s == pytest.approx(cell.cost_s + 0.15)


def test_a_file_of_another_format_is_refused():
    with pytest.raises(ValueError, match="not a matmul sweep"):
        R.tables_from_sweep({"format": "something else"})


def _tiny_table(times, costs):
    space = [{"tile_n": 64 * (i + 1), "problem": "M,N,K", "family": "matmul"} for i in range(4)]
    t = R.Table(dims=dict(SQUARE), space=space)
    for s, us, c in zip(space, times, costs, strict=True):
        k = R.schedule_key(s)
        t.cells[k] = R.Cell(k, s, "passed" if us else "failed", us, c)
    return t


def test_gpu_seconds_to_reach_count_whole_generations():
    t = _tiny_table([10.0, 20.0, 10.1, None], [1.0, 2.0, 3.0, 4.0])
    led = R.Ledger(t, "test", 0, "job")
    led.measure_generation(0, [t.space[1], t.space[3]])  # 20 us and a failure
    led.measure_generation(1, [t.space[2]])  # 10.1 us: within 2% of 10
    assert [s.gpu_s for s in led.run.steps] == [6.0, 9.0]
    assert [s.best_us for s in led.run.steps] == [20.0, 10.1]
    assert led.run.reach_s(t.target_us) == 9.0 and led.run.reach_generation(t.target_us) == 1
    assert led.run.reach_s(9.0) is None
    # a schedule the sweep did not measure costs the table's mean and gives no time
    other = {"tile_n": 512, "problem": "M,N,K"}
    led.measure_generation(2, [other])
    assert led.run.steps[-1].gpu_s == pytest.approx(9.0 + 2.5)
    assert led.run.steps[-1].unmeasured == 1 and led.records[-1]["status"] == "missing"


def test_random_search_draws_without_replacement_until_it_reaches(tables):
    t = tables[0]
    run = R.replay_random(t, seed=1, population=8, max_generations=10**6)
    assert run.reach_s(t.target_us) == run.steps[-1].gpu_s  # it stops once there
    seen = run.steps[-1].proposed + 8 * (len(run.steps) - 1)
    assert seen <= len(t.space)
    costs = [c.cost_s for c in t.cells.values()]
    assert run.steps[-1].gpu_s <= sum(costs) + 1e-9


def test_the_agents_propose_from_the_space_and_read_back_what_they_measured(sweep, tables):
    from lab.search.sweep_matmul import manifest_workload

    t = tables[1]
    run, records = R.replay_agents(
        t,
        manifest_workload([t.dims], sweep["manifest"]),
        seed=0,
        population=6,
        max_generations=3,
        screen=False,
        stop_at_target=False,
    )
    assert [s.generation for s in run.steps] == [0, 1, 2]
    assert run.steps[-1].unmeasured == 0  # every proposal is a schedule of the table
    keys = [R.schedule_key(r["schedule"]) for r in records]
    assert len(keys) == len(set(keys))  # never the same schedule twice in one job
    assert run.steps[-1].gpu_s == pytest.approx(sum(t.cells[k].cost_s for k in keys), abs=1e-3)
    assert all(r["dims"] == SQUARE and r["job"] == records[0]["job"] for r in records)
    bests = [s.best_us for s in run.steps]
    assert bests == sorted(bests, reverse=True)  # best so far never gets worse


def test_the_cost_model_times_its_predicted_fastest_untried_schedules(tables):
    skinny, square = tables
    # evidence from the other shape: every schedule of it, as an earlier job would record
    led = R.Ledger(skinny, "earlier", 0, "earlier-job")
    led.measure_generation(0, list(skinny.space))
    run = R.replay_costmodel(square, seed=0, population=8, max_generations=3, evidence=led.records)
    assert 1 <= len(run.steps) <= 3 and all(s.proposed == 8 for s in run.steps)
    # the synthetic times follow the estimate its features carry: the first pick is close
    assert run.steps[0].best_us <= square.best_us * 1.2


def _run(strategy, job, reach_at, seed=0):
    """A made-up run that reaches its target after `reach_at` GPU-seconds (None: never)."""
    steps = [R.Step(0, 8, 1.0, 100.0)]
    if reach_at is not None:
        steps.append(R.Step(1, 8, reach_at, 1.0))
    return R.Run(strategy=strategy, job=job, seed=seed, steps=steps)


def test_the_summary_takes_medians_over_runs_then_over_jobs():
    a = _tiny_table([1.0, 2.0, 3.0, 4.0], [1.0] * 4)
    b = R.Table(dims={"M": 128, "N": 4096, "K": 4096}, space=a.space, cells=dict(a.cells))
    runs = []
    for job, rand, cold, warm in ((a.name, 30.0, 9.0, 4.0), (b.name, 60.0, 30.0, 20.0)):
        for seed in range(3):
            runs.append(_run("random", job, rand, seed))
            runs.append(_run("agents_cold", job, cold, seed))
            runs.append(_run("agents_warm", job, warm if seed else None, seed))
    out = R.summarize([a, b], runs)
    ja, jb = out["jobs"]
    assert ja["agents_over_random"] == pytest.approx(0.3)
    assert jb["agents_over_random"] == pytest.approx(0.5)
    assert ja["warm_over_cold"] == pytest.approx(4.0 / 9.0)  # two of three reached at 4 s
    assert out["median_agents_over_random"] == pytest.approx(0.4)
    assert out["agents_third_of_random"] is False
    assert out["median_warm_over_cold"] == pytest.approx((4 / 9 + 20 / 30) / 2)
    assert out["warm_half_of_cold"] is False
    assert ja["strategies"]["agents_warm"]["reached"] == 2
    text = render(out)
    assert "does not hold" in text and "| 4096x4096x4096 |" in text


def test_a_strategy_that_mostly_never_reaches_has_an_infinite_median():
    a = _tiny_table([1.0, 2.0, 3.0, 4.0], [1.0] * 4)
    runs = [_run("random", a.name, 10.0, s) for s in range(3)]
    runs += [_run("agents_cold", a.name, None if s else 2.0, s) for s in range(3)]
    out = R.summarize([a], runs)
    assert math.isinf(out["jobs"][0]["strategies"]["agents_cold"]["median_s"])
    assert math.isinf(out["jobs"][0]["agents_over_random"])
    assert out["agents_third_of_random"] is False
    assert "never" in render(R._json_safe(out))


def test_the_benchmark_runs_every_strategy_on_a_synthetic_sweep(sweep, tables):
    out = R.benchmark(
        tables,
        seeds=[0],
        random_seeds=5,
        population=8,
        max_generations=2,
        warm_generations=1,
        screen=False,
        manifest=sweep["manifest"],
        log=lambda m: None,
    )
    assert len(out["jobs"]) == 2
    for j in out["jobs"]:
        assert set(j["strategies"]) == set(R.STRATEGIES)
        assert j["strategies"]["random"]["reached"] == 5  # the space holds the best
    kinds = {(r["strategy"], r["job"]) for r in out["runs"]}
    assert ("agents_warm", "128x4096x4096") in kinds and ("costmodel", "4096x4096x4096") in kinds


def test_the_within_job_evaluation_scores_out_of_fold_predictions():
    # a row-family job whose time grows with threads per row: the model ranks it
    rows = []
    for i, tpr in enumerate((32, 64, 128, 256, 512, 1024)):
        for chunks in (1, 2):
            rows.append(
                {
                    "family": "row",
                    "schedule": {"family": "row", "threads_per_row": tpr, "chunks": chunks},
                    "dims": {"M": 4096, "N": 4096},
                    "bytes": 2 * 4096 * 4096 * 2,
                    "median_us": 20.0 + 5.0 * i + 0.1 * chunks,
                    "status": "passed",
                }
            )
    res = evaluate_job(rows, [], folds=4, dim_order=["M", "N"])
    assert res["n"] == 12 and res["rho"] > 0.8
    assert res["spread"] == pytest.approx(45.2 / 20.1)
    assert evaluate_job(rows[:4], [], folds=4) is None  # too few schedules to rank


def test_the_sweep_covers_every_schedule_of_each_shape_round_robin():
    from lab.search import sweep_matmul as S

    shapes = S.parse_shapes("128x4096x4096, 4096x4096x4096")
    assert shapes == [SKINNY, SQUARE]
    work = S.chunks_round_robin(10, 2, 4, seed=0)
    assert [si for si, _ in work] == [0, 1, 0, 1, 0, 1]  # the shapes take turns
    assert [part for si, part in work if si == 0] == [part for si, part in work if si == 1]
    order = S.schedule_order(10, 0)
    for si in (0, 1):
        ids = [i for s, part in work if s == si for i in part]
        assert ids == order and sorted(ids) == list(range(10)) and ids != list(range(10))
    # the lab IR the sweep renders has the same space as the example workload the agents see
    from factory.families.matmul import space as mm_space
    from lab.matmul.variants import epilogue_irs

    lab = {S.schedule_key(s.to_dict()) for s in mm_space.space(epilogue_irs()[S.OP], shapes)}
    assert lab == {S.schedule_key(s) for s in S.space_schedules(shapes)}
    assert S.schedule_key(S.space_schedules(shapes)[0]) == R.schedule_key(
        S.space_schedules(shapes)[0]
    )


def test_a_sweep_cut_short_replays_its_sample_as_the_space(sweep):
    partial = dict(sweep, complete=False)
    keep = set(range(0, len(sweep["schedules"]), 3))
    partial["measurements"] = [m for m in sweep["measurements"] if m["id"] in keep]
    t = R.tables_from_sweep(partial)[1]
    assert t.measured_only and len(t.cells) == len(keep) and len(t.draw_space) == len(keep)
    missing = sweep["schedules"][1]  # not in the sample
    assert t.measure(missing) == (None, 0.0)
    run = R.replay_random(t, seed=0, population=8, max_generations=10**6)
    assert run.steps[-1].unmeasured == 0 and run.reach_s(t.target_us) is not None
    full = R.tables_from_sweep(partial, measured_only=False)[1]
    assert full.measure(missing) == (None, pytest.approx(full.mean_cost_s))


def test_a_sample_charged_for_proposals_outside_it_costs_them_the_mean(sweep):
    partial = dict(sweep, complete=False)
    keep = set(range(0, len(sweep["schedules"]), 3))
    partial["measurements"] = [m for m in sweep["measurements"] if m["id"] in keep]
    t = R.tables_from_sweep(partial)[1]
    t.charge_unmeasured = True
    missing = sweep["schedules"][1]
    cell, cost = t.measure(missing)
    assert cell is None and cost == pytest.approx(t.mean_cost_s) and cost > 0
    led = R.Ledger(t, "agents_cold", 0, "j")
    led.measure_generation(0, [missing, sweep["schedules"][0]])
    inside = t.cells[R.schedule_key(sweep["schedules"][0])]
    assert led.run.steps[0].gpu_s == pytest.approx(t.mean_cost_s + inside.cost_s, abs=1e-4)
    assert led.run.steps[0].unmeasured == 1 and led.best == inside.median_us


def test_with_a_sample_as_the_space_the_agents_propose_only_inside_it(sweep):
    """A cut-short sweep's sample is the job's space for every strategy: the agents' space,
    default and seeds are filtered to it (settings' space_filter), so none of their
    proposals is unmeasured; with sample_is_space off they may propose outside it."""
    from lab.search.sweep_matmul import manifest_workload

    partial = dict(sweep, complete=False)
    keep = set(range(0, len(sweep["schedules"]), 3))
    partial["measurements"] = [m for m in sweep["measurements"] if m["id"] in keep]
    t = R.tables_from_sweep(partial)[1]
    w = manifest_workload([t.dims])
    run, records = R.replay_agents(
        t, w, seed=0, population=8, max_generations=3, screen=False, stop_at_target=False
    )
    assert records and all(R.schedule_key(r["schedule"]) in t.cells for r in records)
    assert run.steps[-1].unmeasured == 0
    free, _ = R.replay_agents(
        t,
        w,
        seed=0,
        population=8,
        max_generations=3,
        screen=False,
        stop_at_target=False,
        sample_is_space=False,
    )
    assert free.steps[-1].unmeasured > 0


def test_the_report_keeps_hundredths_of_a_gpu_second():
    from lab.search.report import _r, _s

    assert _s(0.0243) == "0.024" and _s("inf") == "never" and _s(None) == "-"
    assert _r(0.00312) == "0.0031" and _r(0.5) == "0.50" and _r("inf") == "inf"


def test_a_held_out_shape_is_ranked_by_a_model_fitted_on_the_other_shapes(sweep):
    from lab.search.costmodel_eval import held_out_shapes, held_out_shapes_report

    records = []
    for m in sweep["measurements"]:
        if m["status"] != "passed":
            continue
        d = m["dims"]
        records.append(
            {
                "source": "matmul",
                "family": "matmul",
                "op": "t",
                "run": "r",
                "job": str(d),
                "schedule": sweep["schedules"][m["id"]],
                "dims": d,
                "flops": 2.0 * d["M"] * d["N"] * d["K"],
                "bytes": 2.0 * (d["M"] * d["K"] + d["N"] * d["K"] + d["M"] * d["N"]),
                "median_us": m["median_us"],
                "status": "passed",
            }
        )
    rows = held_out_shapes(records)
    assert len(rows) == 2
    for r in rows:
        n_shape = sum(1 for x in records if x["dims"] == r["dims"])
        assert r["n"] == n_shape and r["train_other_shapes"] == len(records) - n_shape
        # the synthetic times are the estimate times noise: the estimate alone ranks them well
        assert r["rho_estimate_alone"] > 0.8 and r["rho"] > 0.5
    near = held_out_shapes(records, near=1.25)
    assert all(r["spread"] <= 1.25 and r["n"] < n for r, n in zip(near, [x["n"] for x in rows]))
    assert "| median |" in held_out_shapes_report(rows)


def test_a_fit_on_the_fast_end_keeps_rows_near_their_own_shapes_fastest():
    from lab.search.costmodel_eval import fast_end

    rows = [
        {"run": "r", "dims": {"M": 1}, "median_us": 10.0},
        {"run": "r", "dims": {"M": 1}, "median_us": 14.0},
        {"run": "r", "dims": {"M": 1}, "median_us": 16.0},
        {"run": "r", "dims": {"M": 2}, "median_us": 100.0},
        {"run": "r", "dims": {"M": 2}, "median_us": 149.0},
        {"run": "s", "dims": {"M": 1}, "median_us": 20.0},
    ]
    kept = fast_end(rows, 1.5)
    assert [r["median_us"] for r in kept] == [10.0, 14.0, 100.0, 149.0, 20.0]
    assert fast_end(rows, 0.0) is rows


def test_the_sweeps_prebuilt_kernel_sets_every_attribute_the_bench_kernel_sets():
    """sweep_matmul.make_kernel builds a gemm_bench.Kernel without its constructor; an
    attribute the constructor sets and make_kernel does not (a sweep of 18,840 errors on
    2026-12-07: `compiler`) fails here, without a GPU."""
    import ast
    import inspect

    from lab.matmul import gemm_bench
    from lab.search import sweep_matmul

    init = ast.parse(inspect.getsource(gemm_bench.Kernel.__init__).strip())
    wanted = {
        t.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        for tgt in node.targets
        for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    made = ast.parse(inspect.getsource(sweep_matmul.make_kernel))
    have = {
        t.attr
        for node in ast.walk(made)
        if isinstance(node, ast.Assign)
        for tgt in node.targets
        for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "k"
    }
    assert "compiler" in wanted and "fn" in wanted
    assert wanted <= have, sorted(wanted - have)


def test_a_jobs_table_keeps_only_what_serves_its_held_out_shapes(tables):
    """The replay's best and random's draws come from the schedules a job could ship: the
    agents never propose one that cannot run at the job's held-out shapes (a TMA-store epilogue
    at the derived odd N), so neither may the target."""
    from lab.search.sweep_matmul import manifest_workload

    t = tables[0]
    w = manifest_workload([t.dims])
    assert w.heldout_shapes and any(d["N"] % 8 for d in w.heldout_shapes)
    keys = R.admissible_keys(w)
    assert keys and any(s.get("tma_store") for s in t.space)
    assert not any(json.loads(k).get("tma_store") for k in keys)
    r = R.restrict(t, keys)
    assert r.cells and set(r.cells) <= keys and len(r.cells) < len(t.cells)
    assert all(R.schedule_key(s) in keys for s in r.space)
    assert r.best_us >= t.best_us
    assert R.restrict(t, None) is t


def test_after_generation_zero_one_slot_re_tests_what_the_avoid_lists_hold_out(sweep, tables):
    """A value slow in a few records is avoided, and those records may be slow for their other
    choices: from generation 1 on, one writer slot goes to the model's fastest untried item
    the avoid-lists hold out (at 1024x1024x16384 one-consumer tiles were avoided after three
    slow ones, two of them in 2x1 clusters, and the winner is one-consumer)."""
    from factory.loop import propose_with_report
    from lab.search.sweep_matmul import manifest_workload

    t = tables[1]
    w = manifest_workload([t.dims], sweep["manifest"])
    _, records = R.replay_agents(
        t, w, seed=0, population=8, max_generations=1, screen=False, stop_at_target=False
    )
    # a value some of generation 0's records have and some do not
    field, value = next(
        (f, r["schedule"][f])
        for r in records
        for f in ("tile_n", "stages", "group_m", "tile_m")
        if 0 < sum(x["schedule"].get(f) == r["schedule"][f] for x in records) < len(records)
    )
    one = [r for r in records if r["schedule"].get(field) == value]
    # three slow records with that value (the table's times made 3x slower)
    slow = [dict(r, median_us=r["median_us"] * 3) for r in (one * 3)[:3]]
    for i, r in enumerate(slow):
        r["ptx_sha256"] = f"{r['ptx_sha256'][:60]}{i:04d}"
    evidence = [r for r in records if r["schedule"].get(field) != value] + slow
    settings = R._settings(records[0]["job"], False)  # the same job, its generation 1
    drafts, report = propose_with_report(
        w, generation=1, population=8, evidence=evidence, seed=0, settings=settings
    )
    assert value in report.plan.avoid.get(field, [])
    retests = [d for d in drafts if d.note.startswith("re-test of an avoided choice")]
    avoid = report.plan.avoid

    def held_out(d):
        return any(d.schedule.get(f) in vals for f, vals in avoid.items())

    assert retests and all(held_out(d) for d in retests)
    others = [d for d in drafts if d not in retests and d.schedule]
    assert others and not any(held_out(d) for d in others)
    assert len(retests) <= 2
