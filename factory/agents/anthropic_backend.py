"""The Anthropic backend: each role is a tool-using conversation with a Claude model.

Kernels are named by short handles (factory.agents.handles: `default`, `seed1`.., `best1`..,
`cand-<sha8>`, `past1`.., `customer`) and improved by edits, not retyped: the emitted kernels
run to 172,310 characters (factory.agents.kernel_edits has the measurements), far more than one
answer holds. Tools the model can call (executed here, in-process):
- `list_kernels()`: the handles, what each kernel is, its size and measured time;
- `read_kernel(handle, start_line, n_lines)`: a page of a kernel, with a header naming the lines,
  the total and the next page (never a silent cut);
- `search_kernel(handle, text)`: the lines holding a text, with their numbers;
- `submit_edit(handle, edits, note, launch?, params?)`: propose the kernel `handle` with `edits`
  applied ({"find", "replace"} objects or unified-diff hunks); a hunk that does not apply comes
  back as the tool's error, saying where and what the kernel holds there;
- `compile_ptx(ptx | handle + edits)`: compile with nvJitLink for the job's GPU; returns the
  resource report, the compiler's errors, and the reviewer's verdict;
- `read_evidence(limit)`: lessons distilled from past jobs of the family, and this job's records;
- `read_best_candidates(k)`: this job's fastest candidates: handles, times, sizes, and the PTX of
  the short ones;
- `submit_candidate(ptx, entry, params, launch, note)`: a whole kernel, up to MAX_KERNEL_CHARS
  (a longer one is refused with its size). Each submission is compiled and reviewed at once; a
  compile error or a rejection goes back to the model as the tool's error, so it can fix it;
- `submit_plan(strategy, notes, n_writer, n_tuner)` (planner only).

An answer cut at the output limit (stop_reason "max_tokens") is reported in the notes and to the
model (the cut call is not run); what the model did not produce is filled by the offline backend.

Settings: the model is `settings["model"]`, else ANTHROPIC_MODEL, else DEFAULT_MODEL; the answer
limit `settings["max_tokens"]`, else ANTHROPIC_MAX_TOKENS, else DEFAULT_MAX_TOKENS; the key
ANTHROPIC_API_KEY (or `settings["api_key"]`); `settings["http_client"]` replaces the HTTP client
(tests pass an `httpx2.Client` over an `httpx2.MockTransport`). Rate limits (429 with retry-after)
and 5xx are retried by the SDK (`settings["max_retries"]`, default 2); when the API still fails,
the error is noted and the population is filled by the offline backend. Token use is recorded,
priced, and split over the candidates the model produced (factory.agents.usage).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from factory.agents.context import Context
from factory.agents.handles import Kernels
from factory.agents.kernel_edits import (
    CHARS_PER_TOKEN,
    MAX_KERNEL_CHARS,
    EditError,
    apply_edits,
    entry_of,
    page,
    search,
)
from factory.agents.offline import OfflinePlanner, propose_offline
from factory.agents.review import review
from factory.agents.types import (
    CandidateDraft,
    Plan,
    launch_from_dict,
    params_from_list,
    zero_usage,
)
from factory.agents.usage import split_usage
from factory.device import device_for

DEFAULT_MODEL = "claude-sonnet-4-6"
# An answer holds an edit of a few hunks in a few thousand tokens; 16,384 leaves room for a
# small kernel written whole (about 49,000 characters of PTX) without making every request slow.
DEFAULT_MAX_TOKENS = 16_384
# The SDK refuses a request that is not streamed when its max_tokens could take over ten minutes
# (60 min x max_tokens / 128,000) unless a timeout is given: above this we give one.
_SDK_NONSTREAMING_TOKENS = 21_333
# A kernel this short is shown whole where the model asks for the best candidates or the
# customer's kernel; a longer one is named by its handle, to be read a page at a time.
INLINE_PTX_CHARS = 20_000
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


def hardware_brief(ctx: Context) -> str:
    """The job's target card (factory.device) and what bounds the operator there."""
    try:
        d = device_for(ctx.gpu)
        known = ""
    except KeyError:
        d = device_for(None)
        known = f" (no record for {ctx.gpu}: the figures are {d.arch}'s)"
    lines = [
        f"Target: {ctx.gpu}, {d.name}{known}: {d.sms} SMs; measured copy ceiling "
        f"{d.copy_tbps():.2f} TB/s (bytes read + written); {d.l2_bytes // 2**20} MB L2; "
        f"{d.smem_per_sm_bytes // 1024} KB shared memory per SM ({d.smem_per_block_bytes // 1024}"
        f" KB per block); {d.registers_per_sm // 1024}K 32-bit registers per SM, at most "
        f"{d.max_registers_per_thread} per thread; at most {d.max_threads_per_block} threads per "
        f"block and {d.max_threads_per_sm} per SM; dense bf16 tensor-core peak "
        f"{d.peak_bf16_flops_per_us / 1e6:.0f} TFLOP/s, fp32 FMA peak "
        f"{d.peak_fp32_flops_per_us / 1e6:.0f} TFLOP/s."
    ]
    fam = ctx.generator.name if ctx.generator is not None and not ctx.unsupported else ""
    try:
        roof = ctx.generator.roofline_of(ctx.workload, ctx.dims_list[0]) if fam else None
    except Exception:  # noqa: BLE001 - the brief goes without the roofline
        roof = None
    if roof is not None:
        mem_us = roof.bytes / d.copy_bytes_per_us
        flop_us = roof.flops / d.peak_bf16_flops_per_us if roof.flops else 0.0
        bound = "compute" if flop_us > mem_us else "memory"
        lines.append(
            f"At the first shape the least work is {roof.bytes:.3g} bytes and {roof.flops:.3g} "
            f"FLOPs: {mem_us:.1f} us at the copy ceiling, {flop_us:.1f} us at the tensor-core "
            f"peak ({bound}-bound; a launch costs about {d.launch_floor_us:.0f} us)."
        )
    if fam == "matmul" or (
        roof is not None
        and roof.flops
        and roof.flops / d.peak_bf16_flops_per_us > roof.bytes / d.copy_bytes_per_us
    ):
        lines.append(
            "This is tensor-core work: feed wgmma (which needs `.target sm_90a`) from "
            "shared-memory tiles that TMA (cp.async.bulk.tensor) loads through an mbarrier ring "
            "of several stages, a producer warpgroup loading while consumer warpgroups compute, "
            "large output tiles per CTA for reuse, the epilogue fused into the store; keep the "
            "ring within shared memory and the accumulators within registers (no spills)."
        )
    else:
        lines.append(
            "This operator is memory-bound: move each byte once, with 16-byte vector "
            "loads/stores (ld.global.v4.f32), enough warps in flight to cover memory latency, "
            "and no local memory (spills are rejected)."
        )
    return " ".join(lines)


def ptx_rules(ctx: Context) -> str:
    return (
        f"Write complete PTX modules: `.version 8.0` (or newer, up to 9.0), `.target {ctx.gpu}` "
        "(sm_90a where wgmma or setmaxnreg is used), "
        "`.address_size 64`, one `.visible .entry`. Parameters bind in order to `params`: "
        '{"kind": "tensor", "ptx_type": "u64", "name": <tensor>} (a device pointer), '
        '{"kind": "dim", "ptx_type": "u32", "name": <dim>} (a dim value), or '
        '{"kind": "scalar", "ptx_type": "f32", "value": <number>}. The launch is '
        '{"grid": [gx, gy, gz], "block": [bx, by, bz], "smem_bytes": n} where grid entries may '
        'be shape arithmetic over dim names, e.g. "ceildiv(M, 4)"; an optional "cluster": '
        "[k, 1, 1] (k <= 8) launches thread block clusters, the grid still counted in blocks and "
        "a multiple of k. Storage: fp32 as f32, bf16/fp16 as "
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


_EDITS = {
    "type": "array",
    "description": 'each {"find": <exact text, occurring once>, "replace": <text>} or '
    '{"diff": <unified diff hunks, "@@ -a,b +c,d @@" then " ", "-", "+" lines>}; applied in order',
    "items": {
        "type": "object",
        "properties": {
            "find": {"type": "string"},
            "replace": {"type": "string"},
            "diff": {"type": "string"},
        },
    },
}
_LAUNCH_PARAMS = {
    "params": {"type": "array", "items": {"type": "object"}},
    "launch": {"type": "object"},
}

TOOL_COMPILE = _tool(
    "compile_ptx",
    "Compile a PTX module for the job's GPU with nvJitLink: either `ptx`, or a kernel `handle` "
    "with `edits` applied (as submit_edit would). Returns ok, the compiler log (errors with line "
    "numbers), registers, spills, stack and shared memory, and the reviewer's verdict.",
    {"ptx": {"type": "string"}, "handle": {"type": "string"}, "edits": _EDITS},
    [],
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
    "This job's fastest verified candidates so far: their handles, times, sizes, and the PTX "
    f"of those under {INLINE_PTX_CHARS} characters (read the others with read_kernel).",
    {"k": {"type": "integer"}},
    [],
)
TOOL_LIST = _tool(
    "list_kernels",
    "The kernels you may read and edit, by handle: the generator's default and seed kernels for "
    "this job, this job's best and earlier model-written candidates, past jobs' best "
    "model-written kernels, the customer's kernel; with size and measured time.",
    {},
    [],
)
TOOL_READ = _tool(
    "read_kernel",
    "Read a page of a kernel by handle: lines start_line.. (1-based), at most n_lines and "
    "40,000 characters; the header says which lines of how many and where the next page starts.",
    {
        "handle": {"type": "string"},
        "start_line": {"type": "integer"},
        "n_lines": {"type": "integer"},
    },
    ["handle"],
)
TOOL_SEARCH = _tool(
    "search_kernel",
    "The lines of a kernel (by handle) that hold a text, with their line numbers.",
    {"handle": {"type": "string"}, "text": {"type": "string"}},
    ["handle", "text"],
)
TOOL_EDIT = _tool(
    "submit_edit",
    "Submit the kernel `handle` with `edits` applied as one candidate: the way to improve a "
    "kernel without retyping it. The entry, params and launch are the parent's unless given. "
    "It is compiled and reviewed now; an edit that does not apply, a compile error or a "
    "rejection comes back to you.",
    {
        "handle": {"type": "string"},
        "edits": _EDITS,
        "note": {"type": "string", "description": "one line: what the edit changes and why"},
        **_LAUNCH_PARAMS,
    },
    ["handle", "edits", "note"],
)
TOOL_SUBMIT = _tool(
    "submit_candidate",
    f"Submit one whole kernel (at most {MAX_KERNEL_CHARS} characters). Prefer submit_edit for "
    "changes to an existing kernel. It is compiled and reviewed now; errors come back to you.",
    {
        "ptx": {"type": "string"},
        "entry": {"type": "string"},
        **_LAUNCH_PARAMS,
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
KERNEL_TOOLS = [
    TOOL_LIST,
    TOOL_READ,
    TOOL_SEARCH,
    TOOL_COMPILE,
    TOOL_EVIDENCE,
    TOOL_BEST,
    TOOL_EDIT,
    TOOL_SUBMIT,
]


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


def model_settings(settings: dict) -> tuple[str, int]:
    """(model, max_tokens): `settings` first, then ANTHROPIC_MODEL / ANTHROPIC_MAX_TOKENS, then
    the defaults."""
    model = settings.get("model") or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL
    raw = settings.get("max_tokens") or os.environ.get("ANTHROPIC_MAX_TOKENS") or 0
    try:
        max_tokens = int(raw)
    except (TypeError, ValueError):
        raise RuntimeError(f"ANTHROPIC_MAX_TOKENS must be an integer, got {raw!r}") from None
    return str(model), max_tokens if max_tokens > 0 else DEFAULT_MAX_TOKENS


class Session:
    """One generation's conversations with the model, sharing a client and a usage count."""

    def __init__(self, ctx: Context):
        import anthropic

        self.ctx = ctx
        s = ctx.settings
        self.model, self.max_tokens = model_settings(s)
        api_key = s.get("api_key") or os.environ.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise RuntimeError("the anthropic backend needs ANTHROPIC_API_KEY")
        kwargs = {"api_key": api_key, "max_retries": int(s.get("max_retries", 2))}
        if s.get("http_client") is not None:
            kwargs["http_client"] = s["http_client"]
        if s.get("base_url"):
            kwargs["base_url"] = s["base_url"]
        self.client = anthropic.Anthropic(**kwargs)
        self.compile_fn = s.get("compile_fn") or _default_compile
        self.usage = zero_usage()
        self.requests = 0
        self.cuts = 0
        self.events: list[str] = []
        self.ptx_by_sha: dict[str, str] = dict(s.get("ptx_by_sha256") or {})
        self.kernels = Kernels(ctx, self.ptx_by_sha)

    @property
    def answer_chars(self) -> int:
        """About how many characters of PTX one answer can hold."""
        return self.max_tokens * CHARS_PER_TOKEN

    def _create(self, **kwargs):
        if self.max_tokens > _SDK_NONSTREAMING_TOKENS:
            # the SDK's own estimate of the longest answer, plus a minute
            kwargs["timeout"] = 60 * 60 * self.max_tokens / 128_000 + 60
        return self.client.messages.create(model=self.model, max_tokens=self.max_tokens, **kwargs)

    def cut_message(self) -> str:
        return (
            f"Your answer was cut at the output limit ({self.max_tokens} tokens, about "
            f"{self.answer_chars} characters of PTX) before this call was complete, so it was "
            "not run. Do not retype a long kernel: name it by handle and send submit_edit with "
            "a few small find/replace edits or diff hunks."
        )

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
            response = self._create(system=system, messages=messages, tools=tools)
            self.requests += 1
            u = getattr(response, "usage", None)
            self.usage["tokens_in"] += int(getattr(u, "input_tokens", 0) or 0)
            out_tokens = int(getattr(u, "output_tokens", 0) or 0)
            self.usage["tokens_out"] += out_tokens
            content = [
                b.model_dump() if hasattr(b, "model_dump") else dict(b) for b in response.content
            ]
            messages.append({"role": "assistant", "content": _assistant_blocks(content)})
            uses = [b for b in content if b.get("type") == "tool_use"]
            cut = getattr(response, "stop_reason", None) == "max_tokens"
            # in a cut answer the last block is the one cut short: a tool call there is not run
            cut_use = uses[-1] if cut and uses and content[-1] is uses[-1] else None
            if cut:
                self.cuts += 1
                what = f" in a {cut_use.get('name')} call" if cut_use else ""
                self.events.append(
                    f"{role}: answer cut at max_tokens={self.max_tokens} ({out_tokens} tokens "
                    f"out){what}; {'the call was not run' if cut_use else 'nothing lost but text'}"
                )
            if not uses:
                if cut:
                    messages.append({"role": "user", "content": self.cut_message()})
                    continue
                if nudged or accepted or plan is not None:
                    break
                nudged = True
                tool = "submit_plan" if role == "planner" else "submit_edit or submit_candidate"
                messages.append({"role": "user", "content": f"Please call {tool} now."})
                continue
            results = []
            for b in uses:
                if b is cut_use:
                    text, is_error = self.cut_message(), True
                else:
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
                return self._compile(args), False
            if name == "read_evidence":
                return self._evidence(max(1, min(int(args.get("limit", 40)), 200))), False
            if name == "read_best_candidates":
                return self._best(int(args.get("k", 3))), False
            if name == "list_kernels":
                return json.dumps(self.kernels.listing()), False
            if name == "read_kernel":
                k = self.kernels.get(_string(args, "handle"))
                start = int(args.get("start_line", 1) or 1)
                return page(k.ptx, start, int(args.get("n_lines", 400) or 400)), False
            if name == "search_kernel":
                return search(self.kernels.get(_string(args, "handle")).ptx, args["text"]), False
            if name == "submit_edit":
                return self._submit_edit(role, args, accepted)
            if name == "submit_candidate":
                return self._submit(role, args, accepted)
            if name == "submit_plan":
                _plan_from(args, self.ctx.population)
                return "plan recorded", False
            return f"unknown tool {name!r}", True
        except EditError as exc:
            self.events.append(f"{role}: {name}: an edit did not apply: {str(exc)[:160]}")
            return f"the edits do not apply: {exc}", True
        except (MalformedInput, KeyError, TypeError, ValueError) as exc:
            self.events.append(f"{role}: malformed {name} input: {str(exc)[:160]}")
            return f"malformed input for {name}: {exc}", True

    def _edited(self, args: dict) -> tuple:
        """(parent Kernel, Applied) for a handle and its edits."""
        parent = self.kernels.get(_string(args, "handle"))
        if "edits" not in args:
            raise MalformedInput("edits is required")
        return parent, apply_edits(parent.ptx, args["edits"])

    def _compile(self, args: dict) -> str:
        notes: tuple = ()
        if args.get("handle"):
            _, done = self._edited(args)
            ptx, notes = done.text, done.notes
        else:
            ptx = _string(args, "ptx")
        rep = self.compile_fn(ptx, self.ctx.gpu)
        d = rep.to_dict() if hasattr(rep, "to_dict") else dict(rep)
        d.pop("entries", None)
        d["log"] = _shown(d.get("log") or "", 3000)
        if notes:
            d["edit_notes"] = list(notes)
        return json.dumps(d, default=str)

    def _evidence(self, limit: int) -> str:
        keys = ("generation", "schedule", "dims", "status", "reason", "median_us", "role")
        rows = []
        for r in self.ctx.job_records[-limit:]:
            row = {k: r.get(k) for k in keys}
            row["backend"] = r.get("backend")
            handle = self.kernels.handle_of(r.get("ptx_sha256") or "") if r.get("ptx") else None
            if handle:
                row["handle"] = handle
            rows.append(row)
        n = len(self.ctx.job_records)
        return json.dumps(
            {
                "lessons": self.ctx.lessons.text if self.ctx.lessons else "",
                "this_job": rows,
                "this_job_shown": f"the last {len(rows)} of {n} records (limit {limit})",
            },
            default=str,
        )

    def _best(self, k: int) -> str:
        out = []
        for r in self.ctx.best_records(max(1, min(k, 5))):
            handle = self.kernels.handle_of(r["ptx_sha256"])
            kern = self.kernels.by_handle.get(handle) if handle else None
            item = {
                "handle": handle,
                "ptx_sha256": r["ptx_sha256"],
                "median_us": r["median_us"],
                "dims": r.get("dims"),
                "schedule": r.get("schedule"),
            }
            if kern is None:
                item["ptx"] = "(not available)"
            elif len(kern.ptx) <= INLINE_PTX_CHARS:
                item["ptx"] = kern.ptx
            else:
                item["ptx"] = (
                    f"({len(kern.ptx)} characters, {kern.lines} lines: read it with "
                    f"read_kernel({handle!r}, start_line, n_lines) and edit it with submit_edit)"
                )
            out.append(item)
        return json.dumps(out, default=str) if out else "no verified candidates yet"

    def _binding(self, args: dict, params, launch):
        """params and launch from the call, else the given defaults."""
        if args.get("params") is not None:
            if not isinstance(args["params"], list):
                raise MalformedInput("params must be a list of objects")
            params = params_from_list(args["params"])
            for p in params:
                if p.kind not in ("tensor", "dim", "scalar", "tmap"):
                    raise MalformedInput(
                        f"param kind {p.kind!r} is not tensor, dim, scalar or tmap"
                    )
        if args.get("launch") is not None:
            if not isinstance(args["launch"], dict):
                raise MalformedInput("launch must be an object")
            launch = launch_from_dict(args["launch"])
        if params is None:
            raise MalformedInput("params is required (no customer kernel to take them from)")
        if launch is None:
            raise MalformedInput("launch is required (no customer kernel to take it from)")
        return tuple(params), launch

    def _submit(self, role, args, accepted) -> tuple[str, bool]:
        ptx = _string(args, "ptx")
        if len(ptx) > MAX_KERNEL_CHARS:
            raise MalformedInput(
                f"ptx is {len(ptx)} characters; the limit is {MAX_KERNEL_CHARS} (edit an "
                "existing kernel with submit_edit instead)"
            )
        entry = _string(args, "entry")
        base = self.ctx.workload.baseline
        params, launch = self._binding(
            args,
            tuple(base.params) if base is not None else None,
            base.launch if base is not None else None,
        )
        parent = self.ctx.settings.get("_parent") if role == "tuner" else None
        lineage = {
            "tool": "submit_candidate",
            "parent_handle": self.kernels.handle_of(parent) if parent else None,
            "parent_ptx_sha256": parent,
            "model": self.model,
            "backend": "anthropic",
        }
        draft = CandidateDraft(
            ptx=ptx,
            entry=entry,
            params=params,
            launch=launch,
            schedule=None,
            parent_ptx_sha256=parent,
            role=role if role in ("writer", "tuner") else "writer",
            backend="anthropic",
            note=_note(args),
            lineage=lineage,
        )
        return self._accept(role, draft, accepted)

    def _submit_edit(self, role, args, accepted) -> tuple[str, bool]:
        parent, done = self._edited(args)
        ptx = done.text
        if ptx == parent.ptx:
            return f"rejected: the edits leave {parent.handle} unchanged", True
        if len(ptx) > MAX_KERNEL_CHARS:
            raise MalformedInput(
                f"the edited kernel is {len(ptx)} characters; the limit is {MAX_KERNEL_CHARS}"
            )
        params, launch = self._binding(args, parent.params, parent.launch)
        schedule = None
        if parent.schedule is not None:
            schedule = {**parent.schedule, "model_edit": done.digest}
        lineage = {
            "tool": "submit_edit",
            "parent_handle": parent.handle,
            "parent_ptx_sha256": parent.sha,
            "parent_kind": parent.kind,
            "edit": done.summary,
            "edit_digest": done.digest,
            "model": self.model,
            "backend": "anthropic",
        }
        draft = CandidateDraft(
            ptx=ptx,
            entry=entry_of(ptx) or parent.entry,
            params=params,
            launch=launch,
            schedule=schedule,
            parent_ptx_sha256=parent.sha,
            role=role if role in ("writer", "tuner") else "writer",
            backend="anthropic",
            note=_note(args),
            predicted_us=self._predicted(schedule),
            lineage=lineage,
        )
        text, is_error = self._accept(role, draft, accepted)
        if done.notes and not is_error:
            text += "\n" + "\n".join(done.notes)
        return text, is_error

    def _predicted(self, schedule: dict | None) -> float | None:
        """The cost model's time for an edited generator kernel: its parent's layout."""
        model = self.ctx.model
        if schedule is None or model is None or not model.fitted:
            return None
        try:
            return sum(
                model.predict_us(schedule, d, *self.ctx._roof(d)) for d in self.ctx.dims_list
            )
        except Exception:  # noqa: BLE001 - no prediction rather than no candidate
            return None

    def _accept(self, role, draft: CandidateDraft, accepted) -> tuple[str, bool]:
        entry, ptx = draft.entry, draft.ptx
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
            return f"rejected: {reason}\ncompiler log:\n{_shown(log or '', 3000)}", True
        accepted.append(draft)
        return f"accepted as candidate {len(accepted)} ({draft.ptx_sha256[:12]})", False


def _default_compile(ptx: str, arch: str):
    from factory.compile import compile_ptx

    return compile_ptx(ptx, arch)


def _shown(text: str, limit: int) -> str:
    """`text` up to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters of the log left out]"


def _string(args: dict, key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise MalformedInput(f"{key} must be a non-empty string")
    return value


def _note(args: dict) -> str:
    note = str(args.get("note") or "model-written kernel")[:200]
    return note.splitlines()[0] if note.strip() else "model-written kernel"


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
        _shown(w.manifest, 12_000),
        f"Shapes to optimise: {json.dumps(ctx.dims_list)}; held-out shapes (correctness only): "
        f"{json.dumps([dict(d) for d in w.heldout_shapes])}.",
        f"Bytes moved at the first shape (the floor): {int(_bytes(ctx))}.",
    ]
    if w.baseline is not None:
        lines += [
            "The customer's kernel (handle `customer`; the baseline to beat; its params and "
            "launch are the default):",
            f"params: {json.dumps([p.__dict__ for p in w.baseline.params])}",
            f"launch: grid {list(w.baseline.launch.grid)}, block {list(w.baseline.launch.block)}",
        ]
        if len(w.baseline.ptx) <= INLINE_PTX_CHARS:
            lines.append(w.baseline.ptx)
        else:
            lines.append(
                f"({len(w.baseline.ptx)} characters: read it with read_kernel('customer', ...))"
            )
    if ctx.unsupported:
        lines.append(f"Our generator cannot express this operator ({ctx.unsupported}).")
    return "\n".join(lines)


def _bytes(ctx: Context) -> float:
    from factory.agents.context import workload_bytes

    return workload_bytes(ctx.workload, ctx.dims_list[0])


def _system(role: str, ctx: Context, session: Session | None = None) -> str:
    what = {
        "planner": "You are the planner of a kernel-search team. Read the evidence, then call "
        "submit_plan once.",
        "writer": "You are the writer of a kernel-search team: make new, correct, fast PTX "
        "kernels for the operator below, each distinct from the others. Start from a kernel "
        "you can name by handle (list_kernels) and change it with submit_edit, or write a "
        "short kernel whole with submit_candidate. Check a change with compile_ptx first and "
        "fix what the compiler or reviewer says.",
        "tuner": "You are the tuner of a kernel-search team: read the best candidates so far "
        "(read_best_candidates, read_kernel) and submit faster variants of them with "
        "submit_edit.",
    }[role]
    parts = [f"[role: {role}] {what}", hardware_brief(ctx), ptx_rules(ctx)]
    if session is not None and role != "planner":
        longest = max((len(k.ptx) for k in session.kernels.by_handle.values()), default=0)
        sizes = f", and the kernels here run to {longest} characters" if longest else ""
        parts.append(
            f"Your answers hold at most {session.max_tokens} output tokens (about "
            f"{session.answer_chars} characters of PTX){sizes}: never retype a long kernel. "
            "Read it a page at a time (read_kernel "
            "gives line numbers in its header; search_kernel finds lines), then send "
            'submit_edit with small edits: {"find": <text that occurs once>, "replace": ...} or '
            '{"diff": "@@ -120,3 +120,4 @@\\n context\\n-old line\\n+new line\\n context"}. A '
            "whole kernel may be submitted up to "
            f"{MAX_KERNEL_CHARS} characters when it fits in one answer."
        )
    parts.append(_workload_brief(ctx))
    return "\n\n".join(parts)


def _kernels_brief(session: Session) -> str:
    rows = session.kernels.listing()
    if not rows:
        return "No kernels to start from: write one whole with submit_candidate."
    lines = ["Kernels you can read and edit (handle: what, size):"]
    for r in rows:
        lines.append(f"- {r['handle']}: {r['about']} ({r['chars']} characters, {r['lines']} lines)")
    return "\n".join(lines)


def propose_anthropic(ctx: Context) -> tuple[list[CandidateDraft], Plan, list[str]]:
    """(drafts, plan, notes) for one generation with the Anthropic backend, filled up to the
    population by the offline backend when the model produced fewer (or the API failed, or its
    answers were cut)."""
    import anthropic

    notes: list[str] = []
    drafts: list[CandidateDraft] = []
    plan = OfflinePlanner().plan(ctx)
    session = None
    try:
        session = Session(ctx)
        max_turns = int(ctx.settings.get("max_turns", 12))
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
        if plan.n_tuner > 0:
            best = ctx.best_records(1)[0]
            ctx.settings["_parent"] = best["ptx_sha256"]
            got, _ = session.converse(
                "tuner",
                _system("tuner", ctx, session),
                f"Submit up to {plan.n_tuner} faster variants of the best candidates.\n"
                f"Plan notes: {plan.notes}\n{_kernels_brief(session)}",
                KERNEL_TOOLS,
                want=plan.n_tuner,
                max_turns=max_turns,
            )
            drafts += got
        if plan.n_writer > 0:
            got, _ = session.converse(
                "writer",
                _system("writer", ctx, session),
                f"Write up to {plan.n_writer} distinct candidate kernels.\nPlan notes: "
                f"{plan.notes}\n{lessons}\n{_kernels_brief(session)}",
                KERNEL_TOOLS,
                want=plan.n_writer,
                max_turns=max_turns,
            )
            drafts += got
    except anthropic.APIError as exc:
        status = getattr(exc, "status_code", None)
        notes.append(f"anthropic error{f' {status}' if status else ''}: {str(exc)[:200]}")
    except RuntimeError as exc:
        notes.append(f"anthropic backend unavailable: {exc}")
    drafts = drafts[: ctx.population]
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
            f"model {session.model}: {session.requests} requests, {total['tokens_in']} tokens "
            f"in, {total['tokens_out']} out, ${total['cost_usd']:.4f}"
            + (f"; {session.cuts} answers cut at max_tokens" if session.cuts else "")
        )
        if drafts:
            shares = split_usage(total, len(drafts))
            drafts = [replace(d, usage=u) for d, u in zip(drafts, shares, strict=True)]
        elif total["tokens_in"]:
            notes.append("the model's tokens produced no accepted candidate")
        total.update(
            model=session.model,
            max_tokens=session.max_tokens,
            requests=session.requests,
            answers_cut=session.cuts,
            candidates=len(drafts),
        )
        ctx.settings["_usage"] = total
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


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "Session",
    "hardware_brief",
    "model_settings",
    "price_usd",
    "propose_anthropic",
]
