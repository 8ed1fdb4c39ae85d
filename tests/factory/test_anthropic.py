"""The Anthropic backend against recorded (hand-written) API responses, through the SDK's real
HTTP stack: an httpx2.MockTransport replaces only the network."""

import json
from pathlib import Path

import httpx2
import pytest

from factory.compile import compile_ptx
from factory.evidence import JsonlEvidenceStore
from factory.loop import propose_with_report, run_job
from tests.factory.test_loop_fakes import FakeBench, fake_generator, make_workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "anthropic"
KERNELS = json.loads((FIXTURES / "kernels.json").read_text())


class Replay:
    """Serves a fixture's responses in order and keeps every request."""

    def __init__(self, name: str):
        self.responses = list(json.loads((FIXTURES / f"{name}.json").read_text())["responses"])
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if not self.responses:
            raise AssertionError("the backend asked for more responses than were recorded")
        r = self.responses.pop(0)
        return httpx2.Response(r["status"], headers=r["headers"], json=r["body"])

    def bodies(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests]


def settings_for(handler, **extra):
    client = httpx2.Client(transport=httpx2.MockTransport(handler))
    return {
        "http_client": client,
        "api_key": "test-key",
        "model": "claude-sonnet-4-6",
        "generator": fake_generator(refuse=True),
        **extra,
    }


def propose_anthropic_for(handler, workload=None, **extra):
    return propose_with_report(
        workload or make_workload(),
        generation=0,
        population=2,
        evidence=[],
        backend="anthropic",
        settings=settings_for(handler, **extra),
    )


def tool_results(body: dict) -> list[dict]:
    last = body["messages"][-1]
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def test_the_tool_use_loop_feeds_compiler_errors_back_and_collects_candidates():
    replay = Replay("tool_use_loop")
    drafts, report = propose_anthropic_for(replay)
    assert len(replay.requests) == 5
    bodies = replay.bodies()
    assert "[role: planner]" in bodies[0]["system"] and "[role: writer]" in bodies[2]["system"]
    assert {t["name"] for t in bodies[2]["tools"]} == {
        "list_kernels",
        "read_kernel",
        "search_kernel",
        "compile_ptx",
        "read_evidence",
        "read_best_candidates",
        "submit_edit",
        "submit_candidate",
    }
    # read_evidence answered the planner
    assert "lessons" in tool_results(bodies[1])[0]["content"]
    # the broken kernel's compile report, with ptxas's own words, went back to the model
    compiled = json.loads(tool_results(bodies[3])[0]["content"])
    assert compiled["ok"] is False and "Unknown field '.s32'" in compiled["log"]
    assert [d.ptx for d in drafts] == [KERNELS["good_a"], KERNELS["good_b"]]
    for d in drafts:
        assert d.backend == "anthropic" and d.role == "writer" and d.schedule is None
        assert d.entry == "row_copy" and d.launch.block == (256, 1, 1)
        assert d.note.startswith(("v4 loads", "as before"))
        assert compile_ptx(d.ptx).ok
    # 5 responses x 1200 tokens in; 300 out each, 900 for each of the two submissions
    assert report.usage["tokens_in"] == 6000 and report.usage["tokens_out"] == 2700
    assert report.usage["cost_usd"] == pytest.approx((6000 * 3 + 2700 * 15) / 1e6)
    assert sum(d.usage["tokens_in"] for d in drafts) == 6000
    assert report.plan.strategy == "freeform" and report.plan.n_writer == 2


def test_a_rate_limit_is_retried_after_the_servers_delay():
    replay = Replay("rate_limit_then_success")
    drafts, report = propose_anthropic_for(replay)
    assert replay.requests[0].headers["x-stainless-retry-count"] == "0"
    assert replay.requests[1].headers["x-stainless-retry-count"] == "1"
    assert replay.bodies()[0] == replay.bodies()[1]  # the same request again
    assert len(drafts) == 1 and drafts[0].backend == "anthropic"


def test_a_server_error_that_outlasts_the_retries_falls_back_to_the_offline_backend():
    replay = Replay("server_error")
    drafts, report = propose_anthropic_for(replay, generator=fake_generator())
    assert len(replay.requests) == 3  # the first try and two retries
    assert any(n.startswith("anthropic error 500") for n in report.notes)
    assert len(drafts) == 2 and all(d.backend == "offline" for d in drafts)
    assert report.usage["tokens_in"] == 0


def test_malformed_tool_input_is_answered_with_an_error_and_the_model_recovers():
    replay = Replay("malformed_tool_input")
    drafts, report = propose_anthropic_for(replay)
    bodies = replay.bodies()
    plan_error = tool_results(bodies[1])[0]
    assert plan_error["is_error"] and "n_writer must be an integer" in plan_error["content"]
    assert tool_results(bodies[2]) == []  # the writer's conversation starts fresh
    no_ptx, bad_params = tool_results(bodies[3])[0], tool_results(bodies[4])[0]
    assert no_ptx["is_error"] and "ptx must be a non-empty string" in no_ptx["content"]
    assert bad_params["is_error"] and "params must be a list" in bad_params["content"]
    assert [d.ptx for d in drafts] == [KERNELS["good_a"]]
    assert any("malformed" in n for n in report.notes)


def test_the_backend_refuses_to_run_without_a_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    s = settings_for(Replay("server_error"), generator=fake_generator())
    s.pop("api_key")
    drafts, report = propose_with_report(
        make_workload(), generation=0, population=2, evidence=[], backend="anthropic", settings=s
    )
    assert any("ANTHROPIC_API_KEY" in n for n in report.notes)
    assert len(drafts) == 2 and all(d.backend == "offline" for d in drafts)


class ScriptedModel:
    """A stand-in model for a whole job: plans, writes a kernel that first fails to compile
    and then a good one, and tunes the best by reading it back."""

    def __init__(self):
        self.requests = []
        self.count = 0
        self.read_back = []

    def reply(self, content, stop="tool_use"):
        self.count += 1
        return httpx2.Response(
            200,
            json={
                "id": f"msg_{self.count}",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-6",
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 1000, "output_tokens": 200},
            },
        )

    def tool(self, name, inp):
        return self.reply(
            [{"type": "tool_use", "id": f"toolu_{self.count}", "name": name, "input": inp}]
        )

    def submit(self, ptx, note):
        return self.tool(
            "submit_candidate",
            {
                "ptx": ptx,
                "entry": "row_copy",
                "note": note,
                "params": KERNELS["params"],
                "launch": KERNELS["launch"],
            },
        )

    def __call__(self, request):
        body = json.loads(request.content)
        self.requests.append(body)
        last = body["messages"][-1]["content"]
        results = [b for b in last if isinstance(b, dict)] if isinstance(last, list) else []
        if "[role: planner]" in body["system"]:
            has_best = "in this job: 0." not in body["messages"][0]["content"]
            return self.tool(
                "submit_plan",
                {"strategy": "freeform", "n_writer": 1, "n_tuner": 1 if has_best else 0},
            )
        tag = f"\n// variant {self.count}\n"
        if "[role: tuner]" in body["system"]:
            if not results:
                return self.tool("read_best_candidates", {"k": 1})
            self.read_back.append(results[0]["content"])
            return self.submit(KERNELS["good_b"] + tag, "streaming stores on the best")
        if not results:
            return self.submit(KERNELS["bad"], "first try")
        if results[0].get("is_error"):
            return self.submit(KERNELS["good_a"] + tag, "fixed the mad")
        return self.reply([{"type": "text", "text": "done"}], stop="end_turn")


def test_a_whole_job_runs_end_to_end_with_the_model_behind_a_fake_transport():
    model = ScriptedModel()
    store = JsonlEvidenceStore()
    bench = FakeBench(customer_us=100.0)
    history = run_job(
        make_workload(),
        bench,
        generations=3,
        population=2,
        backend="anthropic",
        evidence_store=store,
        job="e2e",
        settings=settings_for(model),
    )
    assert len(history.generations) == 3
    assert all(d["candidates"] for d in bench.batches)
    records = store.query(job="e2e")
    assert records and all(r["backend"] == "anthropic" for r in records)
    assert {r["role"] for r in records} == {"writer", "tuner"}
    assert history.best_us == pytest.approx(100.0 * 0.9 * 0.97)  # nc loads + streaming stores
    assert history.usage["tokens_in"] > 0 and history.usage["cost_usd"] > 0
    # the tuner read the best kernel's PTX back
    assert model.read_back and "ld.global.nc.v4.f32" in model.read_back[0]
    # the compile error of the first try reached the model
    errors = [
        b
        for r in model.requests
        for m in r["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b.get("is_error")
    ]
    assert any("Unknown field" in e["content"] for e in errors)
