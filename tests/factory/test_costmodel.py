import itertools
import math

import numpy as np

from factory.costmodel import (
    LAMBDAS,
    CostModel,
    held_out_spearman,
    prune,
    roofline_us,
    spearman,
)


def landscape(block, vec, n):
    return (2 + 8 * 4 * n * 1024 / 4.3e6) * (
        1 + 0.4 * abs(math.log2(block / 256)) + 0.5 * abs(math.log2(vec / 4))
    )


def records(ns=(1024, 4096, 16384)):
    out = []
    for b, v, n in itertools.product((64, 128, 256, 512, 1024), (1, 2, 4, 8), ns):
        us = landscape(b, v, n)
        out.append(
            {
                "schedule": {"block": b, "vec": v, "cache": "none"},
                "dims": {"M": 1024, "N": n},
                "status": "passed",
                "median_us": us,
                "tbps": 8 * 1024 * n / (us * 1e6),
            }
        )
    return out


def test_spearman_is_one_for_the_same_order_and_handles_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert abs(spearman([1, 1, 2, 3], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-9
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_an_unfitted_model_predicts_the_roofline_prior():
    m = CostModel().fit(records()[:3])
    assert not m.fitted
    assert m.predict_us({"block": 64}, {"N": 1}, 4.3e6) == roofline_us(4.3e6) == 3.0


def test_the_fitted_model_ranks_held_out_schedules_well():
    rho = held_out_spearman(records(), folds=4)
    assert rho is not None and rho > 0.8
    # and generalises to a shape it never saw
    m = CostModel().fit(records(ns=(1024, 16384)))
    assert m.score(records(ns=(4096,))) > 0.8


def test_pruning_keeps_the_predicted_fastest_and_counts_the_time_saved():
    items = ["a", "b", "c", "d"]
    kept, report = prune(items, [4.0, 1.0, 3.0, 2.0], keep=2, gpu_seconds_per_candidate=1.5)
    assert kept == ["b", "d"]
    assert report.pruned == 2 and report.gpu_seconds_saved == 3.0


def test_the_row_length_is_the_workloads_last_dim_even_when_a_store_reorders_the_keys():
    # PostgreSQL jsonb hands {"T": .., "B": .., "D": ..} back as B, D, T: dim_order undoes it.
    from factory.families.row.costmodel import rows_and_length

    assert rows_and_length({"D": 4096, "B": 2, "T": 8}, ["B", "T", "D"]) == (16.0, 4096.0)
    assert rows_and_length({"M": 3, "N": 5}, []) == (3.0, 5.0)


def test_ridge_shrinkage_is_chosen_by_leave_one_out_error_from_the_grid():
    rng = np.random.default_rng(1)
    records = [
        {
            "schedule": {"threads_per_row": int(t), "vec_elems": 8, "mode": "stream"},
            "dims": {"M": 4096, "N": 4096},
            "bytes": 2 * 4096 * 4096 * 2,
            "median_us": 20.0 * (1 + abs(np.log2(t / 256))) * (1 + 0.01 * rng.random()),
            "status": "passed",
        }
        for t in rng.choice([32, 64, 128, 256, 512, 1024], size=40)
    ]
    model = CostModel().fit(records)
    assert model.chosen_lambda in LAMBDAS
    assert model.score(records) > 0.9


def test_predicting_many_schedules_at_once_gives_each_ones_prediction():
    rows = records()
    for r in rows:  # row-layout fields too, so that the layout's share varies
        s = r["schedule"]
        s |= {"threads_per_row": s["block"], "vec_elems": s["vec"], "mode": "cached"}
    m = CostModel(dim_order=["M", "N"]).fit(rows)
    assert m.fitted
    # schedules the fit saw, values it did not (no one-hot share), and a field left out
    scheds = [r["schedule"] for r in rows] + [
        {"block": 64, "vec": 3, "cache": "cs", "threads_per_row": 64, "chunks": 2},
        {"block": 128},
    ]
    dims, nbytes = {"M": 1024, "N": 4096}, 8 * 1024 * 4096
    many = m.predict_many(scheds, dims, nbytes)
    one = [m.predict_us(s, dims, nbytes) for s in scheds]
    assert np.allclose(many, one, rtol=1e-12, atol=0)
    assert len(set(np.round(many, 6))) > 10  # (not one value for all)
    assert CostModel().predict_many(scheds[:3], dims, nbytes) == [roofline_us(nbytes)] * 3


def test_rows_held_by_a_thread_count_in_the_grid_and_in_flight():
    """Two rows a thread: half the blocks for the same rows, twice the rows and the elements in
    flight per SM of one row a thread; a schedule without the field is one row a thread."""
    from factory.families.row.costmodel import layout_features

    one = {
        "threads_per_row": 16,
        "rows_per_block": 8,
        "vec_elems": 8,
        "chunks": 2,
        "mode": "cached",
    }
    f1 = layout_features(one, 131072, 200)
    f2 = layout_features(one | {"rows_per_thread": 2}, 131072, 200)
    assert f1 == layout_features(one | {"rows_per_thread": 1}, 131072, 200)
    assert math.isclose(f2[1], f1[1] - 1)  # log2 waves: half the blocks
    assert math.isclose(f2[4], f1[4] + 1) and math.isclose(f2[5], f1[5] + 1)
    assert f2[0] == f1[0] and f2[6:] == f1[6:]  # same block, same row coverage
