"""The offline agents' work over a whole schedule space: the space built once per job shape and
reused, its points described once, and the spread of a generation (farthest-point sampling)
computed over the whole pool at once. Each must pick exactly what the plain definitions pick."""

import random

import pytest

from factory.agents.context import Item, build_context
from factory.agents.offline import OfflineWriter, _distance, _field_values
from factory.agents.ptxedit import edit_space
from factory.families.row.ir import lower
from factory.families.row.schedules import fits_job, space
from factory.spec import load_catalogue

DIMS = [{"M": 4096, "N": 3000}]


@pytest.fixture(scope="module")
def rmsnorm():
    return load_catalogue()["rmsnorm"]


@pytest.fixture(scope="module")
def items(rmsnorm):
    return [Item("generator", s) for s in space(lower(rmsnorm), DIMS)]


def test_a_space_is_built_once_per_shape_and_each_caller_gets_its_own_list(rmsnorm):
    first = space(lower(rmsnorm), DIMS)
    first.clear()  # a caller's list is its own
    again = space(lower(rmsnorm), DIMS)  # lowered anew: the same operator, the same space
    assert again and again == space(lower(rmsnorm), [dict(d) for d in DIMS])
    assert again[0] is space(lower(rmsnorm), DIMS)[0]  # shared, not rebuilt
    other = space(lower(rmsnorm), [{"M": 4096, "N": 5000}])
    assert other != again  # another row length, another space
    ir = lower(rmsnorm)
    assert all(fits_job(ir, s, DIMS) for s in again)


def _spread_by_definition(items, k, rng):
    """Farthest-point sampling as written: the next pick is the first of the items farthest
    from every pick so far."""
    pool = list(items)
    rng.shuffle(pool)
    chosen = [pool.pop()]
    while pool and len(chosen) < k:
        nearest = [min(_distance(it, c) for c in chosen) for it in pool]
        chosen.append(pool.pop(nearest.index(max(nearest))))
    return chosen


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2, 9, 30])
def test_the_spread_picks_what_farthest_point_sampling_picks(items, seed, k):
    pool = random.Random(seed).sample(items, 400) + [Item("edit", e) for e in edit_space()[:60]]
    want = [it.key for it in _spread_by_definition(pool, k, random.Random(seed))]
    got = [it.key for it in OfflineWriter._spread(pool, k, random.Random(seed))]
    assert got == want
    assert len(set(got)) == min(k, len(pool))


def test_field_values_are_each_fields_distinct_values_sorted(items):
    values = _field_values(items)
    for name in ("threads_per_row", "chunks", "load_hint", "fast_math"):
        distinct = {getattr(it.value, name) for it in items}
        assert sorted(values[name], key=str) == sorted(distinct, key=str)
        assert len(values[name]) == len(distinct)
    assert values["threads_per_row"] == sorted(values["threads_per_row"])


def test_items_of_one_point_share_its_description_but_drafts_get_their_own_schedule(rmsnorm):
    w = rmsnorm
    ctx = build_context(w, generation=0, population=4, evidence=[], seed=0, settings={})
    item = ctx.gen_items[0]
    twin = Item("generator", item.value)
    assert twin.key == item.key and twin.values == item.values and twin.schedule == item.schedule
    draft = ctx.draft(item, role="writer", note="test")
    assert draft is not None and draft.schedule == item.schedule
    draft.schedule["threads_per_row"] = -1  # whatever a caller does to its draft
    assert Item("generator", item.value).schedule == item.value.to_dict() == item.schedule
    assert Item("edit", edit_space()[0]).schedule.get("ptx_edit") is True


def test_the_distance_counts_the_fields_that_differ_whatever_the_defaults(items):
    from dataclasses import replace

    base = next(it for it in items if not it.value.split_paths)
    twin = Item("generator", replace(base.value, split_paths=True))  # a field left out at default
    assert len(twin.schedule) == len(base.schedule) + 1
    assert _distance(base, twin) == 1
    tail = "strided" if base.value.tail != "strided" else "vectors"
    other = Item("generator", replace(base.value, tail=tail, chunks=base.value.chunks + 1))
    assert _distance(base, other) == 2 and _distance(twin, other) == 3
    assert _distance(base, Item("edit", edit_space()[0])) == 99  # another kind of point
