"""The Anthropic backend: each role is a tool-using conversation with a Claude model.

Tools the model can call (executed here, in-process):
- `compile_ptx(ptx)`: compile with nvJitLink for the job's GPU; returns the resource report, the
  compiler's errors, and the reviewer's verdict;
- `read_evidence(limit)`: lessons distilled from past jobs of the family, and this job's records;
- `read_best_candidates(k)`: this job's fastest candidates with their PTX;
- `submit_candidate(ptx, entry, params, launch, note)`: propose a kernel. It is compiled and
  reviewed at once; a compile error or a rejection goes back to the model as the tool's error
  (the compiler's own message), so it can fix and resubmit;
- `submit_plan(strategy, notes, n_writer, n_tuner)` (planner only).

The model is named by `settings["model"]` (or ANTHROPIC_MODEL), the key comes from
ANTHROPIC_API_KEY (or `settings["api_key"]`); `settings["http_client"]` replaces the HTTP client
(tests pass an `httpx2.Client` over an `httpx2.MockTransport`). Rate limits (429 with
retry-after) and 5xx are retried by the SDK (`settings["max_retries"]`, default 2); when the API
still fails, the error is noted and the population is filled by the offline backend. Token use
is recorded and priced per candidate (the conversation's total split over what it produced).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from factory.agents.context import Context
from factory.agents.offline import OfflinePlanner, propose_offline
from factory.agents.review import review
from factory.agents.types import (
    CandidateDraft,
    Plan,
    launch_from_dict,
    params_from_list,
    zero_usage,
)

DEFAULT_MODEL = "claude-sonnet-4-6"
# USD per million tokens (input, output), by model-name prefix, first match wins. These are the
# list prices we know of; a model not listed is priced as a Sonnet, and settings["price_per_mtok"]
# = (in, out) overrides the table (set it for any model whose price you know better).
PRICES_PER_MTOK = {
    "claude-opus-4-0": (15.0, 75.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-2": (15.0, 75.0),
    "claude-opus": (5.0, 25.0),
    "claude-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-haiku": (1.0, 5.0),
}
MAX_PTX_CHARS = 60_000

HARDWARE = (
    "Target: NVIDIA H200 (sm_90, Hopper): 132 SMs, 4.8 TB/s HBM3e (a copy reaches ~4.3 TB/s), "
    "50 MB L2, 228 KB shared memory per SM (227 KB per block), 64K 32-bit registers per SM, "
    "at most 1024 threads per block. The operators here are memory-bound: move each byte once, "
    "with 16-byte vector loads/stores (ld.global.v4.f32), enough warps in flight, and no local "
    "memory (spills are rejected)."
)

PTX_RULES = (
    "Write complete PTX modules: `.version 8.0` (or newer, up to 9.0), `.target sm_90`, "
    "`.address_size 64`, one `.visible .entry`. Parameters bind in order to `params`: "
    '{"kind": "tensor", "ptx_type": "u64", "name": <tensor>} (a device pointer), '
    '{"kind": "dim", "ptx_type": "u32", "name": <dim>} (a dim value), or '
    '{"kind": "scalar", "ptx_type": "f32", "value": <number>}. The launch is '
    '{"grid": [gx, gy, gz], "block": [bx, by, bz], "smem_bytes": n} where grid entries may be '
    'shape arithmetic over dim names, e.g. "ceildiv(M, 4)"; an optional "cluster": [k, 1, 1] '
    "(k <= 8) launches thread block clusters, the grid still counted in blocks and a multiple "
    "of k. Storage: fp32 as f32, bf16/fp16 as "
    "16-bit raw values; compute in f32. No managed memory, no printf, no external calls. "
    "Candidates are verified against a float64 reference on fresh random inputs at the "
    "benchmarked and held-out shapes, so every shape (including odd sizes) must be handled."
)


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "name": name,
        "description": description,
        "input_schema": {"type": "object", "properties": properties, "required": required},
    }


TOOL_COMPILE = _tool(
    "compile_ptx",
    "Compile a PTX module for the job's GPU with nvJitLink. Returns ok, the compiler log "
    "(errors with line numbers), registers, spills, stack and shared memory, and the "
    "reviewer's verdict.",
    {"ptx": {"type": "string"}},
    ["ptx"],
)
TOOL_EVIDENCE = _tool(
    "read_evidence",
    "Lessons from past jobs of this operator family on this GPU, and this job's measured "
    "candidates so far (schedule or note, status, reason, median time in microseconds).",
    {"limit": {"type": "integer"}},
    [],
)
TOOL_BEST = _tool(
    "read_best_candidates",
    "This job's fastest verified candidates so far, with their PTX.",
    {"k": {"type": "integer"}},
    [],
)
TOOL_SUBMIT = _tool(
    "submit_candidate",
    "Submit one candidate kernel. It is compiled and reviewed now; errors come back to you.",
    {
        "ptx": {"type": "string"},
        "entry": {"type": "string"},
        "params": {"type": "array", "items": {"type": "object"}},
        "launch": {"type": "object"},
        "note": {"type": "string", "description": "one line: what distinguishes it"},
    },
    ["ptx", "entry", "note"],
)
TOOL_PLAN = _tool(
    "submit_plan",
    "Decide this generation's plan: a strategy word, how many new kernels the writer makes and "
    "how many improvements of the best the tuner makes, and short notes.",
    {
        "strategy": {"type": "string"},
        "n_writer": {"type": "integer"},
        "n_tuner": {"type": "integer"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    ["strategy", "n_writer", "n_tuner"],
)


class MalformedInput(ValueError):
    pass


def price_usd(model: str, tokens_in: int, tokens_out: int, override=None) -> float:
    if override:
        p_in, p_out = override
    else:
        p_in, p_out = next(
            (v for k, v in PRICES_PER_MTOK.items() if model.startswith(k)), (3.0, 15.0)
        )
    return round((tokens_in * p_in + tokens_out * p_out) / 1e6, 6)


class Session:
    """One generation's conversations with the model, sharing a client and a usage count."""

    def __init__(self, ctx: Context):
        import anthropic

        self.ctx = ctx
        s = ctx.settings
        self.model = s.get("model") or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL
        api_key = s.get("api_key") or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise RuntimeError("the anthropic backend needs ANTHROPIC_API_KEY")
        kwargs = {"api_key": api_key, "max_retries": int(s.get("max_retries", 2))}
        if s.get("http_client") is not None:
            kwargs["http_client"] = s["http_client"]
        if s.get("base_url"):
            kwargs["base_url"] = s["base_url"]
        self.client = anthropic.Anthropic(**kwargs)
        self.max_tokens = int(s.get("max_tokens", 8192))
        self.compile_fn = s.get("compile_fn") or _default_compile
        self.usage = zero_usage()
        self.events: list[str] = []
        self.ptx_by_sha: dict[str, str] = dict(s.get("ptx_by_sha256") or {})

    # --- the conversation loop ----------------------------------------------------------------

    def converse(
        self, role: str, system: str, user: str, tools: list[dict], *, want: int, max_turns: int
    ) -> tuple[list[CandidateDraft], dict | None]:
        """Run one role's conversation until it has submitted `want` candidates (or a plan), the
        model stops, or `max_turns` requests are spent."""
        messages: list[dict] = [{"role": "user", "content": user}]
        accepted: list[CandidateDraft] = []
        plan: dict | None = None
        nudged = False
        for _ in range(max_turns):
            response = self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=system,
                messages=messages,
                tools=tools,
            )
            u = getattr(response, "usage", None)
            self.usage["tokens_in"] += int(getattr(u, "input_tokens", 0) or 0)
            self.usage["tokens_out"] += int(getattr(u, "output_tokens", 0) or 0)
            content = [
                b.model_dump() if hasattr(b, "model_dump") else dict(b) for b in response.content
            ]
            messages.append({"role": "assistant", "content": _assistant_blocks(content)})
            uses = [b for b in content if b.get("type") == "tool_use"]
            if not uses:
                if nudged or accepted or plan is not None:
                    break
                nudged = True
                tool = "submit_plan" if role == "planner" else "submit_candidate"
                messages.append({"role": "user", "content": f"Please call {tool} now."})
                continue
            results = []
            for b in uses:
                text, is_error = self._run_tool(role, b.get("name"), b.get("input"), accepted)
                if b.get("name") == "submit_plan" and not is_error:
                    plan = b.get("input")
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": b.get("id"),
                        "content": text,
                        "is_error": is_error,
                    }
                )
            messages.append({"role": "user", "content": results})
            if role == "planner" and plan is not None:
                break
            if role != "planner" and len(accepted) >= want:
                break
        return accepted, plan

    # --- tools ---------------------------------------------------------------------------------

    def _run_tool(self, role, name, args, accepted) -> tuple[str, bool]:
        try:
            if not isinstance(args, dict):
                raise MalformedInput(f"{name} takes a JSON object, got {type(args).__name__}")
            if name == "compile_ptx":
                return self._compile(_string(args, "ptx")), False
            if name == "read_evidence":
                return self._evidence(int(args.get("limit", 40))), False
            if name == "read_best_candidates":
                return self._best(int(args.get("k", 3))), False
            if name == "submit_candidate":
                return self._submit(role, args, accepted)
            if name == "submit_plan":
                _plan_from(args, self.ctx.population)
                return "plan recorded", False
            return f"unknown tool {name!r}", True
        except (MalformedInput, KeyError, TypeError, ValueError) as exc:
            self.events.append(f"{role}: malformed {name} input: {exc}")
            return f"malformed input for {name}: {exc}", True

    def _compile(self, ptx: str) -> str:
        rep = self.compile_fn(ptx, self.ctx.gpu)
        d = rep.to_dict() if hasattr(rep, "to_dict") else dict(rep)
        d.pop("entries", None)
        d["log"] = (d.get("log") or "")[:3000]
        return json.dumps(d, default=str)

    def _evidence(self, limit: int) -> str:
        rows = [
            {
                k: r.get(k)
                for k in (
                    "generation",
                    "schedule",
                    "dims",
                    "status",
                    "reason",
                    "median_us",
                    "role",
                    "backend",
                )
            }
            for r in self.ctx.job_records[-limit:]
        ]
        return json.dumps(
            {"lessons": self.ctx.lessons.text if self.ctx.lessons else "", "this_job": rows},
            default=str,
        )

    def _best(self, k: int) -> str:
        out = []
        for r in self.ctx.best_records(max(1, min(k, 5))):
            ptx = self.ptx_by_sha.get(r["ptx_sha256"])
            if ptx is None:
                item = self.ctx.item_for(r.get("schedule"))
                d = self.ctx.draft(item, role="tuner", note="") if item else None
                ptx = d.ptx if d is not None else None
            out.append(
                {
                    "ptx_sha256": r["ptx_sha256"],
                    "median_us": r["median_us"],
                    "dims": r.get("dims"),
                    "schedule": r.get("schedule"),
                    "ptx": (ptx or "(not available)")[:MAX_PTX_CHARS],
                }
            )
        return json.dumps(out, default=str) if out else "no verified candidates yet"

    def _submit(self, role, args, accepted) -> tuple[str, bool]:
        ptx = _string(args, "ptx")
        if len(ptx) > MAX_PTX_CHARS:
            raise MalformedInput(f"ptx is {len(ptx)} characters; the limit is {MAX_PTX_CHARS}")
        entry = _string(args, "entry")
        base = self.ctx.workload.baseline
        if args.get("params") is not None:
            if not isinstance(args["params"], list):
                raise MalformedInput("params must be a list of objects")
            params = params_from_list(args["params"])
        elif base is not None:
            params = tuple(base.params)
        else:
            raise MalformedInput("params is required (no customer kernel to take them from)")
        if args.get("launch") is not None:
            if not isinstance(args["launch"], dict):
                raise MalformedInput("launch must be an object")
            launch = launch_from_dict(args["launch"])
        elif base is not None:
            launch = base.launch
        else:
            raise MalformedInput("launch is required (no customer kernel to take it from)")
        for p in params:
            if p.kind not in ("tensor", "dim", "scalar"):
                raise MalformedInput(f"param kind {p.kind!r} is not tensor, dim or scalar")
        note = str(args.get("note") or "model-written kernel")[:200]
        draft = CandidateDraft(
            ptx=ptx,
            entry=entry,
            params=params,
            launch=launch,
            schedule=None,
            parent_ptx_sha256=self.ctx.settings.get("_parent") if role == "tuner" else None,
            role=role if role in ("writer", "tuner") else "writer",
            backend="anthropic",
            note=note.splitlines()[0] if note else "model-written kernel",
        )
        if f".entry {entry}" not in ptx and f".entry\t{entry}" not in ptx:
            return f"rejected: the PTX has no `.entry {entry}`", True
        if any(d.ptx_sha256 == draft.ptx_sha256 for d in accepted) or (
            draft.ptx_sha256 in self.ctx.tried_ptx()
        ):
            return "rejected: this exact PTX was already tried in this job", True
        rep = self.compile_fn(ptx, self.ctx.gpu)
        ok, reason = review(draft, rep)
        if not ok:
            self.events.append(f"{role}: submission rejected: {reason[:120]}")
            log = rep.get("log") if isinstance(rep, dict) else getattr(rep, "log", "")
            return f"rejected: {reason}\ncompiler log:\n{(log or '')[:3000]}", True
        accepted.append(draft)
        return f"accepted as candidate {len(accepted)} ({draft.ptx_sha256[:12]})", False


def _default_compile(ptx: str, arch: str):
    from factory.compile import compile_ptx

    return compile_ptx(ptx, arch)


def _string(args: dict, key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise MalformedInput(f"{key} must be a non-empty string")
    return value


def _assistant_blocks(content: list[dict]) -> list[dict]:
    """The assistant turn as it must be sent back (text and tool_use blocks only)."""
    out = []
    for b in content:
        if b.get("type") == "text":
            out.append({"type": "text", "text": b.get("text", "")})
        elif b.get("type") == "tool_use":
            out.append(
                {
                    "type": "tool_use",
                    "id": b.get("id"),
                    "name": b.get("name"),
                    "input": b.get("input") if isinstance(b.get("input"), dict) else {},
                }
            )
    return out


def _plan_from(args: dict, population: int) -> Plan:
    for key in ("n_writer", "n_tuner"):
        if not isinstance(args.get(key), int) or isinstance(args.get(key), bool):
            raise MalformedInput(f"{key} must be an integer, got {args.get(key)!r}")
    n_writer, n_tuner = args["n_writer"], args["n_tuner"]
    if n_writer < 0 or n_tuner < 0:
        raise MalformedInput("n_writer and n_tuner must be >= 0")
    total = n_writer + n_tuner
    if total > population and total > 0:  # the planner may not grow the population
        n_writer = round(n_writer * population / total)
        n_tuner = population - n_writer
    notes = args.get("notes") or []
    if not isinstance(notes, list):
        notes = [str(notes)]
    return Plan(
        str(args["strategy"])[:40], n_writer, n_tuner, notes=[str(n)[:200] for n in notes][:10]
    )


def _workload_brief(ctx: Context) -> str:
    w = ctx.workload
    lines = [
        f"Operator `{w.name}` (family {ctx.family}): {w.description}",
        "Manifest (the operator in our expression language; the reference is float64):",
        w.manifest[:6000],
        f"Shapes to optimise: {json.dumps(ctx.dims_list)}; held-out shapes (correctness only): "
        f"{json.dumps([dict(d) for d in w.heldout_shapes])}.",
        f"Bytes moved at the first shape (the floor): {int(_bytes(ctx))}.",
    ]
    if w.baseline is not None:
        lines += [
            "The customer's kernel (the baseline to beat; its params and launch are the default):",
            f"params: {json.dumps([p.__dict__ for p in w.baseline.params])}",
            f"launch: grid {list(w.baseline.launch.grid)}, block {list(w.baseline.launch.block)}",
            w.baseline.ptx[: MAX_PTX_CHARS // 2],
        ]
    if ctx.unsupported:
        lines.append(f"Our generator cannot express this operator ({ctx.unsupported}).")
    return "\n".join(lines)


def _bytes(ctx: Context) -> float:
    from factory.agents.context import workload_bytes

    return workload_bytes(ctx.workload, ctx.dims_list[0])


def _system(role: str, ctx: Context) -> str:
    what = {
        "planner": "You are the planner of a kernel-search team. Read the evidence, then call "
        "submit_plan once.",
        "writer": "You are the writer of a kernel-search team: write new, correct, fast PTX "
        "kernels for the operator below. Compile them with compile_ptx, fix what the compiler or "
        "reviewer says, then call submit_candidate for each distinct kernel.",
        "tuner": "You are the tuner of a kernel-search team: read the best candidates so far "
        "(read_best_candidates) and submit faster variants of them with submit_candidate.",
    }[role]
    return "\n\n".join([f"[role: {role}] {what}", HARDWARE, PTX_RULES, _workload_brief(ctx)])


def propose_anthropic(ctx: Context) -> tuple[list[CandidateDraft], Plan, list[str]]:
    """(drafts, plan, notes) for one generation with the Anthropic backend, filled up to the
    population by the offline backend when the model produced fewer (or the API failed)."""
    import anthropic

    notes: list[str] = []
    drafts: list[CandidateDraft] = []
    plan = OfflinePlanner().plan(ctx)
    session = None
    try:
        session = Session(ctx)
        max_turns = int(ctx.settings.get("max_turns", 8))
        lessons = ctx.lessons.text if ctx.lessons else ""
        _, plan_args = session.converse(
            "planner",
            _system("planner", ctx),
            f"Generation {ctx.generation}, population {ctx.population}. Verified candidates so "
            f"far in this job: {len(ctx.objective_by_ptx())}.\n{lessons}\n"
            f"The offline planner suggests: {plan.strategy}, writer {plan.n_writer}, tuner "
            f"{plan.n_tuner}.",
            [TOOL_EVIDENCE, TOOL_BEST, TOOL_PLAN],
            want=0,
            max_turns=min(max_turns, 4),
        )
        if plan_args is not None:
            plan = _plan_from(plan_args, ctx.population)
            plan.lessons_text = lessons
        if not ctx.best_records(1):
            plan.n_writer, plan.n_tuner = plan.n_writer + plan.n_tuner, 0
        tools = [TOOL_COMPILE, TOOL_EVIDENCE, TOOL_BEST, TOOL_SUBMIT]
        if plan.n_tuner > 0:
            best = ctx.best_records(1)[0]
            ctx.settings["_parent"] = best["ptx_sha256"]
            got, _ = session.converse(
                "tuner",
                _system("tuner", ctx),
                f"Submit up to {plan.n_tuner} faster variants of the best candidates.\n"
                f"Plan notes: {plan.notes}",
                tools,
                want=plan.n_tuner,
                max_turns=max_turns,
            )
            drafts += got
        if plan.n_writer > 0:
            got, _ = session.converse(
                "writer",
                _system("writer", ctx),
                f"Write up to {plan.n_writer} distinct candidate kernels.\nPlan notes: "
                f"{plan.notes}\n{lessons}",
                tools,
                want=plan.n_writer,
                max_turns=max_turns,
            )
            drafts += got
    except anthropic.APIError as exc:
        status = getattr(exc, "status_code", None)
        notes.append(f"anthropic error{f' {status}' if status else ''}: {str(exc)[:200]}")
    except RuntimeError as exc:
        notes.append(f"anthropic backend unavailable: {exc}")
    if session is not None:
        notes += session.events[:20]
        total = dict(session.usage)
        total["cost_usd"] = price_usd(
            session.model,
            total["tokens_in"],
            total["tokens_out"],
            ctx.settings.get("price_per_mtok"),
        )
        notes.append(
            f"model {session.model}: {total['tokens_in']} tokens in, {total['tokens_out']} out, "
            f"${total['cost_usd']:.4f}"
        )
        if drafts:
            share = {k: total[k] / len(drafts) for k in total}
            drafts = [
                replace(
                    d,
                    usage={
                        "tokens_in": round(share["tokens_in"]),
                        "tokens_out": round(share["tokens_out"]),
                        "cost_usd": round(share["cost_usd"], 6),
                    },
                )
                for d in drafts
            ]
        elif total["tokens_in"]:
            notes.append("the model's tokens produced no accepted candidate")
        ctx.settings["_usage"] = total
    drafts = drafts[: ctx.population]
    if len(drafts) < ctx.population and ctx.items:
        population = ctx.population
        ctx.population = population - len(drafts)
        try:
            extra, _ = propose_offline(ctx)
        finally:
            ctx.population = population
        taken = {d.ptx_sha256 for d in drafts}
        extra = [d for d in extra if d.ptx_sha256 not in taken]
        if extra:
            notes.append(f"{len(extra)} candidates filled in by the offline backend")
        drafts += extra
    return drafts, plan, notes


__all__ = ["Session", "price_usd", "propose_anthropic"]
