"""The batch file (format 1, docs/CONTRACTS.md) parsed into typed objects, and the result records.

Parsing never half-accepts: every problem is collected and raised together as a `BatchError`
whose `errors` are (field, problem) pairs naming the dotted field (``candidates[3].launch.grid``).
Results are plain dicts so they serialise to JSON unchanged; `candidate_record` and
`baseline_record` build the one shape every outcome takes (failures are data, not exceptions).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from factory.spec.types import KernelParam, Launch

BATCH_FORMAT = 1
RESULTS_FORMAT = 1

KNOWN_BASELINES = (
    "customer",
    "torch_eager",
    "torch_compile",
    "torch_compile_max_autotune",
    "triton",
    "liger",
    "sdpa_flash",
    "sdpa_cudnn",
    "flex_attention",
)
# How the L2 is flushed before every timed run (and every copy-ceiling run). "read" loads a 256 MB
# buffer and leaves only clean lines behind; "write" fills it (the old way, and triton's do_bench
# way), which leaves dirty lines the timed kernel then pays to write back (~4 us on the H200).
L2_FLUSH_MODES = ("read", "write")
TIMED_OUTPUTS = ("shared", "guarded")  # Options.timed_outputs
STATUSES = ("passed", "failed", "compile_error", "crashed", "timeout")
PARAM_KINDS = {
    "tensor": ("u64",),
    "dim": ("u32", "u64", "s32", "s64"),
    "scalar": ("f32", "f64"),
    "tmap": ("b8x128",),
}
_ENTRY_NAME = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


_FAMILY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class BatchError(ValueError):
    """A batch was refused. `errors` lists (field, problem) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{f}: {p}" for f, p in self.errors))


@dataclass(frozen=True)
class Options:
    time_budget_s_per_candidate: float = 2.0  # wall time for timing, all shapes together
    timeout_s_per_candidate: float = 20.0  # no progress for this long = a hung kernel
    seed: int | None = None  # None: drawn from os.urandom (the normal, trustworthy case)
    check_timed_outputs: bool = True  # verify the output of every timed run
    l2_flush: str = "read"  # one of L2_FLUSH_MODES
    # Keep a standby child prepared (its own CUDA context and copy of the inputs) so that a hung
    # or crashed kernel costs no restart; off halves the device memory the batch needs.
    warm_spare: bool = True
    # Where candidates' timed runs write when torch baselines are timed beside them: "shared",
    # the blocks of torch's allocator the baselines' outputs were just freed from (the same
    # memory for every entrant); "guarded", the worker's own guarded buffers (as before).
    timed_outputs: str = "shared"


@dataclass(frozen=True)
class CandidateSpec:
    id: str
    ptx: str
    entry: str
    params: tuple[KernelParam, ...] | None  # None: the workload's baseline binding
    launch: Launch | None


@dataclass(frozen=True)
class Batch:
    batch_id: str
    manifest: str
    baseline_source: str | None
    shapes: tuple[dict[str, int], ...]
    heldout_shapes: tuple[dict[str, int], ...]
    candidates: tuple[CandidateSpec, ...]
    baselines: tuple[str, ...]
    options: Options = field(default_factory=Options)
    family: str = "row"  # the operator family (factory.families) whose baselines the worker runs


def _dims(value: Any, where: str, errors: list) -> dict[str, int] | None:
    if not isinstance(value, dict) or not value:
        errors.append((where, "must be a non-empty object of dim name -> positive integer"))
        return None
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            errors.append((f"{where}.{k}", "dim names are identifiers"))
        elif isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            errors.append((f"{where}.{k}", f"must be a positive integer, got {v!r}"))
        else:
            out[k] = v
    return out


def _shape_list(value: Any, where: str, errors: list, *, allow_empty: bool) -> tuple:
    if value is None and allow_empty:
        return ()
    if not isinstance(value, list) or (not value and not allow_empty):
        errors.append((where, "must be a list of shapes" + ("" if allow_empty else " (non-empty)")))
        return ()
    shapes = []
    for i, s in enumerate(value):
        d = _dims(s, f"{where}[{i}]", errors)
        if d is not None:
            shapes.append(d)
    return tuple(shapes)


def parse_params(value: Any, where: str, errors: list) -> tuple[KernelParam, ...] | None:
    if not isinstance(value, list):
        errors.append((where, "must be a list of parameter objects"))
        return None
    params = []
    for i, p in enumerate(value):
        w = f"{where}[{i}]"
        if not isinstance(p, dict):
            errors.append((w, "must be an object"))
            continue
        kind, ptx_type = p.get("kind"), p.get("ptx_type")
        if kind not in PARAM_KINDS:
            errors.append((f"{w}.kind", f"must be one of {sorted(PARAM_KINDS)}, got {kind!r}"))
            continue
        if ptx_type not in PARAM_KINDS[kind]:
            errors.append((f"{w}.ptx_type", f"{kind} takes {PARAM_KINDS[kind]}, got {ptx_type!r}"))
            continue
        name = p.get("name", "")
        if kind in ("tensor", "dim", "tmap") and (not isinstance(name, str) or not name):
            errors.append((f"{w}.name", f"a {kind} parameter names a tensor or dim"))
            continue
        value_ = p.get("value", 0.0)
        if kind == "scalar" and (isinstance(value_, bool) or not isinstance(value_, int | float)):
            errors.append((f"{w}.value", "a scalar parameter has a numeric value"))
            continue
        if kind == "tmap":
            tm = _tmap_fields(p, w, errors)
            if tm is not None:
                params.append(KernelParam(kind=kind, ptx_type=ptx_type, name=name, **tm))
            continue
        params.append(KernelParam(kind=kind, ptx_type=ptx_type, name=name, value=float(value_)))
    return tuple(params)


def _tmap_fields(p: dict, w: str, errors: list) -> dict | None:
    """box (ints in [1, 256]), dims (dim expressions, same rank, 1 to 5) and swizzle of a
    tensor-map parameter (see gpuworker.tensormap)."""
    box, dims, swizzle = p.get("box"), p.get("dims"), p.get("swizzle", 0)
    if not (
        isinstance(box, list)
        and 1 <= len(box) <= 5
        and all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 256 for b in box)
    ):
        errors.append((f"{w}.box", "a tensor map's box is 1 to 5 integers in [1, 256]"))
        return None
    if not (isinstance(dims, list) and len(dims) == len(box) and all(_dim_expr(d) for d in dims)):
        errors.append((f"{w}.dims", "a tensor map's dims are dim expressions, one per box entry"))
        return None
    if swizzle not in (0, 32, 64, 128):
        errors.append((f"{w}.swizzle", "must be 0, 32, 64 or 128"))
        return None
    return {"box": tuple(box), "dims": tuple(dims), "swizzle": swizzle}


def _dim_expr(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and v >= 0) or (
        isinstance(v, str) and 0 < len(v) <= 200
    )


def parse_launch(value: Any, where: str, errors: list) -> Launch | None:
    if not isinstance(value, dict):
        errors.append((where, "must be an object with grid, block, smem_bytes, cluster"))
        return None
    n = len(errors)
    grid, block = value.get("grid"), value.get("block")
    if not isinstance(grid, list) or len(grid) != 3 or not all(_dim_expr(g) for g in grid):
        errors.append((f"{where}.grid", "must be 3 entries, each an integer or a dim expression"))
    if (
        not isinstance(block, list)
        or len(block) != 3
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        errors.append((f"{where}.block", "must be 3 positive integers"))
    elif block[0] * block[1] * block[2] > 1024:
        errors.append((f"{where}.block", "at most 1024 threads per block"))
    smem = value.get("smem_bytes", 0)
    if not _dim_expr(smem):
        errors.append((f"{where}.smem_bytes", "must be an integer or a dim expression"))
    cluster = value.get("cluster")
    if cluster is not None and (
        not isinstance(cluster, list)
        or len(cluster) != 3
        or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in cluster)
    ):
        errors.append((f"{where}.cluster", "must be null or 3 positive integers"))
    if len(errors) > n:
        return None
    return Launch(
        grid=tuple(grid),
        block=tuple(block),
        smem_bytes=smem,
        cluster=tuple(cluster) if cluster else None,
    )


def _options(value: Any, errors: list) -> Options:
    if value is None:
        return Options()
    if not isinstance(value, dict):
        errors.append(("options", "must be an object"))
        return Options()
    known = {
        "time_budget_s_per_candidate",
        "timeout_s_per_candidate",
        "seed",
        "check_timed_outputs",
        "l2_flush",
        "warm_spare",
        "timed_outputs",
    }
    for k in value:
        if k not in known:
            errors.append((f"options.{k}", f"unknown option (known: {sorted(known)})"))
    budget = value.get("time_budget_s_per_candidate", Options.time_budget_s_per_candidate)
    timeout = value.get("timeout_s_per_candidate", Options.timeout_s_per_candidate)
    seed = value.get("seed")
    check = value.get("check_timed_outputs", True)
    l2_flush = value.get("l2_flush", Options.l2_flush)
    warm_spare = value.get("warm_spare", Options.warm_spare)
    timed_outputs = value.get("timed_outputs", Options.timed_outputs)
    for name, v, lo, hi in (
        ("time_budget_s_per_candidate", budget, 0.05, 600),
        ("timeout_s_per_candidate", timeout, 0.5, 3600),
    ):
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            errors.append((f"options.{name}", f"must be a number of seconds in [{lo}, {hi}]"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        errors.append(("options.seed", "must be null or a non-negative integer"))
    if not isinstance(check, bool):
        errors.append(("options.check_timed_outputs", "must be true or false"))
    if not isinstance(l2_flush, str) or l2_flush not in L2_FLUSH_MODES:
        errors.append(
            ("options.l2_flush", f"must be one of {list(L2_FLUSH_MODES)}, got {l2_flush!r}")
        )
    if not isinstance(warm_spare, bool):
        errors.append(("options.warm_spare", "must be true or false"))
    if not isinstance(timed_outputs, str) or timed_outputs not in TIMED_OUTPUTS:
        errors.append(
            (
                "options.timed_outputs",
                f"must be one of {list(TIMED_OUTPUTS)}, got {timed_outputs!r}",
            )
        )
    if errors:
        return Options()
    return Options(float(budget), float(timeout), seed, check, l2_flush, warm_spare, timed_outputs)


def parse_batch(data: Any) -> Batch:
    """Validate a format-1 batch dict. Raises BatchError listing every problem found."""
    errors: list[tuple[str, str]] = []
    if not isinstance(data, dict):
        raise BatchError([("batch", "must be a JSON object")])
    if data.get("format") != BATCH_FORMAT:
        errors.append(("format", f"must be {BATCH_FORMAT}, got {data.get('format')!r}"))
    batch_id = data.get("batch_id")
    if not isinstance(batch_id, str) or not batch_id:
        errors.append(("batch_id", "must be a non-empty string"))
    manifest = data.get("manifest")
    if not isinstance(manifest, str) or not manifest.strip():
        errors.append(("manifest", "must be the workload's manifest text"))
    baseline_source = data.get("baseline_source")
    if baseline_source is not None and not isinstance(baseline_source, str):
        errors.append(("baseline_source", "must be null or a string"))
    shapes = _shape_list(data.get("shapes"), "shapes", errors, allow_empty=False)
    heldout = _shape_list(data.get("heldout_shapes"), "heldout_shapes", errors, allow_empty=True)

    candidates = []
    raw = data.get("candidates")
    if not isinstance(raw, list):
        errors.append(("candidates", "must be a list (may be empty)"))
        raw = []
    seen_ids: set[str] = set()
    for i, c in enumerate(raw):
        w = f"candidates[{i}]"
        if not isinstance(c, dict):
            errors.append((w, "must be an object"))
            continue
        cid, ptx, entry = c.get("id"), c.get("ptx"), c.get("entry")
        if not isinstance(cid, str) or not cid:
            errors.append((f"{w}.id", "must be a non-empty string"))
        elif cid in seen_ids:
            errors.append((f"{w}.id", f"duplicate id {cid!r}"))
        else:
            seen_ids.add(cid)
        if not isinstance(ptx, str) or ".entry" not in ptx:
            errors.append((f"{w}.ptx", "must be PTX text with an .entry"))
        if not isinstance(entry, str) or not _ENTRY_NAME.match(entry):
            errors.append((f"{w}.entry", "must be the kernel's entry name"))
        params = launch = None
        if c.get("params") is not None:
            params = parse_params(c["params"], f"{w}.params", errors)
        if c.get("launch") is not None:
            launch = parse_launch(c["launch"], f"{w}.launch", errors)
        if (params is None) != (launch is None) and not any(e[0].startswith(w) for e in errors):
            errors.append((w, "give both params and launch, or neither (the baseline binding)"))
        candidates.append(CandidateSpec(str(cid), ptx, entry, params, launch))

    baselines = data.get("baselines", [])
    if not isinstance(baselines, list) or not all(isinstance(b, str) for b in baselines):
        errors.append(("baselines", "must be a list of names"))
        baselines = []
    for i, b in enumerate(baselines):
        if b not in KNOWN_BASELINES:
            errors.append((f"baselines[{i}]", f"unknown baseline {b!r} (known: {KNOWN_BASELINES})"))
    options = _options(data.get("options"), errors)
    family = data.get("family", "row")
    if not isinstance(family, str) or not _FAMILY_NAME.match(family):
        errors.append(("family", 'must be an operator family\'s name (e.g. "row")'))
        family = "row"
    if errors:
        raise BatchError(errors)
    return Batch(
        batch_id=batch_id,
        manifest=manifest,
        baseline_source=baseline_source,
        shapes=shapes,
        heldout_shapes=heldout,
        candidates=tuple(candidates),
        baselines=tuple(dict.fromkeys(baselines)),
        options=options,
        family=family,
    )


def candidate_record(cid: str, ptx: str = "") -> dict:
    """An empty result record for a candidate; the runner fills it in. `ptx_sha256` names the
    PTX the worker was given, so the portal records results only for the kernels it sent."""
    return {
        "id": cid,
        "ptx_sha256": hashlib.sha256(ptx.encode("utf-8")).hexdigest(),
        "status": "failed",
        "reason": "",
        "compile": None,
        "verification": [],
        "timing": [],
        "flags": [],
    }


def baseline_record(name: str, version: str = "", config: dict | None = None) -> dict:
    return {
        "name": name,
        "version": version,
        "config": config or {},
        "status": "failed",
        "reason": "",
        "verification": [],
        "timing": [],
        "flags": [],
    }


def params_to_json(params: tuple[KernelParam, ...]) -> list[dict]:
    out = []
    for p in params:
        d = {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name, "value": p.value}
        if p.kind == "tmap":
            d |= {"box": list(p.box), "dims": list(p.dims), "swizzle": p.swizzle}
        out.append(d)
    return out


def launch_to_json(launch: Launch) -> dict:
    return {
        "grid": list(launch.grid),
        "block": list(launch.block),
        "smem_bytes": launch.smem_bytes,
        "cluster": list(launch.cluster) if launch.cluster else None,
    }
