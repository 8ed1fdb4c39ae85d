"""Results files in the format of docs/CONTRACTS.md, for the tests of recording and import.

`results_for(batch)` answers a batch the way the GPU worker would: every candidate verified at
every shape and held-out shape and timed at every shape, with one torch_compile baseline. The
timings are made up (the pipeline tests run without a GPU); the H200-recorded file used by the
import test is rewritten onto a fresh batch with `rebase_recorded`.
"""

from __future__ import annotations

import copy
import hashlib


def dims_key(dims):
    return ",".join(f"{k}={dims[k]}" for k in sorted(dims))


ENV = {
    "gpu": "NVIDIA H200",
    "sm": "sm_90",
    "driver": "580.159.04",
    "cuda_core": "1.2.0",
    "cuda_bindings": "13.3.1",
    "nvjitlink": "13.0.88",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "sm_clock_mhz": 1980,
    "hostname": "gpu-host",
    "started_at": "2026-12-02T10:00:00+00:00",
    "finished_at": "2026-12-02T10:01:00+00:00",
}


def _timing(dims, median_us):
    return {
        "dims": dims,
        "median_us": median_us,
        "p20_us": median_us * 0.98,
        "p80_us": median_us * 1.02,
        "ci_low_us": median_us * 0.99,
        "ci_high_us": median_us * 1.01,
        "samples_us": [median_us * f for f in (0.97, 0.99, 1.0, 1.01, 1.03)],
        "bytes": 1 << 20,
        "tbps": (1 << 20) / (median_us * 1e-6) / 1e12,
        "sm_clock_mhz": 1980,
    }


def _ptx_sha256(c: dict) -> str:
    """The sha256 of the PTX sent for batch entry `c`: from the entry, or (for the tests' hand-made
    batch documents, which carry only ids) from the candidate's row."""
    if "ptx" in c:
        return hashlib.sha256(c["ptx"].encode()).hexdigest()
    from portal.models import Candidate

    return Candidate.objects.get(code=c["id"]).ptx_sha256


def results_for(batch: dict, *, failing: set[str] = frozenset(), base_us: float = 10.0) -> dict:
    candidates = []
    for i, c in enumerate(batch["candidates"]):
        ok = c["id"] not in failing
        verification = [
            {
                "dims": d,
                "heldout": heldout,
                "passed": ok,
                "rel_err": 1e-4 if ok else 0.5,
                "max_abs_err": 1e-3 if ok else 2.0,
                "reason": "" if ok else "output differs from the reference",
            }
            for heldout, shapes in ((False, batch["shapes"]), (True, batch["heldout_shapes"]))
            for d in shapes
        ]
        candidates.append(
            {
                "id": c["id"],
                "ptx_sha256": _ptx_sha256(c),
                "status": "passed" if ok else "failed",
                "reason": "" if ok else "wrong at M=1,N=4095",
                "compile": {"ok": True, "registers": 32},
                "verification": verification,
                "timing": [_timing(d, base_us + i) for d in batch["shapes"]] if ok else [],
                "flags": [] if ok else ["suspiciously_fast_vs_torch_compile: 3.1x"],
            }
        )
    baselines = [
        {
            "name": name,
            "version": "2.11.0",
            "config": {"mode": "default"},
            "status": "passed",
            "reason": "",
            "verification": [],
            "timing": [_timing(d, base_us * (2 + i)) for d in batch["shapes"]],
        }
        for i, name in enumerate(batch.get("baselines", ["torch_compile"]))
    ]
    return {
        "format": 1,
        "batch_id": batch["batch_id"],
        "env": dict(ENV),
        "copy_ceiling_tbps": 4.28,
        "candidates": candidates,
        "baselines": baselines,
    }


def rebase_recorded(recorded: dict, batch: dict) -> dict:
    """A results file recorded for one batch, put onto `batch`: new batch_id and candidate ids,
    every measured number kept as recorded. An entry recorded for the same PTX (by sha256) goes
    to that candidate; the others take the recorded entries in order, passing ones first. A
    recording made at other shapes is refused."""
    shapes = {dims_key(d) for d in batch["shapes"]}
    entries = recorded["candidates"]
    for entry in entries:
        timed = {dims_key(t["dims"]) for t in entry.get("timing", [])}
        if timed and timed != shapes:
            raise ValueError(f"recorded at {sorted(timed)}, not at {sorted(shapes)}")
    by_sha = {e["ptx_sha256"]: e for e in entries if e.get("ptx_sha256")}
    ordered = [e for e in entries if e["status"] == "passed"]
    ordered += [e for e in entries if e["status"] != "passed"]
    out = copy.deepcopy(recorded)
    out["batch_id"] = batch["batch_id"]
    out["candidates"] = []
    for i, candidate in enumerate(batch["candidates"]):
        sha = hashlib.sha256(candidate["ptx"].encode()).hexdigest()
        entry = copy.deepcopy(by_sha.get(sha) or ordered[i % len(ordered)])
        entry["id"] = candidate["id"]
        entry["ptx_sha256"] = sha
        out["candidates"].append(entry)
    # The worker answers every baseline the batch asks for (unavailable ones included), and no
    # other: a recording made under another setting keeps the baselines this batch asked for.
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
