"""What a job's model use cost: tokens and dollars per job, per generation, per candidate.

Every draft carries its share of its generation's conversations (`CandidateDraft.usage`, the
shares of a generation sum to what its conversations spent when the model produced anything),
every evidence record of a model-written kernel carries the same `usage`, and the loop's report
(`ProposeReport.usage`, `GenerationRecord.usage`) holds each generation's whole spend, tokens that
produced nothing included; the Anthropic backend's also names the `model`, its `max_tokens`, the
`requests` made, the `answers_cut` at max_tokens and the `candidates` produced. `job_usage` sums
them for a page or an API answer.
"""

from __future__ import annotations

from collections.abc import Iterable

USAGE_KEYS = ("tokens_in", "tokens_out", "cost_usd")


def _zero() -> dict:
    return {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}


def _get(x, name, default=None):
    return x.get(name, default) if isinstance(x, dict) else getattr(x, name, default)


def _add(into: dict, usage: dict | None) -> None:
    for k in USAGE_KEYS:
        into[k] += (usage or {}).get(k, 0) or 0


def _rounded(d: dict) -> dict:
    d["cost_usd"] = round(float(d["cost_usd"]), 6)
    d["tokens_in"] = int(d["tokens_in"])
    d["tokens_out"] = int(d["tokens_out"])
    return d


def job_usage(items: Iterable, generations: Iterable | None = None) -> dict:
    """Tokens and cost of one job.

    `items`: its drafts (CandidateDraft or dicts with the same fields), or its evidence records
    (one per candidate and shape: each candidate is counted once, by job, generation and PTX
    hash), or the population entries of the loop's GenerationRecords. `generations`: optionally
    each generation's whole spend (ProposeReport.usage / GenerationRecord.usage, or objects with
    a `usage` and a `generation`): then the total is theirs, and `unattributed` is what no
    candidate carries (the tokens of answers that produced no accepted kernel).

    Returns {"tokens_in", "tokens_out", "cost_usd", "candidates" (how many carry model use),
    "requests", "answers_cut" (from `generations`, 0 without them),
    "by_generation": {generation: {tokens_in, tokens_out, cost_usd, candidates, spent}},
    "by_model": {model: {...}}, "unattributed": {...}}."""
    seen: set[tuple] = set()
    total = _zero()
    by_gen: dict = {}
    by_model: dict = {}
    n = 0
    for x in items:
        usage = _get(x, "usage") or {}
        if not any(usage.get(k) for k in USAGE_KEYS):
            continue
        key = (_get(x, "job"), _get(x, "generation"), _get(x, "ptx_sha256"))
        if key[2] is not None and key in seen:
            continue
        seen.add(key)
        n += 1
        _add(total, usage)
        g = _get(x, "generation")
        gd = by_gen.setdefault(g, dict(_zero(), candidates=0))
        _add(gd, usage)
        gd["candidates"] += 1
        lineage = _get(x, "lineage") or {}
        model = _get(x, "model") or lineage.get("model") or "unknown"
        md = by_model.setdefault(model, dict(_zero(), candidates=0))
        _add(md, usage)
        md["candidates"] += 1
    attributed = dict(total)
    counts = {"requests": 0, "answers_cut": 0}
    if generations is not None:
        total = _zero()
        for i, gen in enumerate(generations):
            if isinstance(gen, dict) and "usage" not in gen:
                usage, g = gen, i  # a bare usage dict: generations in order
            else:
                usage, g = _get(gen, "usage") or {}, _get(gen, "generation", i)
            _add(total, usage)
            for k in counts:
                counts[k] += int((usage or {}).get(k, 0) or 0)
            gd = by_gen.setdefault(g, dict(_zero(), candidates=0))
            spent = _zero()
            _add(spent, usage)
            gd["spent"] = _rounded(spent)
    unattributed = {k: max(0, total[k] - attributed[k]) for k in USAGE_KEYS}
    return {
        **_rounded(total),
        "candidates": n,
        **counts,
        "by_generation": {g: _rounded(v) for g, v in by_gen.items()},
        "by_model": {m: _rounded(v) for m, v in by_model.items()},
        "unattributed": _rounded(unattributed),
    }


def split_usage(total: dict, n: int) -> list[dict]:
    """`total` split over `n` candidates so that the shares sum to it exactly (tokens by largest
    remainder, cost to the micro-dollar)."""
    if n <= 0:
        return []
    out = [_zero() for _ in range(n)]
    for k in ("tokens_in", "tokens_out"):
        whole, rest = divmod(int(total.get(k, 0)), n)
        for i in range(n):
            out[i][k] = whole + (1 if i < rest else 0)
    micro = round(float(total.get("cost_usd", 0.0)) * 1e6)
    whole, rest = divmod(micro, n)
    for i in range(n):
        out[i]["cost_usd"] = (whole + (1 if i < rest else 0)) / 1e6
    return out


__all__ = ["USAGE_KEYS", "job_usage", "split_usage"]
