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
    examples/load_cuda_python.py, examples/load_torch.py
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
            f"{'yes' if v.get('passed') else 'NO'} | {v.get('rel_err', 0):.3g} | "
            f"{v.get('max_abs_err', 0):.3g} |"
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
            f"| {_dims_label(t['dims'])} | {t['median_us']:.3f} | "
            f"{t.get('ci_low_us', 0):.3f}–{t.get('ci_high_us', 0):.3f} | "
            f"{t.get('tbps', 0):.2f} | {len(t.get('samples_us', []))} |"
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


def _cuda_python_example(inputs: ArtifactInputs) -> str:
    dims = inputs.shapes[0] if inputs.shapes else {}
    launch = launch_for_shape(inputs.launch, dims)
    lines = [
        '"""Load and launch the approved kernel with cuda-python (cuda.core), on the first',
        "benchmarked shape. Run from the unpacked artifact folder:",
        "    python examples/load_cuda_python.py",
        '"""',
        "import pathlib",
        "",
        "import numpy as np",
        "from cuda.bindings import driver",
        "from cuda.core import Device, LaunchConfig, ObjectCode, launch",
        "",
        "HERE = pathlib.Path(__file__).resolve().parent.parent",
        f"ENTRY = {inputs.entry!r}",
        f"dims = {dims!r}",
        "",
        "dev = Device()",
        "dev.set_current()",
        "stream = dev.create_stream()",
        'arch = "sm_" + "".join(str(x) for x in dev.compute_capability)',
        'cubin = HERE / "cubin" / f"{arch}.cubin"',
        "# A cubin for this GPU when we built one; otherwise the driver JIT-compiles the PTX.",
        "code = (",
        "    ObjectCode.from_cubin(cubin.read_bytes())",
        "    if cubin.exists()",
        '    else ObjectCode.from_ptx((HERE / "kernel.ptx").read_text())',
        ")",
        "kernel = code.get_kernel(ENTRY)",
        "rng = np.random.default_rng(0)",
        "",
        "",
        "def to_device(host):",
        "    buf = dev.allocate(host.nbytes, stream=stream)",
        "    stream.sync()",
        "    (err,) = driver.cuMemcpyHtoD(int(buf.handle), host.ctypes.data, host.nbytes)",
        "    assert err == driver.CUresult.CUDA_SUCCESS, err",
        "    return buf",
        "",
        "",
    ]
    for t in inputs.inputs:
        np_dtype = NUMPY_DTYPES.get(t["dtype"], "np.float32")
        shape = _shape_expr(t["shape"])
        if t["dtype"] in ("int32", "int64"):
            lines.append(f"{t['name']} = rng.integers(0, 2, size={shape}).astype({np_dtype})")
        elif t["dtype"] == "bf16":
            lines.append("# bf16 travels as its raw 16 bits: the top half of a float32.")
            lines.append(
                f"{t['name']} = (rng.standard_normal({shape}).astype(np.float32)"
                ".view(np.uint32) >> 16).astype(np.uint16)"
            )
        else:
            lines.append(f"{t['name']} = rng.standard_normal({shape}).astype({np_dtype})")
        lines.append(f"{t['name']}_d = to_device({t['name']})")
    for o in inputs.outputs:
        np_dtype = NUMPY_DTYPES.get(o["dtype"], "np.float32")
        lines.append(f"{o['name']} = np.empty({_shape_expr(o['shape'])}, dtype={np_dtype})")
        lines.append(f"{o['name']}_d = dev.allocate({o['name']}.nbytes, stream=stream)")
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
        f"config = LaunchConfig(grid={tuple(launch['grid'])}, block={tuple(launch['block'])}, "
        f"shmem_size={launch['smem_bytes']}{cluster})",
        f"launch(stream, config, kernel, {', '.join(args)})",
        "stream.sync()",
    ]
    for o in inputs.outputs:
        lines += [
            f"(err,) = driver.cuMemcpyDtoH({o['name']}.ctypes.data, int({o['name']}_d.handle), "
            f"{o['name']}.nbytes)",
            "assert err == driver.CUresult.CUDA_SUCCESS, err",
            f'print("{o["name"]}", {o["name"]}.shape, {o["name"]}.ravel()[:4])',
        ]
    return "\n".join(lines) + "\n"


def _torch_example(inputs: ArtifactInputs) -> str:
    lines = [
        '"""Call the approved kernel on PyTorch tensors, on PyTorch\'s current stream.',
        "Run from the unpacked artifact folder: python examples/load_torch.py",
        '"""',
        "import pathlib",
        "",
        "import numpy as np",
        "import torch",
        "from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch",
        "",
        "HERE = pathlib.Path(__file__).resolve().parent.parent",
        f"ENTRY = {inputs.entry!r}",
        "_dev = Device(torch.cuda.current_device())",
        "_dev.set_current()",
        '_arch = "sm_" + "".join(str(x) for x in _dev.compute_capability)',
        '_cubin = HERE / "cubin" / f"{_arch}.cubin"',
        "_kernel = (",
        "    ObjectCode.from_cubin(_cubin.read_bytes())",
        "    if _cubin.exists()",
        '    else ObjectCode.from_ptx((HERE / "kernel.ptx").read_text())',
        ").get_kernel(ENTRY)",
        "",
        "",
        "def _ceildiv(a, b):",
        "    return -(-a // b)",
        "",
        "",
    ]
    in_names = [t["name"] for t in inputs.inputs]
    lines.append(f"def run({', '.join(in_names)}, dims):")
    lines.append(
        '    """Inputs: contiguous CUDA tensors. dims: the dim sizes, e.g. '
        f'{inputs.shapes[0] if inputs.shapes else {}!r}."""'
    )
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
        f"    launch(stream, config, _kernel, {', '.join(args)})",
        f"    return {', '.join(o['name'] for o in inputs.outputs)}",
        "",
        "",
        'if __name__ == "__main__":',
        f"    dims = {inputs.shapes[0] if inputs.shapes else {}!r}",
    ]
    for t in inputs.inputs:
        tdtype = TORCH_DTYPES.get(t["dtype"], "torch.float32")
        shape = _shape_expr(t["shape"])
        if t["dtype"] in ("int32", "int64"):
            lines.append(f'    {t["name"]} = torch.zeros({shape}, dtype={tdtype}, device="cuda")')
        else:
            lines.append(f'    {t["name"]} = torch.randn({shape}, device="cuda").to({tdtype})')
    lines += [
        f"    out = run({', '.join(in_names)}, dims)",
        "    torch.cuda.synchronize()",
        '    print("ok", out.shape if isinstance(out, torch.Tensor) else [o.shape for o in out])',
    ]
    return "\n".join(lines) + "\n"


def _replace_word(text: str, word: str, replacement: str) -> str:
    import re

    return re.sub(rf"(?<![\w\"]){re.escape(word)}(?![\w\"])", replacement, text)


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
        "examples/load_cuda_python.py": _cuda_python_example(inputs).encode(),
        "examples/load_torch.py": _torch_example(inputs).encode(),
    }
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
