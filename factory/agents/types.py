"""Shared types of the agent roles: the candidate draft and the plan."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from factory.spec.types import KernelParam, Launch

ROLES = ("planner", "writer", "tuner")
BACKENDS = ("offline", "anthropic")


def ptx_sha256(ptx: str) -> str:
    return hashlib.sha256(ptx.encode()).hexdigest()


def zero_usage() -> dict:
    return {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}


@dataclass(frozen=True)
class CandidateDraft:
    """One candidate kernel an agent proposes, before compilation and GPU time.

    `schedule` is the generator schedule (a dict of its fields) or, for edits of a customer
    kernel, the edit (`{"ptx_edit": True, ...}`); None for PTX written freely (Anthropic).
    `usage` is the model use that produced it (zero for the offline backend): its share of the
    generation's conversations, so the drafts of a generation sum to what the model was paid.
    `lineage` says where a model-written kernel came from: {"parent_handle", "parent_ptx_sha256",
    "tool" (submit_edit | submit_candidate), "edit" (the edits as sent, shortened), "edit_digest",
    "model", "backend"}; None for the offline backend. A model edit of a generator kernel has the
    parent's schedule plus {"model_edit": <edit digest>}, so the cost model sees its layout."""

    ptx: str
    entry: str
    params: tuple[KernelParam, ...]
    launch: Launch
    schedule: dict | None
    parent_ptx_sha256: str | None
    role: str
    backend: str
    note: str
    ptx_sha256: str = ""
    usage: dict = field(default_factory=zero_usage)
    predicted_us: float | None = None
    lineage: dict | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.ptx_sha256:
            object.__setattr__(self, "ptx_sha256", ptx_sha256(self.ptx))

    def to_batch_candidate(self, candidate_id: str) -> dict:
        """The candidate as a batch entry (docs/CONTRACTS.md, batch file format 1)."""
        return {
            "id": candidate_id,
            "ptx": self.ptx,
            "entry": self.entry,
            "params": [param_to_dict(p) for p in self.params],
            "launch": launch_to_dict(self.launch),
        }

    def evidence_fields(self) -> dict:
        """What an evidence record keeps of the draft beyond the common fields: for a kernel a
        model wrote, its PTX and binding (so later generations, warm starts and prompts can read
        and edit it), its parent, lineage, model and token use; nothing more for the others."""
        if self.backend == "offline":
            return {}
        c = self.to_batch_candidate("")
        return {
            "ptx": self.ptx,
            "entry": self.entry,
            "params": c["params"],
            "launch": c["launch"],
            "parent_ptx_sha256": self.parent_ptx_sha256,
            "lineage": dict(self.lineage) if self.lineage else None,
            "model": (self.lineage or {}).get("model"),
            "usage": dict(self.usage),
        }


def launch_to_dict(launch: Launch) -> dict:
    return {
        "grid": list(launch.grid),
        "block": list(launch.block),
        "smem_bytes": launch.smem_bytes,
        "cluster": list(launch.cluster) if launch.cluster else None,
    }


def launch_from_dict(d: dict) -> Launch:
    cluster = d.get("cluster")
    return Launch(
        grid=tuple(d["grid"]),
        block=tuple(int(x) for x in d["block"]),
        smem_bytes=d.get("smem_bytes", 0),
        cluster=tuple(cluster) if cluster else None,
    )


def param_to_dict(p: KernelParam) -> dict:
    """A parameter as the batch format writes it; a tensor map's box, dims and swizzle too."""
    d = {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name, "value": p.value}
    if p.kind == "tmap":
        d.update(box=list(p.box), dims=list(p.dims), swizzle=p.swizzle)
    return d


def params_from_list(items: list[dict]) -> tuple[KernelParam, ...]:
    return tuple(
        KernelParam(
            kind=str(p["kind"]),
            ptx_type=str(p["ptx_type"]),
            name=str(p.get("name", "")),
            value=float(p.get("value", 0.0)),
            box=tuple(int(x) for x in p.get("box") or ()),
            dims=tuple(str(x) for x in p.get("dims") or ()),
            swizzle=int(p.get("swizzle", 0) or 0),
        )
        for p in items
    )


@dataclass
class Plan:
    """What the planner decided for one generation: how many candidates each role makes,
    which schedule-field values to prefer or avoid, and why (one line per decision)."""

    strategy: str  # "warm_start" | "explore" | "exploit" | "customer_edits" | "freeform"
    n_writer: int
    n_tuner: int
    prefer: dict[str, list[Any]] = field(default_factory=dict)
    avoid: dict[str, list[Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lessons_text: str = ""
