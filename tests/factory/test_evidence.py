import json

from factory.evidence import (
    JsonlEvidenceStore,
    distil_lessons,
    family_of,
    shape_class,
    signature_of,
    warm_start_schedules,
)
from tests.factory.test_loop_fakes import make_workload


def rec(job, schedule, us, *, dims=None, status="passed", family="softmax", reason=""):
    return {
        "job": job,
        "workload_sha256": "w" + job,
        "family": family,
        "signature": "s",
        "dims": dims or {"M": 1024, "N": 4096},
        "dtype": "fp32",
        "gpu": "sm_90",
        "schedule": schedule,
        "ptx_sha256": f"{job}-{json.dumps(schedule, sort_keys=True)}",
        "status": status,
        "reason": reason,
        "median_us": us if status == "passed" else None,
        "tbps": 1.0,
        "generation": 0,
        "role": "writer",
        "backend": "offline",
    }


def test_the_store_filters_by_family_shape_class_dtype_and_gpu():
    store = JsonlEvidenceStore()
    store.add(
        [
            rec("a", {"b": 1}, 5.0),
            rec("b", {"b": 2}, 6.0, family="rmsnorm"),
            rec("c", {"b": 3}, 7.0, dims={"M": 8, "N": 64}),
        ]
    )
    assert [r["job"] for r in store.query(family="softmax")] == ["a", "c"]
    assert [r["job"] for r in store.query(shape_class="M=2^3,N=2^6")] == ["c"]
    assert store.query(dtype="bf16") == [] and len(store.query(gpu="sm_90")) == 3


def test_the_jsonl_store_survives_a_restart_and_stores_a_redelivered_record_once(tmp_path):
    path = tmp_path / "evidence.jsonl"
    store = JsonlEvidenceStore(path)
    store.add([rec("a", {"b": 1}, 5.0)])
    store.add([rec("a", {"b": 1}, 5.0)])  # redelivered
    again = JsonlEvidenceStore(path)
    assert len(again.all()) == 1 and again.all()[0]["median_us"] == 5.0


def test_shape_classes_bucket_to_the_nearest_power_of_two():
    assert shape_class({"N": 4000, "M": 1000}) == "M=2^10,N=2^12"
    assert shape_class({"N": 4096}) == shape_class({"N": 4100})


def test_the_signature_ignores_tensor_names_but_not_the_math():
    a, b = make_workload(input_name="x"), make_workload(input_name="logits")
    assert signature_of(a) == signature_of(b)
    assert signature_of(a) != signature_of(make_workload(dtype="bf16"))
    assert family_of(make_workload("My_Op", tags=("family:softmax",))) == "softmax"
    assert family_of(make_workload("RMSNorm")) == "rmsnorm"


def test_warm_start_ranks_each_past_jobs_winners_relative_to_that_job():
    records = [
        rec("small", {"b": 256}, 5.0, dims={"M": 1024, "N": 4096}),
        rec("small", {"b": 64}, 9.0, dims={"M": 1024, "N": 4096}),
        rec("big", {"b": 512}, 50.0, dims={"M": 4096, "N": 4096}),
        rec("big", {"b": 256}, 52.0, dims={"M": 4096, "N": 4096}),
        rec("far", {"b": 32}, 1.0, dims={"M": 8, "N": 16}),  # too far in shape
        rec("other", {"b": 1024}, 1.0, family="rmsnorm"),
    ]
    got = warm_start_schedules(
        records, family="softmax", dtype="fp32", gpu="sm_90", dims={"M": 2048, "N": 4096}, limit=3
    )
    assert got[:2] in ([{"b": 256}, {"b": 512}], [{"b": 512}, {"b": 256}])
    assert {"b": 32} not in got and {"b": 1024} not in got
    assert got[2] == {"b": 64}
    excluded = warm_start_schedules(
        records,
        family="softmax",
        dtype="fp32",
        gpu="sm_90",
        dims={"M": 1024, "N": 4096},
        exclude_job="small",
    )
    assert {"b": 64} not in excluded


def test_lessons_say_which_choices_win_and_which_failed_and_why():
    records = [
        rec("j", {"block": b, "vec": v}, 10.0 * (1 + abs(b - 256) / 256) / v)
        for b in (64, 256, 1024)
        for v in (1, 4)
    ]
    records.append(
        rec(
            "j",
            {"block": 1024, "vec": 8},
            None,
            status="compile_error",
            reason="compile error: ptxas fatal",
        )
    )
    records.append(
        rec("j", {"block": 64, "vec": 8}, None, status="rejected", reason="spills: 64 bytes stored")
    )
    # Not yet judged (in flight, or left so by a cancelled job): no failure.
    records.append(rec("k", {"block": 128, "vec": 8}, None, status="queued", reason=""))
    lessons = distil_lessons(records, family="softmax", gpu="sm_90")
    assert lessons.records == 9
    assert lessons.preferred("vec")[0] == 4
    assert lessons.preferred("block")[0] == 256
    assert lessons.failures == {"compile_error: compile error": 1, "rejected: spills": 1}
    assert "vec: 4 averages 2.25x" in lessons.text and "failed 1x: rejected: spills" in lessons.text
    assert distil_lessons([], family="x").text.startswith("No evidence yet")


def test_one_field_pairs_tell_a_slow_value_from_the_slow_layouts_it_was_tried_on():
    # Streaming stores on three slow layouts never win and average 2.7x the best, but beside
    # the same layout without them (one field apart) they ran level: the layouts were slow.
    records = [
        rec("j", {"t": 128, "store": "none"}, 100.0),
        rec("j", {"t": 256, "store": "none"}, 200.0),
        rec("j", {"t": 256, "store": "cs"}, 201.0),
        rec("j", {"t": 32, "store": "cs"}, 210.0),
        rec("j", {"t": 64, "store": "cs"}, 400.0),
        # another shape of the job: a group of its own, no pair across groups
        rec("j", {"t": 128, "store": "cs"}, 50.0, dims={"M": 64, "N": 4096}),
    ]
    cs = distil_lessons(records[:5], family="softmax")
    cs = cs.choices["store"]['"cs"']
    assert (cs["n"], cs["wins"], cs["pairs"], cs["even"]) == (3, 0, 1, 1)
    assert cs["mean_rel"] > 1.5
    # 4% slower beside its partner: a pair, not an even one
    slower = [dict(r) for r in records[:5]]
    slower[2]["median_us"] = 208.0
    cs = distil_lessons(slower, family="softmax").choices["store"]['"cs"']
    assert (cs["pairs"], cs["even"]) == (1, 0)
    # a partner at another shape is no pair
    alone = [records[0], records[3], records[4], records[5]]
    cs = distil_lessons(alone, family="softmax").choices["store"]['"cs"']
    assert cs["pairs"] == 0


def test_the_planner_avoids_a_value_only_where_no_pair_showed_it_level():
    from factory.agents.context import build_context
    from factory.agents.offline import OfflinePlanner
    from factory.spec import load_catalogue

    w = load_catalogue()["layernorm"]
    dims = dict(w.shapes[0])

    def lay(t, store, us):
        r = rec("j", {"threads_per_row": t, "store_hint": store}, us, dims=dims, family="norm")
        return r | {"signature": signature_of(w), "workload_sha256": w.sha256}

    slow = [
        lay(128, "none", 100.0),
        lay(32, "cs", 210.0),
        lay(64, "cs", 400.0),
        lay(256, "cs", 201.0),
    ]

    def avoided(records):
        ctx = build_context(
            w, generation=1, population=8, evidence=records, seed=0, settings={"job": "j"}
        )
        return OfflinePlanner().plan(ctx).avoid.get("store_hint", [])

    assert avoided(slow) == ["cs"]
    assert avoided([*slow, lay(256, "none", 200.0)]) == []


def test_the_fitted_tail_does_not_change_which_layout_a_record_names():
    from factory.evidence import schedule_key
    from factory.families.row.schedules import Schedule

    s = Schedule(threads_per_row=128, chunks=5)
    with_tail = {**s.to_dict(), "tail": "vectors"}
    assert schedule_key(with_tail) == schedule_key(s.to_dict())
    assert schedule_key({**with_tail, "chunks": 4}) != schedule_key(s.to_dict())


def test_a_shifted_row_in_registers_is_another_layout_than_its_strided_twin():
    """In registers "strided" is what fit_tail picks and "shifted" the twin the search may pick
    instead: two layouts. A streamed row takes "shifted" by fit_tail: the same layout."""
    from factory.evidence import schedule_key, untailed
    from factory.families.row.schedules import Schedule

    cached = Schedule(threads_per_row=128, chunks=5, mode="cached").to_dict()
    strided, shifted = {**cached, "tail": "strided"}, {**cached, "tail": "shifted"}
    assert schedule_key(strided) == schedule_key(cached) != schedule_key(shifted)
    assert schedule_key(untailed(shifted)) == schedule_key(strided)
    streamed = Schedule(threads_per_row=128, chunks=4, mode="stream").to_dict()
    assert schedule_key({**streamed, "tail": "shifted"}) == schedule_key(streamed)


def test_a_past_shifted_winner_names_its_layout_at_a_shape_without_twins():
    """A job at 4999 columns recorded a shifted winner; a job at 5000 columns (rows aligned, no
    shifted twin in its space) finds that layout as fitted there, and a job at 4999 finds the
    shifted twin itself, not the strided one."""
    import dataclasses

    from factory.agents.context import build_context, schedule_dict
    from factory.families.row.ir import lower
    from factory.families.row.schedules import default_schedule, fit_tail, shifted_twin
    from factory.spec import load_catalogue

    w = load_catalogue()["rmsnorm"]
    odd, even = {"M": 64, "N": 4999}, {"M": 64, "N": 5000}
    ir = lower(w)
    base = dataclasses.replace(default_schedule(ir, odd), threads_per_row=128, chunks=5)
    strided = fit_tail(ir, base, [odd])
    shifted = shifted_twin(ir, strided, [odd])
    assert (strided.tail, shifted.tail) == ("strided", "shifted")
    kw = {"generation": 0, "population": 4, "evidence": [], "seed": 0, "settings": {}}
    at_odd = build_context(dataclasses.replace(w, shapes=(odd,)), **kw)
    assert at_odd.item_for(schedule_dict(shifted)).value == shifted
    assert at_odd.item_for(schedule_dict(strided)).value == strided
    at_even = build_context(dataclasses.replace(w, shapes=(even,)), **kw)
    found = at_even.item_for(schedule_dict(shifted))
    assert found is not None and found.value == fit_tail(ir, shifted, [even])
