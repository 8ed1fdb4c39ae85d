"""The model backend's kernel handles, diff edits, cut answers, token accounting, target card and
settings, against recorded answers through the SDK's real HTTP stack (an httpx2.MockTransport
replaces only the network). The recorded edits quote lines of the row family's default kernel
for masked_softmax (tests/fixtures/anthropic/make_edit_fixtures.py writes them)."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from factory import families
from factory.agents import kernel_edits as ke
from factory.agents.context import build_context, default_item
from factory.agents.usage import job_usage, split_usage
from factory.costmodel import CostModel
from factory.evidence import JsonlEvidenceStore, warm_start_schedules
from factory.loop import propose_with_report, run_job
from tests.factory.test_anthropic import FIXTURES, Replay, settings_for, tool_results
from tests.factory.test_loop_fakes import fake_generator, make_workload

SHAPE = {"M": 16384, "N": 4096}


@functools.cache
def big_workload():
    from factory.spec.catalogue import load_catalogue

    w = load_catalogue()["masked_softmax"]
    return dataclasses.replace(w, shapes=(dict(SHAPE),))


@functools.cache
def one_layout_row():
    """The row family with its space cut to the job's default layout and no seed screening, so
    a context builds in a second; the kernels are the row family's own."""
    row = families.get("row")

    def default(ir, dims_list):
        return row.default_schedule(ir, dims_list[0])

    return dataclasses.replace(
        row, space=lambda ir, dims_list: [default(ir, dims_list)], seeds=None, space_fits=True
    )


@functools.cache
def parent_kernel():
    ctx = build_context(
        big_workload(),
        generation=0,
        population=1,
        evidence=[],
        seed=0,
        settings={"generator": one_layout_row()},
    )
    return ctx.draft(default_item(ctx), role="writer", note="")


def fixture_meta(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class PassingBench:
    """bench_fn: every candidate passes, each generation 10% faster than the one before."""

    def __init__(self):
        self.batches = []

    def __call__(self, batch):
        self.batches.append(batch)
        us = 100.0 * 0.9 ** (len(self.batches) - 1)
        return {
            "candidates": [
                {
                    "id": c["id"],
                    "status": "passed",
                    "timing": [{"dims": d, "median_us": us} for d in batch["shapes"]],
                }
                for c in batch["candidates"]
            ]
        }


# --- edits and pages, without the model --------------------------------------------------------


def test_find_replace_must_match_once_and_says_where_it_does_not():
    text = "a;\n    add.s32 %r1, %r1, 1;\nb;\n    add.s32 %r1, %r1, 1;\n"
    with pytest.raises(ke.EditError, match=r"occurs 2 times \(lines \[2, 4\]\)"):
        ke.apply_edits(text, [{"find": "add.s32 %r1, %r1, 1;", "replace": "x"}])
    with pytest.raises(ke.EditError, match="does not occur"):
        ke.apply_edits(text, [{"find": "mul.lo.s32", "replace": "x"}])
    done = ke.apply_edits(text, [{"find": "b;\n    add.s32 %r1, %r1, 1;", "replace": "b;\n"}])
    assert done.text == "a;\n    add.s32 %r1, %r1, 1;\nb;\n\n" and not done.notes


def test_a_find_written_with_a_tab_for_spaces_applies_and_says_so():
    text = "{\n    ld.global.f32 %f1, [%rd1];\n    st.global.f32 [%rd2], %f1;\n}\n"
    done = ke.apply_edits(
        text,
        [{"find": "\tld.global.f32  %f1, [%rd1];", "replace": "\tld.global.nc.f32 %f1, [%rd1];"}],
    )
    assert "\tld.global.nc.f32 %f1, [%rd1];" in done.text
    assert done.notes == ("edit 1: matched line 2 ignoring spaces and tabs",)


def test_diff_hunks_apply_at_their_line_or_their_only_match_and_fail_clearly():
    text = "\n".join(f"line {i}" for i in range(1, 21))
    d = (
        "@@ -5,3 +5,4 @@\n line 5\n-line 6\n+LINE 6\n+line 6b\n line 7\n"
        "@@ -15,2 +16,2 @@\n line 15\n-line 16\n+LINE 16"
    )
    done = ke.apply_edits(text, d)  # a bare diff string is one edit
    out = done.text.split("\n")
    assert out[4:8] == ["line 5", "LINE 6", "line 6b", "line 7"] and out[16] == "LINE 16"
    moved = ke.apply_edits(text, [{"diff": "@@ -2,2 +2,2 @@\n line 9\n-line 10\n+ten"}])
    assert "ten" in moved.text and moved.notes == ("edit 1, hunk 1: applied at line 9, not 2",)
    with pytest.raises(ke.EditError) as e:
        ke.apply_edits(text, [{"diff": "@@ -3,2 +3,2 @@\n line 3\n-line 99\n+x"}])
    msg = str(e.value)
    assert "hunk 1 (@@ -3,2 +3,2 @@) does not apply" in msg
    assert 'expected at line 3: "line 3"' in msg and "nowhere" in msg


def test_pages_cover_a_long_kernel_exactly_and_name_the_next_page():
    ptx = parent_kernel().ptx
    assert len(ptx) > 100_000
    got, start, pages = [], 1, 0
    while True:
        text = ke.page(ptx, start, 1500)
        head, _, body = text.partition("\n")
        pages += 1
        got.append(body)
        if "end of kernel" in head:
            break
        nxt = int(head.split("start_line=")[1].rstrip("]"))
        assert nxt > start
        start = nxt
    assert "\n".join(got) == ptx  # nothing cut, nothing twice
    assert pages >= 3
    first = ke.page(ptx, 1, 1500).split("\n", 1)[0]
    assert "shortened from 1500 lines to stay under 40000 characters" in first
    assert ke.page(ptx, 10**6).startswith("(the kernel has")


def test_the_whole_kernel_limit_covers_the_kernels_the_factory_emits():
    # the largest generation-0 kernel measured on the catalogue was 172,310 characters
    assert ke.MAX_KERNEL_CHARS >= 1.5 * 172_310 - 1
    assert len(parent_kernel().ptx) < ke.MAX_KERNEL_CHARS


# --- recorded answers ----------------------------------------------------------------------------


def test_the_model_edits_a_generator_kernel_longer_than_60000_characters_by_handle(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_MAX_TOKENS", raising=False)
    meta = fixture_meta("edit_generator_kernel")
    lines = meta["lines"]
    parent = parent_kernel()
    assert len(parent.ptx) > 60_000
    assert parent.ptx[:60_000].count("\n") + 1 < lines["store"]  # the edit lands past the old cut
    replay = Replay("edit_generator_kernel")
    store = JsonlEvidenceStore()
    history = run_job(
        big_workload(),
        PassingBench(),
        generations=2,
        population=1,
        backend="anthropic",
        evidence_store=store,
        job="edits",
        settings=settings_for(replay, generator=one_layout_row()),
    )
    assert not replay.responses  # every recorded answer was asked for
    bodies = replay.bodies()
    # the writer was told its answer budget and how long the kernels are
    system = bodies[1]["system"]
    assert "Your answers hold at most 16384 output tokens (about 49152 characters" in system
    assert f"the kernels here run to {len(parent.ptx)} characters" in system
    assert "- default: ct128r1v8c4_elno" in bodies[1]["messages"][0]["content"]
    # list_kernels named the default kernel with its size; read_kernel paged with a header
    listing = json.loads(tool_results(bodies[2])[0]["content"])
    assert listing[0]["handle"] == "default" and listing[0]["chars"] == len(parent.ptx)
    page = tool_results(bodies[3])[0]["content"]
    start = lines["store"] - 10
    assert page.startswith(f"[lines {start}-{start + 29} of {lines['total']} (")
    assert "next page: start_line=" in page
    hits = tool_results(bodies[4])[0]["content"]
    assert hits.split("\n")[0].endswith('hold "st.global.b16"')
    # the hunk that did not apply came back as an error, with the kernel's own line
    bad = tool_results(bodies[5])[0]
    assert bad["is_error"] and "does not apply" in bad["content"]
    assert "the kernel has there" in bad["content"]
    # generation 0: the model's kernel is the default kernel with the three edits applied
    g0 = [r for r in store.query(job="edits") if r["generation"] == 0]
    assert len(g0) == 1 and g0[0]["status"] == "passed" and g0[0]["backend"] == "anthropic"
    r0 = g0[0]
    out = r0["ptx"].split("\n")
    assert out[lines["store"] - 1].strip().startswith("st.global.cs.v4.b32")
    assert (
        out[lines["last"] - 1].strip().startswith("@%p")
        and "st.global.cs.b16" in out[lines["last"] - 1]
    )
    assert "evict_last.b64 %rd4, 0.5;" in r0["ptx"]
    assert len([a for a, b in zip(out, parent.ptx.split("\n"), strict=True) if a != b]) == 3
    # lineage, and the parent's schedule plus the edit's digest (what the cost model reads)
    assert r0["parent_ptx_sha256"] == parent.ptx_sha256
    lin = r0["lineage"]
    assert lin["parent_handle"] == "default" and lin["tool"] == "submit_edit"
    assert lin["model"] == "claude-sonnet-4-6" and r0["model"] == "claude-sonnet-4-6"
    assert r0["schedule"] == {**parent.schedule, "model_edit": lin["edit_digest"]}
    assert r0["entry"] == parent.entry and r0["launch"]["block"] == list(parent.launch.block)
    # generation 1: the planner saw the best by handle, not a cut text; the tuner edited it
    best = json.loads(tool_results(bodies[7])[0]["content"])[0]
    assert best["handle"] == "best1" and "read it with read_kernel('best1'" in best["ptx"]
    assert tool_results(bodies[9])[0]["content"].rstrip().endswith("}")  # read to the end
    assert "end of kernel]" in tool_results(bodies[9])[0]["content"].split("\n")[0]
    g1 = [r for r in store.query(job="edits") if r["generation"] == 1]
    assert len(g1) == 1
    r1 = g1[0]
    assert r1["parent_ptx_sha256"] == r0["ptx_sha256"]
    assert r1["lineage"]["parent_handle"] == "best1" and r1["role"] == "tuner"
    assert r1["schedule"]["model_edit"] != r0["schedule"]["model_edit"]
    assert {k: v for k, v in r1["schedule"].items() if k != "model_edit"} == parent.schedule
    assert "st.global.cs.b16" in r1["ptx"].split("\n")[lines["prev"] - 1]
    assert history.best_ptx_sha256 == r1["ptx_sha256"]
    # warm starts and the cost model can use them
    records = store.query(job="edits")
    assert (
        warm_start_schedules(
            records, family=r0["family"], dtype=r0["dtype"], gpu="sm_90", dims=SHAPE
        )[0]
        == r1["schedule"]
    )
    model = CostModel(dim_order=["M", "N"], family="row")
    model._vocab(records)
    assert [v for k, v in model.onehot if k == "model_edit"] == sorted(
        f"str:{r['schedule']['model_edit']}" for r in (r0, r1)
    )
    assert len(model._features(r1["schedule"], SHAPE)) == len(
        model._features(parent.schedule, SHAPE)
    )
    # a later job of the same operator reads the model's fastest kernel back as past1
    from factory.agents.handles import Kernels

    later = build_context(
        big_workload(),
        generation=0,
        population=1,
        evidence=store.all(),
        seed=0,
        settings={"generator": one_layout_row(), "job": "later"},
    )
    past = Kernels(later).get("past1")
    assert past.sha == r1["ptx_sha256"] and past.ptx == r1["ptx"] and past.entry == parent.entry
    # tokens: each candidate carries its generation's whole spend (one candidate each)
    for g, r in zip(history.generations, (r0, r1), strict=True):
        assert r["usage"]["tokens_in"] == g.usage["tokens_in"] > 0
        assert g.population[0]["usage"] == r["usage"]
    assert job_usage(records)["tokens_in"] == history.usage["tokens_in"]


def test_an_answer_cut_at_max_tokens_is_reported_and_the_offline_backend_fills_in():
    replay = Replay("cut_answer")
    drafts, report = propose_with_report(
        make_workload(),
        generation=0,
        population=2,
        evidence=[],
        backend="anthropic",
        settings=settings_for(replay, generator=fake_generator(), max_tokens=8192),
    )
    bodies = replay.bodies()
    assert len(bodies) == 5  # the last two: a nudge to submit, and the model giving up
    # the cut call was not run: the model was told so, with the limit and what to do instead
    cut = tool_results(bodies[2])[0]
    assert cut["is_error"] and "cut at the output limit (8192 tokens" in cut["content"]
    assert "submit_edit" in cut["content"]
    # the answer cut in text got the same words as a user turn
    assert "cut at the output limit" in bodies[3]["messages"][-1]["content"]
    notes = "\n".join(report.notes)
    assert (
        "writer: answer cut at max_tokens=8192 (8192 tokens out) in a submit_candidate call"
        in notes
    )
    assert "2 answers cut at max_tokens" in notes
    assert "the model's tokens produced no accepted candidate" in notes
    assert "2 candidates filled in by the offline backend" in notes
    assert len(drafts) == 2 and all(d.backend == "offline" for d in drafts)
    assert report.usage["answers_cut"] == 2 and report.usage["requests"] == 5
    assert report.usage["tokens_out"] == 400 + 8192 + 8192 + 20 + 20
    assert report.usage["cost_usd"] > 0 and all(d.usage["tokens_in"] == 0 for d in drafts)
    # the job's spend keeps what no candidate carries
    u = job_usage(drafts, generations=[report.usage])
    assert u["tokens_out"] == report.usage["tokens_out"] and u["candidates"] == 0
    assert u["answers_cut"] == 2 and u["requests"] == 5
    assert u["unattributed"]["tokens_out"] == report.usage["tokens_out"]


def test_tokens_and_cost_are_split_exactly_and_summed_per_generation_and_job():
    from tests.factory.test_anthropic import ScriptedModel
    from tests.factory.test_loop_fakes import FakeBench

    shares = split_usage({"tokens_in": 1001, "tokens_out": 7, "cost_usd": 0.010001}, 3)
    assert sum(s["tokens_in"] for s in shares) == 1001 and sum(s["tokens_out"] for s in shares) == 7
    assert sum(s["cost_usd"] for s in shares) == pytest.approx(0.010001, abs=1e-12)
    store = JsonlEvidenceStore()
    history = run_job(
        make_workload(),
        FakeBench(customer_us=100.0),
        generations=3,
        population=2,
        backend="anthropic",
        evidence_store=store,
        job="tokens",
        settings=settings_for(ScriptedModel()),
    )
    records = store.query(job="tokens")
    u = job_usage(records, generations=history.generations)
    for k in ("tokens_in", "tokens_out"):
        assert u[k] == history.usage[k] == sum(g.usage[k] for g in history.generations)
    assert u["cost_usd"] == pytest.approx(history.usage["cost_usd"])
    for g in history.generations:
        per = u["by_generation"][g.generation]
        assert per["spent"]["tokens_in"] == g.usage["tokens_in"]
        # the candidates of a generation carry its whole spend between them
        assert sum(p["usage"]["tokens_in"] for p in g.population) == g.usage["tokens_in"]
        assert per["tokens_in"] == g.usage["tokens_in"]
    assert u["unattributed"]["tokens_in"] == 0
    assert (
        u["by_model"]["claude-sonnet-4-6"]["candidates"]
        == u["candidates"]
        == len({(r["generation"], r["ptx_sha256"]) for r in records})
    )
    # the same totals from the drafts of a generation
    drafts, report = propose_with_report(
        make_workload(),
        generation=0,
        population=2,
        evidence=[],
        backend="anthropic",
        settings=settings_for(ScriptedModel()),
    )
    assert job_usage(drafts)["tokens_in"] == report.usage["tokens_in"]


def _first_body(monkeypatch, workload=None, env=None, **extra):
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    replay = Replay("server_error")
    s = settings_for(replay, **{"generator": fake_generator(), "max_retries": 0, **extra})
    propose_with_report(
        workload or make_workload(),
        generation=0,
        population=1,
        evidence=[],
        backend="anthropic",
        settings=s,
    )
    return replay.bodies()[0]


def test_the_target_card_comes_from_the_device_record_and_the_family(monkeypatch):
    body = _first_body(monkeypatch)
    assert "Target: sm_90, NVIDIA H200 / H100 SXM (Hopper): 132 SMs" in body["system"]
    assert "4.30 TB/s" in body["system"] and "memory-bound" in body["system"]
    b200 = dataclasses.replace(make_workload(), target="sm_100")
    body = _first_body(monkeypatch, workload=b200)
    assert "Target: sm_100, NVIDIA B200 (Blackwell): 148 SMs" in body["system"]
    assert "7.00 TB/s" in body["system"] and "H200" not in body["system"]
    assert "`.target sm_100`" in body["system"]
    tc = dataclasses.replace(fake_generator(), name="matmul")
    body = _first_body(monkeypatch, generator=tc)
    assert "tensor-core work" in body["system"] and "wgmma" in body["system"]
    assert "This operator is memory-bound" not in body["system"]


def test_the_model_and_max_tokens_settings_reach_the_request(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_MAX_TOKENS", raising=False)
    body = _first_body(monkeypatch)
    assert body["model"] == "claude-sonnet-4-6" and body["max_tokens"] == 16_384
    # the environment, when the settings name neither
    env = {"ANTHROPIC_MODEL": "claude-opus-4-5", "ANTHROPIC_MAX_TOKENS": "4096"}
    body = _first_body(monkeypatch, env=env, model=None)
    assert body["model"] == "claude-opus-4-5" and body["max_tokens"] == 4096
    # the settings over the environment; a limit past the SDK's non-streaming bound still goes
    body = _first_body(monkeypatch, env=env, model="claude-haiku-4-5", max_tokens=32_000)
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 32_000


# --- the tools one by one -------------------------------------------------------------------------


def _session(**extra):
    from factory.agents.anthropic_backend import Session

    settings = {"api_key": "test-key", "generator": fake_generator(), **extra}
    ctx = build_context(
        make_workload(), generation=0, population=2, evidence=[], seed=0, settings=settings
    )
    return Session(ctx)


def test_the_tools_refuse_clearly_and_never_cut_silently():
    s = _session(compile_fn=lambda ptx, arch: {"ok": True, "log": "x" * 5000})
    run = functools.partial(s._run_tool, "writer")
    text, err = run("submit_candidate", {"ptx": "x" * 260_001, "entry": "k", "note": "n"}, [])
    assert err and "260001 characters; the limit is 260000" in text and "submit_edit" in text
    text, err = run("read_kernel", {"handle": "best9"}, [])
    assert err and "no kernel with handle 'best9'; the handles are: default" in text
    text, err = run("submit_edit", {"handle": "default", "edits": [], "note": "n"}, [])
    assert err and "edits must be a non-empty list" in text
    same = {"find": ".address_size 64", "replace": ".address_size 64"}
    text, err = run("submit_edit", {"handle": "default", "edits": [same], "note": "n"}, [])
    assert err and "the edits leave default unchanged" in text
    # a compile of an edit by handle: the log's cut is said
    edit = {"find": " ret;", "replace": " exit;"}
    text, err = run("compile_ptx", {"handle": "default", "edits": [edit]}, [])
    assert not err and "more characters of the log left out" in json.loads(text)["log"]
    text, err = run("read_evidence", {"limit": 5}, [])
    assert "the last 0 of 0 records" in json.loads(text)["this_job_shown"]
    # an edit of a generator kernel: the parent's schedule, its binding and lineage
    accepted = []
    text, err = run("submit_edit", {"handle": "default", "edits": [edit], "note": "exit"}, accepted)
    assert not err and text.startswith("accepted as candidate 1")
    (d,) = accepted
    parent = s.kernels.get("default")
    assert d.parent_ptx_sha256 == parent.sha and d.params == parent.params
    assert d.schedule == {**parent.schedule, "model_edit": d.lineage["edit_digest"]}
    assert d.evidence_fields()["ptx"] == d.ptx and d.evidence_fields()["lineage"]["tool"] == (
        "submit_edit"
    )


def test_a_tensor_map_parameter_survives_the_batch_and_evidence_round_trip():
    from factory.agents.types import CandidateDraft, params_from_list
    from factory.spec.types import KernelParam, Launch

    p = KernelParam("tmap", "b8x128", "A", 0.0, box=(64, 128), dims=("K", "M"), swizzle=128)
    d = CandidateDraft(
        ptx=".entry k",
        entry="k",
        params=(p, KernelParam("dim", "u32", "M")),
        launch=Launch((1, 1, 1), (128, 1, 1)),
        schedule=None,
        parent_ptx_sha256=None,
        role="writer",
        backend="anthropic",
        note="",
    )
    batch = d.to_batch_candidate("c1")["params"]
    assert batch[0]["box"] == [64, 128] and batch[0]["swizzle"] == 128
    assert "box" not in batch[1]
    assert params_from_list(batch) == d.params
    assert params_from_list(d.evidence_fields()["params"]) == d.params
