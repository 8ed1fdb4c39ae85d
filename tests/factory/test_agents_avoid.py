"""The planner's avoid-lists: a value earns its place from records that hold no value already
on the list (factory.agents.offline.avoid_lists)."""

from __future__ import annotations

import json

import pytest

from factory.agents.context import build_context
from factory.agents.offline import OfflinePlanner, avoid_lists
from factory.evidence import signature_of
from factory.spec import load_catalogue


@pytest.fixture(scope="module")
def layernorm():
    return load_catalogue()["layernorm"]


def _records(w, rows):
    """Passed records of one job at the workload's first shape: (threads, store, vec, us)."""
    dims = dict(w.shapes[0])
    out = []
    for t, store, vec, us in rows:
        schedule = {"threads_per_row": t, "store_hint": store, "vec": vec}
        out.append(
            {
                "job": "j",
                "workload_sha256": w.sha256,
                "family": "norm",
                "signature": signature_of(w),
                "dims": dims,
                "dtype": "fp32",
                "gpu": "sm_90",
                "schedule": schedule,
                "ptx_sha256": f"j-{json.dumps(schedule, sort_keys=True)}",
                "status": "passed",
                "reason": "",
                "median_us": us,
                "tbps": 1.0,
                "generation": 0,
            }
        )
    return out


def _plan(w, rows):
    ctx = build_context(
        w, generation=1, population=8, evidence=_records(w, rows), seed=0, settings={"job": "j"}
    )
    return ctx, OfflinePlanner().plan(ctx)


# vec=1 is slow wherever it is (also beside the best layout with streaming stores off); the
# streaming stores ("cs") are slow only in records that also hold vec=1: on average 2.6x the
# best, never within 5%, in no level one-field pair, so the old rule avoided both.
CONFOUNDED = [
    (128, "none", 4, 100.0),
    (256, "none", 4, 110.0),
    (64, "none", 4, 105.0),
    (128, "none", 1, 290.0),
    (32, "cs", 1, 300.0),
    (64, "cs", 1, 320.0),
    (256, "cs", 1, 310.0),
    (128, "cs", 4, 120.0),
]


def test_a_value_slow_only_beside_an_avoided_value_is_not_avoided(layernorm):
    ctx, plan = _plan(layernorm, CONFOUNDED)
    cs = ctx.lessons.choices["store_hint"]['"cs"']
    # what the old rule read: tried 4 times, never winning, 2.6x on average, no level pair
    assert cs["n"] == 4 and cs["wins"] == 0 and cs["mean_rel"] > 1.5 and not cs["even"]
    assert plan.avoid == {"vec": [1]}
    # the one cs record without vec=1 ran 1.2x: cs alone has too few slow records


def test_a_value_slow_on_its_own_is_still_avoided(layernorm):
    # three more cs records, with vec=4, each about 2x the best: slow without vec=1 too
    rows = [*CONFOUNDED, (64, "cs", 4, 200.0), (256, "cs", 4, 210.0), (32, "cs", 4, 190.0)]
    _, plan = _plan(layernorm, rows)
    assert plan.avoid == {"vec": [1], "store_hint": ["cs"]}


def test_values_that_always_come_together_are_avoided_together(layernorm):
    # vec=1 and streaming stores only ever in the same three slow records: the records cannot
    # tell them apart, so both stay held out (as before)
    rows = [
        (128, "none", 4, 100.0),
        (256, "none", 4, 104.0),
        (32, "cs", 1, 300.0),
        (64, "cs", 1, 320.0),
        (256, "cs", 1, 310.0),
    ]
    ctx, plan = _plan(layernorm, rows)
    assert plan.avoid == {"store_hint": ["cs"], "vec": [1]}
    assert avoid_lists(ctx) == plan.avoid


def test_no_lessons_no_avoid_list(layernorm):
    ctx, plan = _plan(layernorm, [(128, "none", 4, 100.0)])
    assert plan.avoid == {}
    ctx.lessons = None
    assert avoid_lists(ctx) == {}


def _past(w, rows, dims, job="past"):
    """The same records left by an earlier job at `dims`."""
    out = _records(w, rows)
    for r in out:
        r["job"] = job
        r["dims"] = dict(dims)
        r["ptx_sha256"] = f"{job}-{r['ptx_sha256']}"
    return out


def _plan_from_past(w, past):
    ctx = build_context(w, generation=0, population=8, evidence=past, seed=0, settings={"job": "j"})
    return ctx, OfflinePlanner().plan(ctx)


def test_values_slow_at_a_neighbouring_shape_are_not_avoided_here(layernorm):
    # An earlier job at a shape 0.6 log2 units away found vec=1 slow: the lessons carry it
    # (they steer the picks), but a value's speed moves with the shape, so nothing is held out.
    dims = dict(layernorm.shapes[0])
    first = sorted(dims)[0]
    near = {**dims, first: dims[first] * 3 // 2}  # not one of the job's own shapes
    ctx, plan = _plan_from_past(layernorm, _past(layernorm, CONFOUNDED, near))
    assert ctx.lessons.choices["vec"]["1"]["n"] == 4
    assert plan.avoid == {}
    assert avoid_lists(ctx) == {}


def test_values_slow_at_this_shape_in_an_earlier_job_are_avoided(layernorm):
    # the same records from an earlier job at this very shape do hold vec=1 out
    dims = dict(layernorm.shapes[0])
    ctx, plan = _plan_from_past(layernorm, _past(layernorm, CONFOUNDED, dims))
    assert avoid_lists(ctx) == {"vec": [1]}
