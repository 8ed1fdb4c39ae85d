"""The offline tuner reshapes a layout (two fields at once) where one-field steps cannot reach:
a warp-per-row streaming kernel with several rows per block can become a multi-warp row."""

import dataclasses

from factory.agents.context import build_context
from factory.agents.offline import OfflineTuner
from factory.agents.types import Plan
from factory.families.row.ir import lower
from factory.families.row.moves import reshapes as _reshapes
from factory.families.row.schedules import Schedule, is_valid
from factory.spec import load_catalogue

# One warp per row, eight rows per block: where the H200 loop's cross-entropy search got stuck.
WARP_ROWS = Schedule(
    threads_per_row=32,
    rows_per_block=8,
    chunks=4,
    mode="stream",
    online=True,
    fast_math=False,
    min_threads_per_sm=768,
)


def passed_record(job: str, dims: dict, **extra) -> dict:
    return {
        "job": job,
        "status": "passed",
        "median_us": 40.5,
        "dims": dims,
        "schedule": WARP_ROWS.to_dict(),
        "ptx_sha256": "p1",
        "generation": 0,
        "family": "softmax",
        **extra,
    }


def test_reshapes_keep_the_block_or_the_row_work_the_same_size():
    s = WARP_ROWS
    for change, _why in _reshapes(s):
        c = dataclasses.replace(s, **change)
        assert c.threads_per_row != s.threads_per_row
        same_block = c.threads_per_row * c.rows_per_block == s.threads_per_row * s.rows_per_block
        same_work = c.threads_per_row * c.chunks == s.threads_per_row * s.chunks
        assert same_block or same_work or c.rows_per_block == 1


def test_the_tuner_leaves_one_warp_per_row_for_a_streaming_cross_entropy():
    w = load_catalogue()["cross_entropy"]
    w = dataclasses.replace(w, shapes=({"M": 2048, "V": 32000},))
    ir = lower(w)
    assert is_valid(ir, WARP_ROWS, {"M": 2048, "V": 32000})[0]
    record = passed_record("j", {"M": 2048, "V": 32000})
    ctx = build_context(
        w, generation=1, population=8, evidence=[record], seed=0, settings={"job": "j"}
    )
    plan = Plan("exploit", 0, 8, {}, {}, [], "")
    drafts = OfflineTuner().tune(ctx, plan, 24, set())
    assert drafts, "the tuner proposed nothing"
    wider = [d for d in drafts if d.schedule["threads_per_row"] > 32]
    assert wider, [d.note for d in drafts]
    assert any("reshape" in d.note for d in wider)


def test_a_warm_start_also_reshapes_the_past_winners_for_the_new_shape():
    from factory.agents.offline import OfflineWriter

    w = load_catalogue()["cross_entropy"]
    w = dataclasses.replace(w, shapes=({"M": 1024, "V": 32000},))
    past = passed_record("earlier", {"M": 2048, "V": 32000}, dtype="bf16", gpu="sm_90")
    ctx = build_context(
        w, generation=0, population=8, evidence=[past], seed=0, settings={"job": "new"}
    )
    plan = Plan("warm_start", 8, 0, {}, {}, [], "")
    drafts = OfflineWriter().write(ctx, plan, 8, set())
    notes = [d.note for d in drafts]
    assert any(n.startswith("warm start: a winner") for n in notes), notes
    reshaped = [d for d in drafts if "reshaped" in d.note]
    assert reshaped and all(d.schedule["threads_per_row"] != 32 for d in reshaped), notes


def test_a_warm_start_with_a_fitted_model_also_takes_its_picks_at_the_new_shape():
    from factory.agents.offline import OfflineWriter

    w = load_catalogue()["cross_entropy"]
    w = dataclasses.replace(w, shapes=({"M": 1024, "V": 32000},))
    # eight past results at the other shape, enough for the model to fit
    past = [
        passed_record(
            "earlier",
            {"M": 2048, "V": 32000},
            dtype="bf16",
            gpu="sm_90",
            schedule=dataclasses.replace(WARP_ROWS, threads_per_row=t, rows_per_block=r).to_dict(),
            ptx_sha256=f"p{t}-{r}",
            median_us=30.0 + abs(t - 128) / 8 + r,
        )
        for t in (32, 64, 128, 256)
        for r in (1, 2)
    ]
    ctx = build_context(w, generation=0, population=8, evidence=past, seed=0, settings={"job": "n"})
    assert ctx.model is not None and ctx.model.fitted
    drafts = OfflineWriter().write(ctx, Plan("warm_start", 8, 0, {}, {}, [], ""), 8, set())
    notes = [d.note for d in drafts]
    assert notes[0].startswith("warm start: a winner"), notes
    assert any(n.startswith("warm start: the cost model's pick") for n in notes), notes


def test_a_reshape_past_1024_threads_takes_a_cluster_and_one_back_leaves_it():
    s = Schedule(threads_per_row=1024, rows_per_block=1, chunks=4, mode="cached")
    grown = [dataclasses.replace(s, **c) for c, _ in _reshapes(s) if c["threads_per_row"] > 1024]
    assert grown and all(g.cluster_blocks == g.threads_per_row // 1024 for g in grown)
    c = Schedule(threads_per_row=2048, rows_per_block=1, chunks=2, cluster_blocks=2)
    shrunk = [
        dataclasses.replace(c, **ch) for ch, _ in _reshapes(c) if ch["threads_per_row"] < 2048
    ]
    assert shrunk and all(x.cluster_blocks == 1 for x in shrunk)
