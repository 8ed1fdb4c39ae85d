"""The cost model against evidence recorded on the H200 (bench/results): a regression check that
needs no GPU. Recorded sweeps hold 51-182 verified schedules per operator at the suite shapes."""

from bench.costmodel_eval import LOOP, SWEEPS, loop_records, sweep_records
from factory.costmodel import CostModel, held_out_spearman


def test_recorded_sweeps_are_read_for_every_suite_operator():
    recs = sweep_records(SWEEPS)
    for op in ("softmax", "cross_entropy", "rmsnorm", "layernorm", "add_rmsnorm", "silu_mul"):
        assert len(recs.get(op, [])) >= 50, op
        assert all(r["median_us"] > 0 and r["schedule"]["family"] == "row" for r in recs[op])


def test_the_cost_model_ranks_held_out_recorded_schedules_well():
    recs = sweep_records(SWEEPS)
    for op in ("softmax", "rmsnorm", "add_rmsnorm"):
        rho = held_out_spearman(recs[op])
        assert rho is not None and rho > 0.8, (op, rho)


def test_a_model_fitted_on_sweeps_ranks_another_runs_schedules_better_than_chance():
    sweeps, loop = sweep_records(SWEEPS), loop_records(LOOP)
    for op in ("softmax", "rmsnorm", "cross_entropy"):
        rho = CostModel().fit(sweeps[op]).score(loop[op])
        assert rho is not None and rho > 0.3, (op, rho)
