"""The downloadable artifact: a zip built from plain data, with checksums for every file.

The view gathers an approved candidate's evidence into an `ArtifactInputs` (plain strings, dicts
and lists) and `build_artifact` turns it into bytes. No database access here, so the builder is
tested on its own and an artifact can be rebuilt from recorded evidence alone.

Layout of the zip (flat, so ``sha256sum -c SHA256SUMS`` works in the unpacked folder):

    kernel.ptx                  the approved PTX, byte for byte what was verified and timed
    cubin/sm_90.cubin           compiled with nvJitLink per architecture (sm_100 when it compiles)
    manifest.json               entry point, params, launch geometry per shape, dtypes, tolerances,
                                tool versions, harness version, review decision
    workload.toml               the workload manifest as accepted
    report/report.json          verification and timing with raw samples, baselines, flags
    report/REPORT.md            the same, short and readable
    README.md                   what it is, the install line, shapes and alignments, how to call
                                it from PyTorch and from cuda-python, the checksums
    examples/load_cuda_python.py, examples/load_torch.py
                                loaders that check their inputs (dtype, shape, contiguity,
                                device) before launching, then compare with the reference
    examples/reference.py       the workload's float64 reference in torch ops, translated back
                                from the manifest's expressions (when the manifest loads and
                                every node has a torch form; otherwise left out, and the README
                                and the loaders say so)
    SHA256SUMS                  sha256 of every other file, in ``sha256sum`` format

Entries carry a fixed timestamp so the same evidence always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# Bumped when the layout or the meaning of a field in manifest.json changes.
ARTIFACT_FORMAT = 1
DEFAULT_ARCHS = ("sm_90", "sm_100")
# The DOS epoch: zip cannot store earlier dates, and a constant keeps the bytes reproducible.
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)

NUMPY_DTYPES = {
    "fp32": "np.float32",
    "fp16": "np.float16",
    "bf16": "np.uint16",
    "int32": "np.int32",
    "int64": "np.int64",
}
TORCH_DTYPES = {
    "fp32": "torch.float32",
    "fp16": "torch.float16",
    "bf16": "torch.bfloat16",
    "int32": "torch.int32",
    "int64": "torch.int64",
}
# How a dim or scalar parameter of a given PTX type is passed by value (cuda.core takes numpy
# scalars and packs them with their exact width).
SCALAR_CTORS = {
    "u32": "np.uint32",
    "s32": "np.int32",
    "u64": "np.uint64",
    "s64": "np.int64",
    "f32": "np.float32",
    "f64": "np.float64",
}


# What the loader examples need; the versions the GPU worker ran with when the run recorded them.
INSTALL_DEFAULTS = {"cuda-core": "1.2.0", "cuda-bindings": "13.3.1"}


@dataclass
class ArtifactInputs:
    """Everything an artifact is made of, as plain data.

    `params`: the entry's parameters in order, each ``{"kind", "ptx_type", "name", "value"}``.
    `launch`: ``{"grid": [...], "block": [...], "smem_bytes", "cluster"}``, entries int or shape
    arithmetic over dim names. `inputs`/`outputs`: ``{"name", "shape", "dtype"}`` with symbolic
    shapes. `verification`/`timing`: the candidate's records in the results-file format.
    `baselines`: ``{"name", "version", "status", "timing": [...]}``. `review`: who approved,
    when and why.
    """

    workload_name: str
    workload_code: str
    job_code: str
    candidate_code: str
    entry: str
    ptx: str
    params: list[dict]
    launch: dict
    shapes: list[dict]
    heldout_shapes: list[dict] = field(default_factory=list)
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    tolerances: dict = field(default_factory=dict)
    target: str = "sm_90"
    manifest_toml: str = ""
    env: dict = field(default_factory=dict)
    harness_version: str = ""
    copy_ceiling_tbps: float | None = None
    verification: list[dict] = field(default_factory=list)
    timing: list[dict] = field(default_factory=list)
    baselines: list[dict] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    lineage: dict = field(default_factory=dict)
    review: dict = field(default_factory=dict)


@dataclass
class BuiltArtifact:
    data: bytes
    sha256: str  # of the zip itself
    files: dict[str, str]  # path inside the zip -> sha256 of its bytes (SHA256SUMS excluded)
    cubins: dict[str, dict]  # arch -> {"ok", "registers", ..., "log"}

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _resolve(expr, dims: dict) -> int:
    """A launch entry for one shape: ints stay ints, shape arithmetic goes through the spec's own
    evaluator (never eval)."""
    if isinstance(expr, int):
        return expr
    from factory.spec import eval_dim_expr

    return int(eval_dim_expr(expr, dims))


def launch_for_shape(launch: dict, dims: dict) -> dict:
    cluster = launch.get("cluster")
    return {
        "dims": dict(dims),
        "grid": [_resolve(g, dims) for g in launch["grid"]],
        "block": [_resolve(b, dims) for b in launch["block"]],
        "smem_bytes": _resolve(launch.get("smem_bytes", 0) or 0, dims),
        "cluster": [_resolve(c, dims) for c in cluster] if cluster else None,
    }


def _default_compile(ptx: str, arch: str):
    from factory.compile import compile_ptx

    return compile_ptx(ptx, arch, cache=False)  # the shipped cubin, compiled from the PTX now


def _compile_all(
    ptx: str, archs: Iterable[str], compile_fn: Callable | None
) -> tuple[dict[str, bytes], dict[str, dict]]:
    compile_fn = compile_fn or _default_compile
    cubins: dict[str, bytes] = {}
    reports: dict[str, dict] = {}
    for arch in archs:
        report = compile_fn(ptx, arch)
        ok = bool(getattr(report, "ok", False) and getattr(report, "cubin", None))
        reports[arch] = {
            "ok": ok,
            "file": f"cubin/{arch}.cubin" if ok else None,
            "registers": getattr(report, "registers", 0),
            "spill_store_bytes": getattr(report, "spill_store_bytes", 0),
            "spill_load_bytes": getattr(report, "spill_load_bytes", 0),
            "smem_bytes": getattr(report, "smem_bytes", 0),
            "nvjitlink_version": getattr(report, "nvjitlink_version", ""),
            # A failing architecture keeps only the log's first lines: enough to see why.
            "log": "" if ok else "\n".join(str(getattr(report, "log", "")).splitlines()[:20]),
        }
        if ok:
            cubins[arch] = report.cubin
    return cubins, reports


def _speedups(inputs: ArtifactInputs) -> list[dict]:
    """Candidate median against each baseline's median, per shape (ratio > 1 means faster)."""
    ours = {json.dumps(t["dims"], sort_keys=True): t for t in inputs.timing}
    rows = []
    for baseline in inputs.baselines:
        for t in baseline.get("timing", []):
            key = json.dumps(t["dims"], sort_keys=True)
            mine = ours.get(key)
            if not mine or not t.get("median_us") or not mine.get("median_us"):
                continue
            rows.append(
                {
                    "baseline": baseline["name"],
                    "dims": t["dims"],
                    "baseline_median_us": t["median_us"],
                    "candidate_median_us": mine["median_us"],
                    "speedup": t["median_us"] / mine["median_us"],
                    # Conservative bound: our slowest plausible time against their fastest.
                    "speedup_low": (
                        t["ci_low_us"] / mine["ci_high_us"]
                        if t.get("ci_low_us") and mine.get("ci_high_us")
                        else None
                    ),
                }
            )
    return rows


def _dims_label(dims: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def _num(value, spec: str) -> str:
    """A number of the report in `spec`'s format; "–" for one the results file left out (a
    results file may omit intervals, throughput and errors: they are optional)."""
    return "–" if value is None else format(value, spec)


def _report_markdown(inputs: ArtifactInputs, speedups: list[dict], cubins: dict) -> str:
    lines = [
        f"# {inputs.workload_name}: verified PTX kernel",
        "",
        f"- Entry point: `{inputs.entry}`; target {inputs.target}",
        f"- Candidate {inputs.candidate_code} of job {inputs.job_code}",
        f"- GPU: {inputs.env.get('gpu', 'unknown')}, driver {inputs.env.get('driver', '?')}",
        f"- Approved by {inputs.review.get('by', '?')} on {inputs.review.get('at', '?')}"
        + (f": {inputs.review['comment']}" if inputs.review.get("comment") else ""),
        f"- Cubins: {', '.join(a for a, r in cubins.items() if r['ok']) or 'none'}",
        "",
        "## Verification",
        "",
        "| shape | held out | passed | rel err | max abs err |",
        "|---|---|---|---|---|",
    ]
    for v in inputs.verification:
        lines.append(
            f"| {_dims_label(v['dims'])} | {'yes' if v.get('heldout') else 'no'} | "
            f"{'yes' if v.get('passed') else 'NO'} | {_num(v.get('rel_err'), '.3g')} | "
            f"{_num(v.get('max_abs_err'), '.3g')} |"
        )
    lines += [
        "",
        "## Timing (candidate)",
        "",
        "| shape | median µs | 95% interval µs | TB/s | samples |",
        "|---|---|---|---|---|",
    ]
    for t in inputs.timing:
        lines.append(
            f"| {_dims_label(t['dims'])} | {_num(t.get('median_us'), '.3f')} | "
            f"{_num(t.get('ci_low_us'), '.3f')}–{_num(t.get('ci_high_us'), '.3f')} | "
            f"{_num(t.get('tbps'), '.2f')} | {len(t.get('samples_us') or [])} |"
        )
    if speedups:
        lines += [
            "",
            "## Speedup against baselines",
            "",
            "| baseline | shape | speedup | lower bound |",
            "|---|---|---|---|",
        ]
        for s in speedups:
            low = f"{s['speedup_low']:.2f}×" if s["speedup_low"] else "–"
            lines.append(
                f"| {s['baseline']} | {_dims_label(s['dims'])} | {s['speedup']:.2f}× | {low} |"
            )
    if inputs.flags:
        lines += ["", "## Flags", ""] + [f"- {f}" for f in inputs.flags]
    lines += ["", "Raw samples and every field: report/report.json.", ""]
    return "\n".join(lines)


def _shape_expr(shape: list, dims_var: str = "dims") -> str:
    parts = [str(d) if isinstance(d, int) else f'{dims_var}["{d}"]' for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def _workload(inputs: ArtifactInputs):
    """The accepted workload, re-read from its manifest (None when there is none or it does not
    load here, e.g. a baseline file it needs is not part of the evidence)."""
    if not inputs.manifest_toml.strip():
        return None
    try:
        from factory.spec import load_manifest

        return load_manifest(inputs.manifest_toml)
    except Exception:  # noqa: BLE001 - the examples then run without the reference check
        try:  # a [baseline] table needs its kernel file: the operator itself does not
            import tomllib

            from factory.spec import load_manifest

            data = tomllib.loads(inputs.manifest_toml)
            data.pop("baseline", None)
            return load_manifest(_dump_toml(data))
        except Exception:  # noqa: BLE001
            return None


def _dump_toml(data: dict) -> str:
    """Enough TOML for a manifest without its [baseline] (tables of scalars and lists, arrays
    of tables of scalars)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for row in v:
                lines.append(f"[[{k}]]")
                lines += [f"{rk} = {value(rv)}" for rk, rv in row.items()]
        else:
            lines.insert(0, f"{k} = {value(v)}")
    for k, table in tables:
        flat = {kk: vv for kk, vv in table.items() if not isinstance(vv, dict)}
        if flat:
            lines.append(f"[{k}]")
            lines += [f"{json.dumps(kk)} = {value(vv)}" for kk, vv in flat.items()]
        for kk, vv in table.items():
            if isinstance(vv, dict):
                lines.append(f"[{k}.{json.dumps(kk)}]")
                lines += [f"{json.dumps(a)} = {value(b)}" for a, b in vv.items()]
    return "\n".join(lines) + "\n"


def _check_dims(inputs: ArtifactInputs) -> dict:
    """The shape the examples launch and check at: the smallest verified one (a float64
    reference of a large matmul would take minutes on a CPU)."""
    rows = [dict(r) for r in list(inputs.shapes) + list(inputs.heldout_shapes)]
    if not rows:
        return {}

    def size(row):
        total = 0
        for t in inputs.inputs + inputs.outputs:
            n = 1
            for d in t["shape"]:
                n *= row.get(d, 1) if isinstance(d, str) else d
            total += n
        return total

    return min(rows, key=size)


_TORCH_UNARY = {
    "neg": "torch.neg",
    "exp": "torch.exp",
    "log": "torch.log",
    "sqrt": "torch.sqrt",
    "rsqrt": "torch.rsqrt",
    "tanh": "torch.tanh",
    "sigmoid": "torch.sigmoid",
    "erf": "torch.erf",
    "abs": "torch.abs",
}
_TORCH_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_TORCH_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_TORCH_REDUCE = {
    "sum": "torch.sum",
    "mean": "torch.mean",
    "max": "torch.amax",
    "min": "torch.amin",
    "prod": "torch.prod",
}
_TORCH_ROUND = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}


# Helper functions reference.py carries when its expressions use them (kept out of the long
# lines of reference() so the file stays readable).
_HELPER_SCAN = '''
def _scan(x, dim, prod, exclusive, reverse):
    """cumsum (or cumprod) along dim; reverse runs from the end, exclusive shifts by one and
    starts from the identity (0 or 1)."""
    if reverse:
        x = x.flip(dim)
    r = torch.cumprod(x, dim) if prod else torch.cumsum(x, dim)
    if exclusive:
        first = torch.full_like(r.narrow(dim, 0, 1), 1.0 if prod else 0.0)
        r = torch.cat([first, r.narrow(dim, 0, r.shape[dim] - 1)], dim)
    return r.flip(dim) if reverse else r
'''
_HELPER_POOL = '''
def _pool(x, window, stride, padding, op):
    """maxpool/avgpool over the trailing len(window) axes: each axis padded on both sides with
    -inf (max) or zeros that the average counts (avg), windows of `window` every `stride`."""
    fill = float("-inf") if op == "max" else 0.0
    pad = []
    for p in reversed(padding):  # torch's pad lists the last axis first
        pad += [p, p]
    x = torch.nn.functional.pad(x, pad, value=fill)
    lead = x.dim() - len(window)
    for k, (size, step) in enumerate(zip(window, stride)):
        x = x.unfold(lead + k, size, step)  # the window goes to a new last axis
    axes = tuple(range(x.dim() - len(window), x.dim()))
    return x.amax(dim=axes) if op == "max" else x.mean(dim=axes)
'''
_HELPER_TAKE = '''
def _take(x, idx, b):
    """x[idx] of a per-head or per-position input (shape (n,) or (B, n)) at broadcast indices;
    b: the batch index, broadcast the same way."""
    idx = idx.long()
    return x[idx] if x.dim() == 1 else x[b, idx]
'''
_HELPER_ATTENTION = '''
def _attention(q, k, v, extra, scale, score, masks, part, block=256):
    """Scaled dot-product attention in float64, query rows `block` at a time. q (B, Hq, S, D),
    k and v (B, Hkv, Skv, D): query head h reads key/value head h // (Hq // Hkv). score(s, i,
    j, h, b, extra) gives the score of query i and key j from s = scale * q[i] . k[j] (None:
    s itself); keys where a mask(...) is false take no weight. part "out": the softmax-weighted
    sum of v (zero for a row with no key kept); "lse": the natural log-sum-exp of the kept
    scores (-inf for such a row)."""
    bsz, hq, sq, _ = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    f64 = dict(dtype=torch.float64, device=q.device)
    b = torch.arange(bsz, device=q.device).view(bsz, 1, 1, 1)
    h = torch.arange(hq, **f64).view(1, hq, 1, 1)
    j = torch.arange(skv, **f64).view(1, 1, 1, skv)
    results = []
    for i0 in range(0, sq, block):
        i1 = min(sq, i0 + block)
        i = torch.arange(i0, i1, **f64).view(1, 1, i1 - i0, 1)
        s = (q[:, :, i0:i1] @ k.transpose(-1, -2)) * scale
        scores = s if score is None else score(s, i, j, h, b, extra)
        keep = torch.ones(s.shape, dtype=torch.bool, device=q.device)
        for mask in masks:
            keep = keep & mask(s, i, j, h, b, extra)
        scores = torch.where(keep, scores, float("-inf"))
        top = scores.amax(dim=-1, keepdim=True)
        kept = torch.isfinite(top)
        top = torch.where(kept, top, 0.0)
        p = torch.exp(scores - top)  # 0 for a key left out
        total = p.sum(dim=-1, keepdim=True)
        if part == "lse":
            results.append(torch.where(kept, top + torch.log(total), float("-inf"))[..., 0])
        else:
            out = (p @ v) / torch.where(total > 0, total, 1.0)
            results.append(torch.where(kept, out, 0.0))
    return torch.cat(results, dim=2)
'''


def _elementwise_rhs(n, names: dict) -> str | None:
    """The torch expression of an elementwise or constant node over its operands' variable
    names (None for another kind of node). Raises ValueError for an op with no torch form."""
    from factory.spec import expr as E

    try:
        if isinstance(n, E.Const):
            return f"torch.tensor({n.value!r}, dtype=torch.float64, device=device)"
        if isinstance(n, E.Unary):
            return f"{_TORCH_UNARY[n.op]}({names[n.x]})"
        if isinstance(n, E.Binary):
            a, b = names[n.a], names[n.b]
            if n.op in ("max", "min"):
                return f"torch.{'maximum' if n.op == 'max' else 'minimum'}({a}, {b})"
            return f"{a} {_TORCH_BINARY[n.op]} {b}"
        if isinstance(n, E.Compare):
            return f"{names[n.a]} {_TORCH_COMPARE[n.op]} {names[n.b]}"
        if isinstance(n, E.Where):
            return f"torch.where({names[n.cond]}, {names[n.a]}, {names[n.b]})"
        if isinstance(n, E.Cast):
            return f"{names[n.x]}.to({_TORCH_ROUND[n.to]}).to(torch.float64)"
    except KeyError as e:
        raise ValueError(f"no torch form for {type(n).__name__} {e.args[0]}") from None
    return None


def _term_function(fname: str, term, extra_names: dict) -> list[str]:
    """A score or mask term of an attention node as a function of the broadcast index tensors
    s, i, j, h (float64), b (the batch index) and the extra inputs by name."""
    from factory.spec import expr as E
    from factory.spec.attention import PLACEHOLDERS

    lines = ["", "", f"def {fname}(s, i, j, h, b, extra):"]
    if any(isinstance(n, E.Const) for n in E.walk(term)):
        lines.append("    device = s.device  # where its constants go")
    names: dict = {}
    for k, n in enumerate(E.walk(term)):
        if isinstance(n, E.Input) and n in PLACEHOLDERS.values():
            names[n] = n.name
            continue
        if isinstance(n, E.Input) and n.name in extra_names:
            names[n] = f"extra[{n.name!r}]"
            continue
        if isinstance(n, E.Gather):
            rhs = f"_take({names[n.x]}, {names[n.idx]}, b)"
        else:
            rhs = _elementwise_rhs(n, names)
            if rhs is None:
                raise ValueError(f"no torch form for {type(n).__name__} in an attention term")
        names[n] = f"t{k}"
        lines.append(f"    t{k} = {rhs}")
    lines.append(f"    return {names[term]}")
    return lines


def _reference_example(w, inputs: ArtifactInputs) -> str:
    """examples/reference.py: the manifest's expressions as float64 torch ops (on any device),
    plus the judge's comparison with the tolerances the kernel was verified with. Raises
    ValueError("no torch form for ...") for an expression node it cannot translate."""
    from factory.spec import expr as E

    header = [
        '"""The workload\'s float64 reference: its manifest (workload.toml) translated back into',
        "torch ops, the same computation the factory's judge checked the kernel against. Runs on",
        'the CPU or the GPU; the loader examples import it."""',
        "import torch",
        "",
        f"TOLERANCES = {json.dumps(inputs.tolerances, sort_keys=True)}",
        f"OUTPUTS = {json.dumps({o.name: o.dtype for o in w.outputs})}",
    ]
    helpers: list[str] = []  # helper sources, each once, in the order first needed
    terms: list[str] = []  # the attention nodes' score and mask functions
    lines = [
        "",
        "",
        "def reference(inputs):",
        '    """{input name: tensor in the kernel\'s dtype} -> {output name: float64 tensor}."""',
        f"    device = inputs[{w.inputs[0].name!r}].device",
    ]

    def need(helper: str) -> None:
        if helper not in helpers:
            helpers.append(helper)

    names: dict = {}
    order = []
    seen = set()
    for o in w.outputs:
        for n in E.walk(o.expr):
            if n not in seen:
                seen.add(n)
                order.append(n)
    for i, n in enumerate(order):
        v = f"v{i}"
        names[n] = v
        rhs = _elementwise_rhs(n, names)
        if rhs is not None:
            pass
        elif isinstance(n, E.Input):
            conv = ".long()" if n.dtype in ("int32", "int64") else ".to(torch.float64)"
            rhs = f"inputs[{n.name!r}]{conv}"
        elif isinstance(n, E.Reduce):
            if n.op not in _TORCH_REDUCE:
                raise ValueError(f"no torch form for Reduce {n.op}")
            rhs = f"{_TORCH_REDUCE[n.op]}({names[n.x]}, dim={n.axis}, keepdim={n.keepdims})"
        elif isinstance(n, E.Gather):
            x, idx = names[n.x], names[n.idx]
            if len(n.idx.shape) == len(n.x.shape):
                rhs = f"torch.gather({x}, -1, {idx})"
            else:
                rhs = f"torch.gather({x}, -1, {idx}.unsqueeze(-1)).squeeze(-1)"
        elif isinstance(n, E.Transpose):
            rhs = f"{names[n.x]}.transpose(-1, -2)"
        elif isinstance(n, E.MatMul):
            rhs = f"torch.matmul({names[n.a]}, {names[n.b]})"
        elif isinstance(n, E.Scan):
            need(_HELPER_SCAN)
            rhs = (
                f"_scan({names[n.x]}, dim={n.axis}, prod={n.op == 'prod'}, "
                f"exclusive={n.exclusive}, reverse={n.reverse})"
            )
        elif isinstance(n, E.ArgReduce):
            fn = {"argmax": "torch.argmax", "argmin": "torch.argmin"}[n.op]
            # torch, as numpy, gives the first index on ties
            rhs = f"{fn}({names[n.x]}, dim={n.axis}, keepdim={n.keepdims})"
        elif isinstance(n, E.Pool):
            if n.op not in ("max", "avg"):
                raise ValueError(f"no torch form for Pool {n.op}")
            need(_HELPER_POOL)
            rhs = (
                f"_pool({names[n.x]}, window={tuple(n.window)!r}, stride={tuple(n.stride)!r}, "
                f"padding={tuple(n.padding)!r}, op={n.op!r})"
            )
        elif isinstance(n, E.Attention):
            need(_HELPER_TAKE)
            need(_HELPER_ATTENTION)
            extra_names = {x.name: names[x] for x in n.extra}
            score = "None"
            if n.score is not None:
                score = f"_score_{i}"
                terms += _term_function(score, n.score, extra_names)
            masks = []
            for m, term in enumerate(n.mask):
                masks.append(f"_mask_{i}_{m}")
                terms += _term_function(masks[-1], term, extra_names)
            extra = "{" + ", ".join(f"{k!r}: {x}" for k, x in extra_names.items()) + "}"
            rhs = "\n        ".join(
                [
                    "_attention(",
                    f"{names[n.q]}, {names[n.k]}, {names[n.v]}, {extra},",
                    f"scale={n.scale!r},",
                    f"score={score},",
                    f"masks=[{', '.join(masks)}],",
                    f"part={n.part!r},",
                ]
            )
            rhs += "\n    )"
        else:
            raise ValueError(f"no torch form for {type(n).__name__}")
        lines.append(f"    {v} = {rhs}")
    result = ", ".join(f"{o.name!r}: {names[o.expr]}" for o in w.outputs)
    lines += [
        f"    return {{{result}}}",
        "",
        "",
        "def compare(name, got, ref, tol):",
        '    """The judge\'s rule: ||got - ref|| / ||ref|| <= rel_norm and |got - ref| <= atol +',
        '    rtol * |ref| everywhere. Prints the verdict; returns True when it passes."""',
        "    got = got.to(torch.float64).cpu()",
        "    ref = ref.to(torch.float64).cpu().expand_as(got)",
        "    err = (got - ref).abs()",
        "    rel = float(err.norm() / ref.norm().clamp_min(1e-30))",
        '    bad = int((err > tol["atol"] + tol["rtol"] * ref.abs()).sum())',
        '    ok = bool(torch.isfinite(got).all()) and rel <= tol["rel_norm"] and bad == 0',
        '    verdict = "matches the reference" if ok else "DOES NOT match the reference"',
        '    print(f"{name}: {verdict} (relative error {rel:.2e}, {bad} elements out of bounds)")',
        "    return ok",
    ]
    body = header
    for helper in helpers:
        body += ["", *helper.rstrip("\n").split("\n")]
    return "\n".join(body + terms + lines) + "\n"


def _random_input_lines(w, indent: str, lib: str, device_suffix: str) -> list[str]:
    """Lines that make each input uniform over its declared range (the judge's draw)."""
    lines = []
    for d in w.inputs:
        shape = _shape_expr(list(d.shape))
        high = f'dims["{d.high}"]' if isinstance(d.high, str) else repr(d.high)
        if lib == "torch":
            if d.dtype in ("int32", "int64"):
                lines.append(
                    f"{indent}{d.name} = torch.randint({int(d.low)}, {high}, {shape}, "
                    f"dtype={TORCH_DTYPES[d.dtype]}){device_suffix}"
                )
            else:
                lines.append(
                    f"{indent}{d.name} = (torch.rand({shape}) * ({d.high!r} - {d.low!r}) + "
                    f"{d.low!r}).to({TORCH_DTYPES[d.dtype]}){device_suffix}"
                )
        else:
            np_dtype = NUMPY_DTYPES[d.dtype]
            if d.dtype in ("int32", "int64"):
                lines.append(
                    f"{indent}{d.name} = rng.integers({int(d.low)}, {high}, size={shape})"
                    f".astype({np_dtype})"
                )
            elif d.dtype == "bf16":
                lines.append(
                    f"{indent}# bf16 travels as its raw 16 bits: the top half of a float32."
                )
                lines.append(
                    f"{indent}{d.name} = ((rng.random({shape}, dtype=np.float32) * "
                    f"np.float32({d.high - d.low!r}) + np.float32({d.low!r}))"
                    ".view(np.uint32) >> 16).astype(np.uint16)"
                )
            else:
                lines.append(
                    f"{indent}{d.name} = (rng.random({shape}) * {d.high - d.low!r} + {d.low!r})"
                    f".astype({np_dtype})"
                )
    return lines


def _cuda_python_example(inputs: ArtifactInputs, w=None, reference: bool = True) -> str:
    """examples/load_cuda_python.py; `reference`: whether examples/reference.py ships (without
    it the example launches and prints, and imports nothing from it)."""
    reference = reference and w is not None
    dims = _check_dims(inputs)
    launch = launch_for_shape(inputs.launch, dims)
    specs = [(t["name"], list(t["shape"]), t["dtype"]) for t in inputs.inputs]
    lines = [
        (
            '"""Load and launch the approved kernel with cuda-python (cuda.core), then compare with'
            if reference
            else '"""Load and launch the approved kernel with cuda-python (cuda.core). No PyTorch'
        ),
        (
            "the workload's reference (examples/reference.py, needs torch; skipped without it). Run"
            if reference
            else "reference is included for this operator: the result is printed, not checked. Run"
        ),
        "from the unpacked artifact folder:",
        "    python examples/load_cuda_python.py",
        "",
        "check_input() is what to call on your own arrays before a launch: the kernel reads raw",
        'memory and cannot tell a wrong dtype, shape or layout from the right one."""',
        "import pathlib",
        "",
        "import numpy as np",
        "",
        "HERE = pathlib.Path(__file__).resolve().parent.parent",
        f"ENTRY = {inputs.entry!r}",
        "# name -> (shape as dim names or sizes, storage dtype); bf16 travels as uint16 bits",
        "INPUTS = {"
        + ", ".join(f"{n!r}: ({s!r}, {NUMPY_DTYPES.get(d, 'np.float32')})" for n, s, d in specs)
        + "}",
        "",
        "",
        "def check_input(name, arr, dims):",
        '    """Refuse an array the kernel cannot take: wrong dtype, wrong shape for `dims`, or',
        '    not C-contiguous (row-major)."""',
        "    shape, dtype = INPUTS[name]",
        "    if not isinstance(arr, np.ndarray):",
        '        raise TypeError(f"{name} must be a numpy array, not {type(arr).__name__}")',
        "    if arr.dtype != dtype:",
        '        raise TypeError(f"{name} must be {np.dtype(dtype).name}, not {arr.dtype}")',
        "    want = tuple(dims[d] if isinstance(d, str) else d for d in shape)",
        "    if arr.shape != want:",
        '        raise ValueError(f"{name} must have shape {want} for {dims}, not {arr.shape}")',
        '    if not arr.flags["C_CONTIGUOUS"]:',
        "        raise ValueError(",
        '            f"{name} must be contiguous (row-major); pass np.ascontiguousarray({name})"',
        "        )",
        "",
        "",
        'if __name__ == "__main__":',
        "    from cuda.bindings import driver",
        "    from cuda.core import Device, LaunchConfig, ObjectCode, launch",
        "",
        f"    dims = {dims!r}",
        "    dev = Device()",
        "    dev.set_current()",
        "    stream = dev.create_stream()",
        '    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)',
        '    cubin = HERE / "cubin" / f"{arch}.cubin"',
        "    # A cubin for this GPU when we built one; otherwise the driver JIT-compiles the PTX.",
        "    code = (",
        "        ObjectCode.from_cubin(cubin.read_bytes())",
        "        if cubin.exists()",
        '        else ObjectCode.from_ptx((HERE / "kernel.ptx").read_text())',
        "    )",
        "    kernel = code.get_kernel(ENTRY)",
        "    rng = np.random.default_rng(0)",
        "",
        "    def to_device(host):",
        "        buf = dev.allocate(host.nbytes, stream=stream)",
        "        stream.sync()",
        "        (err,) = driver.cuMemcpyHtoD(int(buf.handle), host.ctypes.data, host.nbytes)",
        "        assert err == driver.CUresult.CUDA_SUCCESS, err",
        "        return buf",
        "",
    ]
    if w is not None:
        lines += _random_input_lines(w, "    ", "numpy", "")
    else:
        for name, shape, dtype in specs:
            np_dtype = NUMPY_DTYPES.get(dtype, "np.float32")
            shp = _shape_expr(shape)
            if dtype in ("int32", "int64"):
                lines.append(f"    {name} = rng.integers(0, 2, size={shp}).astype({np_dtype})")
            elif dtype == "bf16":
                lines.append("    # bf16 travels as its raw 16 bits: the top half of a float32.")
                lines.append(
                    f"    {name} = (rng.standard_normal({shp}).astype(np.float32)"
                    ".view(np.uint32) >> 16).astype(np.uint16)"
                )
            else:
                lines.append(f"    {name} = rng.standard_normal({shp}).astype({np_dtype})")
    for name, _, _ in specs:
        lines.append(f"    check_input({name!r}, {name}, dims)")
        lines.append(f"    {name}_d = to_device({name})")
    for o in inputs.outputs:
        np_dtype = NUMPY_DTYPES.get(o["dtype"], "np.float32")
        lines.append(f"    {o['name']} = np.empty({_shape_expr(o['shape'])}, dtype={np_dtype})")
        lines.append(f"    {o['name']}_d = dev.allocate({o['name']}.nbytes, stream=stream)")
    args = []
    for p in inputs.params:
        ctor = SCALAR_CTORS.get(p["ptx_type"], "np.uint64")
        if p["kind"] == "tensor":
            args.append(f"{p['name']}_d")
        elif p["kind"] == "dim":
            args.append(f'{ctor}(dims["{p["name"]}"])')
        else:
            args.append(f"{ctor}({p.get('value', 0.0)!r})")
    cluster = f", cluster={tuple(launch['cluster'])}" if launch["cluster"] else ""
    lines += [
        "",
        f"    config = LaunchConfig(grid={tuple(launch['grid'])}, "
        f"block={tuple(launch['block'])}, shmem_size={launch['smem_bytes']}{cluster})",
        f"    launch(stream, config, kernel, {', '.join(args)})",
        "    stream.sync()",
    ]
    for o in inputs.outputs:
        lines += [
            f"    (err,) = driver.cuMemcpyDtoH({o['name']}.ctypes.data, "
            f"int({o['name']}_d.handle), {o['name']}.nbytes)",
            "    assert err == driver.CUresult.CUDA_SUCCESS, err",
            f'    print("{o["name"]}", {o["name"]}.shape, {o["name"]}.ravel()[:4])',
        ]
    if reference:
        host = []
        for d in w.inputs:
            conv = ".view(torch.bfloat16)" if d.dtype == "bf16" else ""
            src = f"{d.name}.view(np.int16)" if d.dtype == "bf16" else d.name
            host.append(f"{d.name!r}: torch.from_numpy({src}){conv}")
        lines += [
            "    try:",
            "        import torch",
            "        from reference import OUTPUTS, TOLERANCES, compare, reference",
            "    except ImportError:",
            '        print("install torch to compare with the reference (examples/reference.py)")',
            "    else:",
            f"        ref = reference({{{', '.join(host)}}})",
            "        ok = True",
        ]
        for o in w.outputs:
            got = f"torch.from_numpy({o.name})"
            if o.dtype == "bf16":
                got = f"torch.from_numpy({o.name}.view(np.int16)).view(torch.bfloat16)"
            lines.append(
                f"        ok &= compare({o.name!r}, {got}, ref[{o.name!r}], "
                f"TOLERANCES[OUTPUTS[{o.name!r}]])"
            )
        lines.append("        assert ok, 'the kernel does not match the reference'")
    return "\n".join(lines) + "\n"


def _torch_example(inputs: ArtifactInputs, w=None, reference: bool = True) -> str:
    """examples/load_torch.py; `reference` as for _cuda_python_example."""
    reference = reference and w is not None
    specs = [(t["name"], list(t["shape"]), t["dtype"]) for t in inputs.inputs]
    in_names = [n for n, _, _ in specs]
    lines = [
        '"""Call the approved kernel on PyTorch tensors, on PyTorch\'s current stream, then',
        "compare with the workload's reference (examples/reference.py). Run from the unpacked"
        if reference
        else "print the result: no PyTorch reference is included for this operator, so nothing",
        "artifact folder: python examples/load_torch.py"
        if reference
        else "is compared. Run from the unpacked artifact folder: python examples/load_torch.py",
        "",
        "Or import it: `from load_torch import run` (with examples/ on sys.path). run() checks",
        "every input (dtype, shape, contiguity, device, alignment) before it launches anything:",
        'the kernel reads raw memory and cannot tell a wrong tensor from the right one."""',
        "import pathlib",
        "",
        "import numpy as np",
        "import torch",
        "",
        "HERE = pathlib.Path(__file__).resolve().parent.parent",
        f"ENTRY = {inputs.entry!r}",
        "# name -> (shape as dim names or sizes, dtype)",
        "INPUTS = {"
        + ", ".join(f"{n!r}: ({s!r}, {TORCH_DTYPES.get(d, 'torch.float32')})" for n, s, d in specs)
        + "}",
        "ALIGNMENT = 16  # bytes: vector loads and the tensor memory accelerator need it",
        "_kernel = None",
        "",
        "",
        "def _ceildiv(a, b):",
        "    return -(-a // b)",
        "",
        "",
        "def _load():",
        '    """The kernel, loaded on first use (the checks below need no GPU)."""',
        "    global _kernel",
        "    if _kernel is None:",
        "        from cuda.core import Device, ObjectCode",
        "",
        "        dev = Device(torch.cuda.current_device())",
        "        dev.set_current()",
        '        arch = "sm_" + "".join(str(x) for x in dev.compute_capability)',
        '        cubin = HERE / "cubin" / f"{arch}.cubin"',
        "        _kernel = (",
        "            ObjectCode.from_cubin(cubin.read_bytes())",
        "            if cubin.exists()",
        '            else ObjectCode.from_ptx((HERE / "kernel.ptx").read_text())',
        "        ).get_kernel(ENTRY)",
        "    return _kernel",
        "",
        "",
        "def check_inputs(tensors, dims):",
        '    """Refuse what the kernel cannot take, with the reason: {name: tensor}, dims as in',
        f'    {inputs.shapes[0] if inputs.shapes else {}!r}."""',
        "    device = None",
        "    for name, (shape, dtype) in INPUTS.items():",
        "        t = tensors[name]",
        "        if not isinstance(t, torch.Tensor):",
        '            raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")',
        "        if t.dtype != dtype:",
        '            raise TypeError(f"{name} must be {dtype}, not {t.dtype}; convert it: '
        '{name}.to({dtype})")',
        "        want = tuple(dims[d] if isinstance(d, str) else d for d in shape)",
        "        if tuple(t.shape) != want:",
        "            raise ValueError(",
        '                f"{name} must have shape {want} for dims {dims}, not {tuple(t.shape)}"',
        "            )",
        "        if not t.is_contiguous():",
        "            raise ValueError(",
        '                f"{name} must be contiguous (row-major); pass {name}.contiguous()"',
        "            )",
        '        if t.device.type != "cuda":',
        '            raise ValueError(f"{name} must be a CUDA tensor, not on {t.device}; pass '
        '{name}.cuda()")',
        "        if device is not None and t.device != device:",
        '            raise ValueError(f"{name} is on {t.device}, the other inputs on {device}")',
        "        if t.data_ptr() % ALIGNMENT:",
        "            raise ValueError(",
        '                f"{name} must start at a {ALIGNMENT}-byte aligned address (a view at an "',
        '                f"offset may not); pass {name}.clone()"',
        "            )",
        "        device = t.device",
        "",
        "",
    ]
    lines.append(f"def run({', '.join(in_names)}, dims):")
    lines.append(
        '    """Inputs: contiguous CUDA tensors of the dtypes above. dims: the dim sizes, e.g. '
        f'{inputs.shapes[0] if inputs.shapes else {}!r}."""'
    )
    lines.append(f"    check_inputs({{{', '.join(f'{n!r}: {n}' for n in in_names)}}}, dims)")
    lines.append("    from cuda.core import LaunchConfig, Stream, launch")
    lines.append("")
    device = f"{in_names[0]}.device" if in_names else '"cuda"'
    for o in inputs.outputs:
        lines.append(
            f"    {o['name']} = torch.empty({_shape_expr(o['shape'])}, "
            f"dtype={TORCH_DTYPES.get(o['dtype'], 'torch.float32')}, device={device})"
        )
    launch = inputs.launch

    def py_expr(e):
        # Launch entries are ints or shape arithmetic over dim names; spell them as Python.
        if isinstance(e, int):
            return str(e)
        out = str(e).replace("ceildiv", "_ceildiv")
        for name in sorted({k for s in inputs.shapes for k in s}, key=len, reverse=True):
            out = _replace_word(out, name, f'dims["{name}"]')
        return out

    grid = ", ".join(py_expr(g) for g in launch["grid"])
    block = ", ".join(py_expr(b) for b in launch["block"])
    smem = py_expr(launch.get("smem_bytes", 0) or 0)
    cluster = (
        ", cluster=(" + ", ".join(py_expr(c) for c in launch["cluster"]) + ")"
        if launch.get("cluster")
        else ""
    )
    args = []
    for p in inputs.params:
        ctor = SCALAR_CTORS.get(p["ptx_type"], "np.uint64")
        if p["kind"] == "tensor":
            args.append(f"np.uint64({p['name']}.data_ptr())")
        elif p["kind"] == "dim":
            args.append(f'{ctor}(dims["{p["name"]}"])')
        else:
            args.append(f"{ctor}({p.get('value', 0.0)!r})")
    lines += [
        f"    config = LaunchConfig(grid=({grid}), block=({block}), shmem_size={smem}{cluster})",
        "    stream = Stream.from_handle(torch.cuda.current_stream().cuda_stream)",
        f"    launch(stream, config, _load(), {', '.join(args)})",
        f"    return {', '.join(o['name'] for o in inputs.outputs)}",
        "",
        "",
        'if __name__ == "__main__":',
        f"    dims = {_check_dims(inputs)!r}",
        "    torch.manual_seed(0)",
    ]
    if w is not None:
        lines += _random_input_lines(w, "    ", "torch", '.to("cuda")')
    else:
        for name, shape, dtype in specs:
            tdtype = TORCH_DTYPES.get(dtype, "torch.float32")
            shp = _shape_expr(shape)
            if dtype in ("int32", "int64"):
                lines.append(f'    {name} = torch.zeros({shp}, dtype={tdtype}, device="cuda")')
            else:
                lines.append(f'    {name} = torch.randn({shp}, device="cuda").to({tdtype})')
    lines += [
        f"    out = run({', '.join(in_names)}, dims)",
        "    torch.cuda.synchronize()",
        '    print("ok", out.shape if isinstance(out, torch.Tensor) else [o.shape for o in out])',
    ]
    if reference:
        outs = [o.name for o in w.outputs]
        lines += [
            "    from reference import OUTPUTS, TOLERANCES, compare, reference",
            "",
            f"    ref = reference({{{', '.join(f'{n!r}: {n}' for n in in_names)}}})",
            "    got = out if isinstance(out, tuple) else (out,)",
            f"    checks = [compare(n, g, ref[n], TOLERANCES[OUTPUTS[n]]) for n, g in zip({outs!r}, got)]",  # noqa: E501
            "    assert all(checks), 'the kernel does not match the reference'",
        ]
    return "\n".join(lines) + "\n"


def _replace_word(text: str, word: str, replacement: str) -> str:
    import re

    return re.sub(rf"(?<![\w\"]){re.escape(word)}(?![\w\"])", replacement, text)


def _install_line(inputs: ArtifactInputs) -> str:
    versions = {
        "cuda-core": inputs.env.get("cuda_core") or INSTALL_DEFAULTS["cuda-core"],
        "cuda-bindings": inputs.env.get("cuda_bindings") or INSTALL_DEFAULTS["cuda-bindings"],
    }
    pins = " ".join(f'"{name}=={version}"' for name, version in versions.items())
    return f"python -m pip install {pins} numpy"


def _readme(
    inputs: ArtifactInputs,
    w,
    cubins: dict,
    checksums: dict[str, str],
    no_reference: str | None = None,
) -> str:
    """README.md. `no_reference`: why examples/reference.py is left out (None: it ships)."""
    has_ref = w is not None and no_reference is None
    first = inputs.shapes[0] if inputs.shapes else {}
    built = [a for a, r in cubins.items() if r["ok"]]
    tensor_rows = [
        f"| {t['name']} | input | {' x '.join(str(d) for d in t['shape']) or 'scalar'} | "
        f"{t['dtype']} |"
        for t in inputs.inputs
    ] + [
        f"| {t['name']} | output | {' x '.join(str(d) for d in t['shape']) or 'scalar'} | "
        f"{t['dtype']} |"
        for t in inputs.outputs
    ]
    verified = {
        json.dumps(v["dims"], sort_keys=True) for v in inputs.verification if v.get("passed")
    }

    def shape_row(dims: dict, kind: str) -> str:
        ok = "yes" if json.dumps(dims, sort_keys=True) in verified else "not recorded"
        launch = launch_for_shape(inputs.launch, dims)
        return (
            f"| {_dims_label(dims)} | {kind} | {ok} | grid {tuple(launch['grid'])}, "
            f"block {tuple(launch['block'])}, {launch['smem_bytes']} B shared |"
        )

    in_names = ", ".join(t["name"] for t in inputs.inputs)
    lines = [
        f"# {inputs.workload_name}: a verified PTX kernel",
        "",
        f"The kernel `{inputs.entry}` computes the workload `{inputs.workload_name}` "
        f"(workload.toml; its operator in words: `{w.description}`)."
        if w is not None and w.description
        else f"The kernel `{inputs.entry}` computes the workload `{inputs.workload_name}` "
        "(workload.toml).",
        f"It was proven correct against the workload's float64 reference and timed on "
        f"{inputs.env.get('gpu', 'the target GPU')} (target {inputs.target}), then approved by "
        f"an engineer: candidate {inputs.candidate_code} of job {inputs.job_code}. The evidence "
        "is in report/REPORT.md and report/report.json.",
        "",
        "## Install",
        "",
        "```sh",
        _install_line(inputs),
        "python -m pip install torch   # for examples/load_torch.py"
        + (" and the reference check" if has_ref else ""),
        "```",
        "",
        f"Files: `kernel.ptx` (the PTX exactly as verified), cubins for {', '.join(built)} "
        "(`cubin/`; on another GPU the driver compiles the PTX), `manifest.json` (entry point, "
        "parameters in order, launch geometry per shape), the loader examples in `examples/`.",
        "",
        "## Tensors, shapes and alignment",
        "",
        "| tensor | role | shape | dtype |",
        "|---|---|---|---|",
        *tensor_rows,
        "",
        "Every tensor is dense and row-major (contiguous), on the GPU, and starts at a 16-byte "
        "aligned address (PyTorch's allocator always gives that; a view at an offset may not). "
        "bf16 data is the raw 16 bits. The loaders check all of this before they launch.",
        "",
        "| shape | timed or held out | verified | launch |",
        "|---|---|---|---|",
        *[shape_row(d, "timed") for d in inputs.shapes],
        *[shape_row(d, "held out (never tuned for)") for d in inputs.heldout_shapes],
        "",
        "The kernel was verified at these shapes only. The launch geometry of any other size "
        "follows from `manifest.json` (`launch`, shape arithmetic over the dims); check such a "
        + (
            "size against the reference (examples/reference.py) before relying on it."
            if has_ref
            else "size against your own reference of the operator before relying on it."
        ),
        "",
        "## Call it from PyTorch",
        "",
        "```python",
        "import sys; sys.path.insert(0, 'examples')",
        "from load_torch import run",
        "",
        f"out = run({in_names}, dims={first!r})   # checks dtype, shape, contiguity, device",
        "```",
        "",
        "`python examples/load_torch.py` launches it on random inputs drawn as the judge draws "
        "them and compares the result with the reference, with the tolerances the kernel was "
        "verified with."
        if has_ref
        else "`python examples/load_torch.py` launches it on random inputs and prints the result "
        "(no reference to compare with: see below).",
        "",
        "## Call it from cuda-python",
        "",
        "`python examples/load_cuda_python.py` loads the cubin for your GPU (or the PTX), "
        "uploads numpy arrays, launches with `cuda.core.launch` and "
        + ("compares with the reference. " if has_ref else "prints the result. ")
        + "Its `check_input()` is the check to run on your own arrays.",
        "",
    ]
    if has_ref:
        lines += [
            "## The reference",
            "",
            "`examples/reference.py` is the workload's manifest translated back into float64 torch "
            "ops: the computation the judge compared the kernel with.",
            "",
        ]
    else:
        lines += [
            "## The reference",
            "",
            "No PyTorch reference is included for this operator "
            f"({no_reference or 'there is no manifest to translate'}), so the loader examples "
            "launch the kernel without checking its result. The kernel itself was verified "
            "against the factory's float64 reference (report/REPORT.md).",
            "",
        ]
    lines += [
        "## Checksums",
        "",
        "sha256 of every file (SHA256SUMS lists them too, with this README; verify with "
        "`sha256sum -c SHA256SUMS`):",
        "",
        "```",
        *[f"{digest}  {path}" for path, digest in checksums.items()],
        "```",
        "",
    ]
    return "\n".join(lines)


def build_artifact(
    inputs: ArtifactInputs,
    *,
    archs: Iterable[str] = DEFAULT_ARCHS,
    compile_fn: Callable | None = None,
    created_at: str = "",
) -> BuiltArtifact:
    """Build the zip. `compile_fn(ptx, arch)` returns a CompileReport (factory.compile.compile_ptx
    by default); an architecture that fails to compile is recorded in manifest.json and left out
    of the zip. Raises ValueError when not even the target architecture compiles, because an
    artifact without a cubin for the GPU it was verified on is not the thing that was approved."""
    cubins, cubin_reports = _compile_all(inputs.ptx, archs, compile_fn)
    if inputs.target not in cubins:
        raise ValueError(
            f"the approved PTX does not compile for its target {inputs.target}: "
            f"{cubin_reports.get(inputs.target, {}).get('log', 'not attempted')}"
        )
    ptx_bytes = inputs.ptx.encode()
    speedups = _speedups(inputs)
    workload = _workload(inputs)
    manifest = {
        "artifact_format": ARTIFACT_FORMAT,
        "name": inputs.workload_name,
        "workload": inputs.workload_code,
        "job": inputs.job_code,
        "candidate": inputs.candidate_code,
        "created_at": created_at,
        "target": inputs.target,
        "entry": inputs.entry,
        "ptx": {"file": "kernel.ptx", "sha256": _sha256(ptx_bytes)},
        "cubins": cubin_reports,
        "params": inputs.params,
        "launch": inputs.launch,
        "launch_per_shape": [launch_for_shape(inputs.launch, d) for d in inputs.shapes],
        "launch_heldout_shapes": [
            launch_for_shape(inputs.launch, d) for d in inputs.heldout_shapes
        ],
        "inputs": inputs.inputs,
        "outputs": inputs.outputs,
        "tolerances": inputs.tolerances,
        "versions": {
            "driver": inputs.env.get("driver"),
            "nvjitlink": inputs.env.get("nvjitlink")
            or next((r["nvjitlink_version"] for r in cubin_reports.values() if r["ok"]), None),
            "cuda_core": inputs.env.get("cuda_core"),
            "cuda_bindings": inputs.env.get("cuda_bindings"),
            "torch": inputs.env.get("torch"),
            "triton": inputs.env.get("triton"),
            "harness": inputs.harness_version,
        },
        "environment": inputs.env,
        "lineage": inputs.lineage,
        "review": inputs.review,
    }
    report = {
        "artifact_format": ARTIFACT_FORMAT,
        "candidate": inputs.candidate_code,
        "environment": inputs.env,
        "copy_ceiling_tbps": inputs.copy_ceiling_tbps,
        "verification": inputs.verification,
        "timing": inputs.timing,
        "baselines": inputs.baselines,
        "speedups": speedups,
        "flags": inputs.flags,
    }
    files: dict[str, bytes] = {
        "kernel.ptx": ptx_bytes,
        **{f"cubin/{arch}.cubin": data for arch, data in sorted(cubins.items())},
        "manifest.json": (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode(),
        "workload.toml": inputs.manifest_toml.encode(),
        "report/report.json": (json.dumps(report, indent=2) + "\n").encode(),
        "report/REPORT.md": _report_markdown(inputs, speedups, cubin_reports).encode(),
    }
    reference_py, no_reference = None, "the workload's manifest does not load here"
    if workload is not None:
        try:
            reference_py = _reference_example(workload, inputs)
        except ValueError as e:  # a node kind with no torch form: the artifact ships without it
            no_reference = str(e)
    has_ref = reference_py is not None
    files["examples/load_cuda_python.py"] = _cuda_python_example(inputs, workload, has_ref).encode()
    files["examples/load_torch.py"] = _torch_example(inputs, workload, has_ref).encode()
    if has_ref:
        files["examples/reference.py"] = reference_py.encode()
    # The README lists the checksums of every file above; SHA256SUMS then covers the README too.
    files["README.md"] = _readme(
        inputs,
        workload,
        cubin_reports,
        {p: _sha256(d) for p, d in files.items()},
        no_reference=None if has_ref else no_reference,
    ).encode()
    checksums = {path: _sha256(data) for path, data in files.items()}
    files["SHA256SUMS"] = "".join(f"{h}  {p}\n" for p, h in checksums.items()).encode()

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    data = buffer.getvalue()
    return BuiltArtifact(data=data, sha256=_sha256(data), files=checksums, cubins=cubin_reports)


def verify_checksums(zip_bytes: bytes) -> list[str]:
    """Check a built zip against its own SHA256SUMS; returns the problems (empty when sound).
    Used by the tests and by the download view's self-check."""
    problems = []
    with zipfile.ZipFile(io.BytesIO(zip_bytes)) as archive:
        names = set(archive.namelist())
        if "SHA256SUMS" not in names:
            return ["SHA256SUMS is missing"]
        listed = set()
        for line in archive.read("SHA256SUMS").decode().splitlines():
            digest, _, path = line.partition("  ")
            listed.add(path)
            if path not in names:
                problems.append(f"{path}: listed but missing")
            elif _sha256(archive.read(path)) != digest:
                problems.append(f"{path}: checksum mismatch")
        for path in names - listed - {"SHA256SUMS"}:
            problems.append(f"{path}: not listed in SHA256SUMS")
    return problems
