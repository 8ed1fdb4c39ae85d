"""Agent roles of the self-improving loop (issue 6).

Roles, as interfaces every backend implements:
- planner: `plan(ctx) -> Plan` chooses the strategy (warm start, explore, exploit, customer
  edits, free-form PTX) and the regions of the schedule space to prefer or avoid, from the
  evidence and the lessons distilled from it;
- writer: `write(ctx, plan, n, taken) -> list[CandidateDraft]` produces candidates (a generator
  schedule, an edit of the customer's PTX, or PTX written by a model);
- reviewer: `review(draft, compile_report) -> (ok, reason)` rejects before GPU time;
- tuner: `tune(ctx, plan, n, taken) -> list[CandidateDraft]` mutates and recombines the best.

Backends: `offline` (heuristic search, factory.agents.offline) and `anthropic` (tool-using
conversations, factory.agents.anthropic_backend).
"""

from __future__ import annotations

from typing import Protocol

from factory.agents.review import review
from factory.agents.types import CandidateDraft, Plan


class Planner(Protocol):
    def plan(self, ctx) -> Plan: ...


class Writer(Protocol):
    def write(self, ctx, plan: Plan, n: int, taken: set[str]) -> list[CandidateDraft]: ...


class Tuner(Protocol):
    def tune(self, ctx, plan: Plan, n: int, taken: set[str]) -> list[CandidateDraft]: ...


__all__ = ["CandidateDraft", "Plan", "Planner", "Tuner", "Writer", "review"]
