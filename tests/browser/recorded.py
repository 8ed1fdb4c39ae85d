"""Recorded GPU results put onto a fresh batch, for runs without a GPU.

A results file recorded on an H200 (tests/fixtures/results/) answers one batch. A new job makes
a new batch with new ids, so the recorded entries are given to the new batch's candidates in
order (cycling if the new batch has more), with every measured number kept as recorded. The
shapes must be the same: a recording for another workload is refused, never bent to fit.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "results"


def _keys(dims_list) -> set[str]:
    return {",".join(f"{k}={d[k]}" for k in sorted(d)) for d in dims_list}


def rebase(recorded: dict, batch: dict) -> dict:
    out = copy.deepcopy(recorded)
    out["batch_id"] = batch["batch_id"]
    entries = recorded["candidates"]
    passed = [e for e in entries if e["status"] == "passed"]
    if not passed:
        raise ValueError("the recorded file has no passing candidate")
    for entry in passed:
        shapes = _keys(v["dims"] for v in entry["verification"] if not v["heldout"])
        heldout = _keys(v["dims"] for v in entry["verification"] if v["heldout"])
        if shapes != _keys(batch["shapes"]) or heldout != _keys(batch["heldout_shapes"]):
            raise ValueError(
                f"the recorded file is for other shapes ({sorted(shapes)} + {sorted(heldout)}), "
                f"not {sorted(_keys(batch['shapes']))} + {sorted(_keys(batch['heldout_shapes']))}"
            )
    # A recording made from the same PTX is matched by its hash: then the evidence belongs to
    # exactly that kernel. Otherwise passing recordings go first, so the new batch's first
    # candidates carry real passing evidence.
    by_sha = {e["ptx_sha256"]: e for e in entries if e.get("ptx_sha256")}
    ordered = passed + [e for e in entries if e["status"] != "passed"]
    out["candidates"] = []
    out["matched_by_ptx"] = 0
    for i, candidate in enumerate(batch["candidates"]):
        sha = hashlib.sha256(candidate["ptx"].encode()).hexdigest() if "ptx" in candidate else None
        if sha in by_sha:
            entry = copy.deepcopy(by_sha[sha])
            out["matched_by_ptx"] += 1
        else:
            entry = copy.deepcopy(ordered[i % len(ordered)])
        entry["id"] = candidate["id"]
        if sha is not None:
            # The results file answers this batch's kernels (the portal checks the hash).
            entry["ptx_sha256"] = sha
        out["candidates"].append(entry)
    # The worker answers every baseline the batch asks for (unavailable ones included), and no
    # other: the portal refuses a results file that does not.
    recorded_baselines = {b["name"]: b for b in recorded.get("baselines", [])}
    out["baselines"] = [
        copy.deepcopy(recorded_baselines.get(name))
        or {
            "name": name,
            "version": "",
            "config": {},
            "status": "unavailable",
            "reason": "not installed on the recording host",
            "verification": [],
            "timing": [],
        }
        for name in batch.get("baselines", recorded_baselines)
    ]
    return out


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())
