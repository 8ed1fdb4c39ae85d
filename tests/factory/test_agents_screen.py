"""The offline agents compile their picks on the CPU before they take a slot of a generation:
a pick the reviewer's compile checks would reject gives way to the next one, and a mutant that
spills under the register cap it inherited is given the cap that compiles clean."""

import dataclasses

from factory.agents.context import build_context
from factory.agents.offline import OfflineTuner, _take_screened
from factory.agents.types import Plan
from factory.compile import compile_ptx, rejection_reason
from factory.ir import lower
from factory.seeds import candidate_schedules, recapped
from factory.spec import load_catalogue

DIMS = {"M": 16384, "N": 4999}


def _layernorm():
    w = load_catalogue()["layernorm"]
    return dataclasses.replace(w, shapes=(DIMS,))


def _passes_compile_checks(d) -> str:
    threads = d.launch.block[0] * d.launch.block[1] * d.launch.block[2]
    return rejection_reason(compile_ptx(d.ptx), threads)


def test_the_tuner_sends_no_mutant_that_spills_under_its_parents_cap():
    # A layout with its registers capped, as LayerNorm 16384x4999's fastest on the H100 once was
    # (128 threads of 5 chunks, shifted, capped for 768 threads): most of its one-field mutants
    # spill under the cap, and before the screen a generation of them reached the reviewer and
    # was rejected whole.
    w = _layernorm()
    capped = [s for s in candidate_schedules(lower(w), DIMS) if s.min_threads_per_sm]
    assert capped, "the seeds at 16384x4999 hold no capped layout"
    record = {
        "job": "j",
        "status": "passed",
        "median_us": 139.4,
        "dims": DIMS,
        "schedule": capped[0].to_dict(),
        "ptx_sha256": "p1",
        "generation": 0,
        "family": "layernorm",
    }
    ctx = build_context(
        w, generation=1, population=8, evidence=[record], seed=1, settings={"job": "j"}
    )
    plan = Plan("exploit", 0, 8, {}, {}, [], "")
    drafts = OfflineTuner().tune(ctx, plan, 8, set())
    assert len(drafts) == 8, [d.note for d in drafts]
    reasons = {d.entry: _passes_compile_checks(d) for d in drafts}
    assert not any(reasons.values()), reasons
    recapped = [d for d in drafts if "since its cap gave register spills" in d.note]
    assert recapped, [d.note for d in drafts]
    for d in recapped:
        assert d.schedule.get("min_threads_per_sm", 0) != 768
        assert d.parent_ptx_sha256 == "p1"
    assert ctx.screen_counts["recapped"] == len(recapped)


def test_a_pick_that_spills_gives_its_slot_to_the_next():
    w = _layernorm()
    ir = lower(w)
    ctx = build_context(w, generation=1, population=8, evidence=[], seed=0, settings={"job": "j"})
    by_key = {it.key: it for it in ctx.gen_items}
    base = next(
        s for s in candidate_schedules(ir, DIMS) if s.tail == "shifted" and s.col_groups == 1
    )
    spills = dataclasses.replace(base, chunks=8, min_threads_per_sm=768)
    clean = [dataclasses.replace(base, load_hint=h) for h in ("nc", "nc_noalloc")]
    items = [ctx.item_for(s.to_dict()) for s in (spills, *clean)]
    assert all(items) and len({it.key for it in items}) == 3
    assert "register spills" in _passes_compile_checks(ctx.draft(items[0], role="tuner", note=""))
    fix = recapped(ir, spills)
    assert fix is not None and fix.min_threads_per_sm != 768
    fix_key = ctx.item_for(fix.to_dict()).key
    assert fix_key in by_key

    def make(p):
        return ctx.draft(p[0], role="writer", note=p[1])

    picks = [(it, f"pick {i}") for i, it in enumerate(items)]
    # its recapped layout untried: it takes the slot, under the cap that compiles clean
    got = _take_screened(ctx, picks, 2, set(), set(), make)
    assert [p[0].key for p, _ in got] == [fix_key, items[1].key]
    assert "since its cap gave register spills" in got[0][1].note
    # tried already: the pick is passed over and the next two fill the slots
    got = _take_screened(ctx, picks, 2, {fix_key}, set(), make)
    assert [p[0].key for p, _ in got] == [items[1].key, items[2].key]
    assert ctx.screen_counts == {"skipped": 1, "recapped": 1}
    for _, d in got:
        assert not _passes_compile_checks(d)
    # kept aside: propose_offline gives it a slot only where no clean pick filled one, for the
    # reviewer to reject with its reason (recorded, so not proposed again)
    assert [d.ptx_sha256 for d in ctx.passed_over] == [
        ctx.draft(items[0], role="writer", note="").ptx_sha256
    ]


def test_a_generation_short_of_clean_picks_still_goes_out_whole(monkeypatch):
    # Every pick but one spills and cannot be recapped: the clean one first, then the ones
    # passed over, so the reviewer records why (an empty generation would say nothing).
    from factory.agents import offline

    w = _layernorm()
    ctx = build_context(w, generation=1, population=3, evidence=[], seed=0, settings={"job": "j"})
    items = ctx.gen_items[:3]
    clean, spills_1, spills_2 = (ctx.draft(it, role="writer", note="") for it in items)
    # (the writer turned away the first again after the tuner did: one slot for it)
    ctx.passed_over = [spills_1, spills_1, spills_2]
    plan = Plan("explore", 1, 0, {}, {}, [], "")
    monkeypatch.setattr(offline.OfflinePlanner, "plan", lambda self, ctx: plan)
    monkeypatch.setattr(offline.OfflineTuner, "tune", lambda self, ctx, plan, n, taken: [])
    monkeypatch.setattr(offline.OfflineWriter, "write", lambda self, ctx, p, n, t: [clean])
    drafts, _ = offline.propose_offline(ctx)
    assert drafts == [clean, spills_1, spills_2]
