import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from factory.evidence import JsonlEvidenceStore, schedule_key
from factory.loop import CandidateDraft, propose, run_job, should_stop
from tests.factory.test_loop_fakes import (
    FakeBench,
    fake_compile,
    fake_generator,
    make_workload,
    sweep_best_us,
)


def _settings(**extra):
    return {"generator": fake_generator(), **extra}


def _job(workload, store, *, generations=6, population=6, seed=0, job=None, **kw):
    return run_job(
        workload,
        FakeBench(),
        generations=generations,
        population=population,
        backend="offline",
        evidence_store=store,
        seed=seed,
        job=job,
        compile_fn=fake_compile,
        settings=_settings(),
        **kw,
    )


def test_propose_returns_drafts_of_the_contract_shape():
    drafts = propose(make_workload(), generation=0, population=5, evidence=[], settings=_settings())
    assert len(drafts) == 5
    for d in drafts:
        assert isinstance(d, CandidateDraft)
        assert d.role in ("writer", "tuner") and d.backend == "offline"
        assert len(d.ptx_sha256) == 64 and d.note
        assert d.usage == {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
        assert d.schedule is not None and "block" in d.schedule
    # the generator's default schedule is always tried first in a cold job
    assert drafts[0].schedule == {"block": 128, "vec": 1, "unroll": 1, "cache": "none"}
    assert len({d.ptx_sha256 for d in drafts}) == 5


def test_propose_is_deterministic_for_a_seed():
    w = make_workload()
    a = propose(w, generation=0, population=6, evidence=[], seed=3, settings=_settings())
    b = propose(w, generation=0, population=6, evidence=[], seed=3, settings=_settings())
    assert [d.ptx_sha256 for d in a] == [d.ptx_sha256 for d in b]


def test_propose_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        propose(make_workload(), generation=0, population=2, evidence=[], backend="gpt")


def test_offline_propose_returns_nothing_for_an_operator_without_any_space():
    drafts = propose(
        make_workload(),
        generation=0,
        population=4,
        evidence=[],
        settings={"generator": fake_generator(refuse=True)},
    )
    assert drafts == []


def test_a_cold_job_improves_monotonically_and_reaches_the_sweep_best():
    w = make_workload()
    store = JsonlEvidenceStore()
    h = _job(w, store, generations=8, population=6)
    curve = [t for t in h.best_us_by_generation if t is not None]
    assert curve == sorted(curve, reverse=True)  # best-so-far never gets worse
    assert curve[-1] < curve[0]
    assert h.best_us <= sweep_best_us(w.shapes[0]) * 1.05
    # every candidate of the job is kept as evidence, none proposed twice
    recs = store.query(job=h.job)
    keys = [schedule_key(r["schedule"]) for r in recs]
    assert len(keys) == len(set(keys))
    assert h.stop_reason


def test_a_warm_start_reaches_in_generation_zero_what_the_cold_job_needed_generations_for():
    store = JsonlEvidenceStore()
    cold = _job(make_workload(dims={"M": 1024, "N": 4096}), store, generations=8, job="cold")
    cold_gen_reached = next(
        g for g, t in enumerate(cold.best_us_by_generation) if t <= cold.best_us * 1.05
    )
    assert cold_gen_reached >= 1
    similar = make_workload(dims={"M": 2048, "N": 4096}, input_name="logits")
    warm = _job(similar, store, generations=1, job="warm")
    assert warm.generations[0].plan["strategy"] == "warm_start"
    assert warm.best_us <= sweep_best_us(similar.shapes[0]) * 1.05


def test_rejected_candidates_become_evidence_and_never_reach_the_gpu():
    w = make_workload()
    store = JsonlEvidenceStore()
    bench = FakeBench()

    def spilling(ptx, arch):
        rep = fake_compile(ptx, arch)
        if '"block": 1024' in ptx:
            rep["spill_store_bytes"] = 64
        return rep

    h = run_job(
        w,
        bench,
        generations=2,
        population=40,
        evidence_store=store,
        job="j",
        compile_fn=spilling,
        settings=_settings(),
    )
    rejected = [r for r in store.query(job="j") if r["status"] == "rejected"]
    assert rejected and all(r["reason"].startswith("spills") for r in rejected)
    sent = [c["ptx"] for b in bench.batches for c in b["candidates"]]
    assert not any('"block": 1024' in p for p in sent)
    assert h.generations[0].rejected


def test_pruning_benches_only_the_predicted_fastest_and_counts_the_time_saved():
    store = JsonlEvidenceStore()
    _job(make_workload(), store, generations=4, job="teach")  # evidence to fit the model
    bench = FakeBench()
    h = run_job(
        make_workload(dims={"M": 4096, "N": 4096}),
        bench,
        generations=2,
        population=4,
        evidence_store=store,
        job="pruned",
        compile_fn=fake_compile,
        settings=_settings(),
        prune_factor=3,
        gpu_seconds_per_candidate=1.5,
    )
    assert all(len(b["candidates"]) <= 4 for b in bench.batches)
    assert h.gpu_seconds_saved_by_pruning > 0
    assert h.generations[0].prune["pruned"] * 1.5 == h.generations[0].prune["gpu_seconds_saved"]


def test_the_customer_kernel_edits_run_through_the_loop_when_the_generator_refuses():
    from tests.factory.test_agents_ptx import CUSTOMER_PTX, customer_baseline

    w = make_workload(baseline=customer_baseline())
    store = JsonlEvidenceStore()
    bench = FakeBench(customer_us=100.0)
    h = run_job(
        w,
        bench,
        generations=3,
        population=4,
        evidence_store=store,
        job="cust",
        compile_fn=fake_compile,
        baselines=("customer",),
        settings={"generator": fake_generator(refuse=True)},
    )
    assert h.best_us is not None and h.best_us < 100.0
    assert h.best_schedule["ptx_edit"] is True
    assert h.best_draft.parent_ptx_sha256 is not None
    assert CUSTOMER_PTX != h.best_draft.ptx
    assert h.baselines and h.baselines[0]["name"] == "customer"


def test_propose_reads_an_evidence_store_that_knows_the_asking_job():
    store = JsonlEvidenceStore()
    h = _job(make_workload(), store, generations=2, job="abc")

    class Asking:
        code = "abc"

    store.job = Asking()
    drafts = propose(
        make_workload(), generation=2, population=6, evidence=store, settings=_settings()
    )
    tried = {schedule_key(r["schedule"]) for r in store.query(job="abc")}
    assert drafts and not {schedule_key(d.schedule) for d in drafts} & tried
    assert h.generations


def test_should_stop_on_budget_time_and_plateau():
    assert should_stop([5.0], generation=0, max_generations=1, deadline_s_left=None).startswith(
        "budget"
    )
    assert should_stop([5.0], generation=0, max_generations=9, deadline_s_left=0).startswith("time")
    past = datetime.now(UTC) - timedelta(seconds=1)
    assert should_stop([5.0], generation=0, max_generations=9, deadline=past).startswith("time")
    assert should_stop([9, 8, 7, 6], generation=3, max_generations=9, deadline_s_left=9) is None
    flat = [9.0, 5.0, 5.0, 4.99, 4.98]
    assert should_stop(flat, generation=4, max_generations=9, deadline_s_left=None).startswith(
        "plateau"
    )
    assert (
        should_stop(
            [None, None, None, None, None], generation=4, max_generations=9, deadline_s_left=None
        )
        is None
    )
    stuck = should_stop(
        [None, 5.0, None, None, None], generation=4, max_generations=9, deadline_s_left=None
    )
    assert stuck.startswith("plateau")


def test_pruning_keeps_each_kinds_share_so_customer_edits_survive():
    from factory.loop import _prune_by_kind

    def d(kind, us, i):
        sched = {"ptx_edit": True, "i": i} if kind == "edit" else {"block": i}
        return CandidateDraft(
            ptx=f"// {kind} {i}",
            entry="k",
            params=(),
            launch=None,
            schedule=sched,
            parent_ptx_sha256=None,
            role="writer",
            backend="offline",
            note="",
            predicted_us=us,
        )

    items = [(f"g{i}", d("gen", 10.0 + i, i)) for i in range(9)]
    items += [(f"e{i}", d("edit", 500.0 + i, i)) for i in range(3)]
    kept, report = _prune_by_kind(items, 4, True, 2.0)
    ids = [cid for cid, _ in kept]
    assert ids == ["g0", "g1", "g2", "e0"]
    assert report["pruned"] == 8 and report["gpu_seconds_saved"] == 16.0
    kept, report = _prune_by_kind(items, 4, False, 2.0)
    assert report is None and [cid for cid, _ in kept] == ["g0", "g1", "g2", "e0"]


def test_a_real_cold_generation_compiles_and_only_resource_problems_are_rejected():
    from factory.agents import review
    from factory.compile import compile_ptx
    from factory.spec import load_catalogue

    w = load_catalogue()["softmax"]
    w = dataclasses.replace(w, shapes=({"M": 4096, "N": 4096},))
    from factory.agents.context import schedule_dict
    from factory.families.row.ir import lower
    from factory.families.row.schedules import default_schedule
    from factory.families.row.seeds import candidate_schedules

    drafts = propose(w, generation=0, population=6, evidence=[])
    assert len(drafts) == 6
    # Cold, the job starts from the generator's screened layouts (the default first), then
    # explores: three quarters of the slots at most go to the seeds.
    ir, dims = lower(w), dict(w.shapes[0])
    seeds = [schedule_dict(s) for s in candidate_schedules(ir, dims)]
    assert drafts[0].schedule == schedule_dict(default_schedule(ir, dims)) == seeds[0]
    seeded = [d for d in drafts if d.note.startswith("a screened starting layout")]
    assert [d.schedule for d in seeded] == seeds[: len(seeded)] and 3 <= len(seeded) <= 4
    verdicts = []
    for d in drafts:
        report = compile_ptx(d.ptx)
        assert report.ok, report.log
        verdicts.append(review(d, report))
    assert all(v == (True, "") for v in verdicts[: len(seeded)])  # screened: none refused
    # the space holds schedules that spill; the reviewer stops those, and nothing else
    for ok, reason in verdicts:
        assert ok or reason.startswith(("spills", "register pressure", "local memory")), reason


def test_with_the_real_generator_a_similar_jobs_winner_seeds_generation_zero():
    from factory.spec import load_catalogue

    w = load_catalogue()["rmsnorm"]
    past_dims = {"M": 8192, "N": 4096}
    w_past = dataclasses.replace(w, shapes=(past_dims,))
    tried = propose(w_past, generation=0, population=4, evidence=[])
    records = [
        {
            "job": "past",
            "workload_sha256": w.sha256,
            "family": "norm",
            "signature": "",
            "dims": past_dims,
            "dtype": "bf16",
            "gpu": "sm_90",
            "schedule": d.schedule,
            "ptx_sha256": d.ptx_sha256,
            "status": "passed",
            "reason": "",
            "median_us": 100.0 - i,
            "tbps": 1.0,
            "generation": 0,
            "role": "writer",
            "backend": "offline",
        }
        for i, d in enumerate(tried)
    ]
    winner = tried[-1].schedule
    w_new = dataclasses.replace(w, shapes=({"M": 4096, "N": 4096},))
    drafts = propose(w_new, generation=0, population=4, evidence=records, settings={"job": "new"})
    assert drafts[0].schedule == winner and drafts[0].note.startswith("warm start")


def _past_records(drafts, dims, **fields) -> list[dict]:
    """Evidence records of a similar past job (norm, bf16, sm_90) that tried `drafts` at `dims`."""
    base = {"job": "past", "family": "norm", "signature": "", "dims": dict(dims), "dtype": "bf16"}
    return [
        base
        | {"gpu": "sm_90", "schedule": d.schedule, "ptx_sha256": d.ptx_sha256, "generation": 0}
        | {"role": "writer", "backend": "offline", "median_us": None}
        | fields
        for d in drafts
    ]


def test_past_jobs_that_left_no_winner_still_start_from_the_screened_layouts():
    """Records of a similar past job none of whose candidates was verified (refused, or never
    timed) give nothing to warm-start from: the job starts cold, from the generator's seeds."""
    from factory.spec import load_catalogue

    w = load_catalogue()["rmsnorm"]
    w = dataclasses.replace(w, shapes=({"M": 4096, "N": 4096},))
    cold = propose(w, generation=0, population=4, evidence=[])
    records = _past_records(cold, w.shapes[0], status="rejected", reason="spills: 8 bytes")
    again = propose(w, generation=0, population=4, evidence=records, settings={"job": "new"})
    assert again[0].note.startswith("a screened starting layout")
    assert [d.schedule for d in again[:3]] == [d.schedule for d in cold[:3]]


def test_a_draft_records_a_prediction_only_once_the_cost_model_is_fitted():
    from factory.spec import load_catalogue

    w = load_catalogue()["rmsnorm"]
    cold = propose(w, generation=0, population=4, evidence=[])
    assert cold and all(d.predicted_us is None for d in cold)
    tried = propose(w, generation=0, population=8, evidence=[], seed=3)
    records = _past_records(tried, w.shapes[0], status="passed")
    for i, r in enumerate(records):
        r["median_us"] = 100.0 + 7 * i
    warm = propose(w, generation=0, population=4, evidence=records, settings={"job": "new"})
    assert warm and all(d.predicted_us is not None and d.predicted_us > 0 for d in warm)
