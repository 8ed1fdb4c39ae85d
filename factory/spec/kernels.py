"""Customer baseline kernels: PTX checks, and CUDA C compiled to PTX by NVRTC in a sandbox.

PTX is text; we check the header directives (`.version` <= 9.0, a known `.target`,
`.address_size 64`) and parse the `.entry` signatures so a manifest's parameter bindings can be
checked against the kernel. CUDA C is compiled in a child process (wall-clock timeout, CPU,
memory and file-size limits, a fresh empty working folder, no include paths). Before compiling,
every `#include` except the fp16/bf16 headers is refused: NVRTC reads any file named by an
absolute path and quotes it in its errors. The compiler log is filtered to messages that point
into the customer's own source, so it can never show another file's contents."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from factory.spec.dims import eval_dim_expr
from factory.spec.limits import (
    MAX_KERNEL_PARAMS,
    MAX_KERNEL_SOURCE_BYTES,
    MAX_PTX_BYTES,
    NVRTC_TIMEOUT_S,
)
from factory.spec.types import KernelParam, Launch, SpecError

MAX_SOURCE_BYTES = MAX_KERNEL_SOURCE_BYTES
MAX_PARAMS = MAX_KERNEL_PARAMS
MAX_PTX_VERSION = (9, 0)
PTX_TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100")
# The oldest PTX ISA that knows each target (PTX ISA release notes).
_MIN_VERSION_FOR_TARGET = {
    "sm_80": (7, 0), "sm_86": (7, 1), "sm_89": (7, 8), "sm_90": (7, 8), "sm_90a": (8, 0),
    "sm_100": (8, 6),
}  # fmt: skip

# Which PTX parameter types each binding kind accepts, and which declared PTX types match.
PARAM_TYPES = {"tensor": ("u64",), "dim": ("u32", "s32", "u64", "s64"), "scalar": ("f32", "f64")}
_COMPATIBLE = {
    "u64": {"u64", "s64", "b64"},
    "s64": {"u64", "s64", "b64"},
    "u32": {"u32", "s32", "b32"},
    "s32": {"u32", "s32", "b32"},
    "f32": {"f32", "b32"},
    "f64": {"f64", "b64"},
}

# Hardware limits for the launch checks (sm_90 and sm_100 agree on these).
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_SMEM_BYTES = 227 * 1024  # dynamic shared memory per block, opted in
MAX_CLUSTER_BLOCKS = 8  # portable cluster size

CUDA_SOURCE_NAME = "kernel.cu"
ALLOWED_INCLUDES = ("cuda_fp16.h", "cuda_bf16.h")
# NVIDIA's headers that the two allowed ones pull in, handed to NVRTC in memory.
_HEADER_FILES = (
    "cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp", "vector_types.h",
    "vector_functions.h", "vector_functions.hpp", "nv/target", "nv/detail/__target_macros",
    "nv/detail/__preprocessor",
)  # fmt: skip


@dataclass(frozen=True)
class PtxEntry:
    name: str
    visible: bool
    param_types: tuple[str, ...]  # "u64", "f32", ... or "array" for a by-value aggregate


@dataclass(frozen=True)
class PtxInfo:
    version: tuple[int, int]
    target: str
    address_size: int
    entries: dict[str, PtxEntry]


# -- PTX -----------------------------------------------------------------------------------------

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ENTRY = re.compile(
    r"(?P<vis>(?:\.(?:visible|weak|extern)\s+)*)\.entry\s+(?P<name>[A-Za-z_$%][\w$%]*)\s*"
    r"(?:\((?P<params>[^)]*)\))?"
)
_PARAM_TYPE = re.compile(r"\.([usbf](?:8|16|32|64))\b")


def parse_ptx(ptx: str, field: str = "ptx") -> PtxInfo:
    """Parse the header directives and entry signatures of PTX text. Raises SpecError."""
    if len(ptx) > MAX_PTX_BYTES:
        raise SpecError([(field, f"PTX is larger than {MAX_PTX_BYTES} bytes")])
    if not ptx.isascii():
        raise SpecError([(field, "PTX must be ASCII text")])
    body = _COMMENTS.sub(" ", ptx)
    errors = []
    versions = re.findall(r"^\s*\.version\s+(\d{1,3})\.(\d{1,3})\s*$", body, re.M)
    targets = re.findall(r"^\s*\.target\s+([^\n]+?)\s*$", body, re.M)
    sizes = re.findall(r"^\s*\.address_size\s+(\d+)\s*$", body, re.M)
    version = (0, 0)
    if len(versions) != 1:
        errors.append((field, "PTX must have exactly one `.version X.Y` directive"))
    else:
        version = (int(versions[0][0]), int(versions[0][1]))
    target = ""
    if len(targets) != 1:
        errors.append((field, "PTX must have exactly one `.target` directive"))
    else:
        target = targets[0].split(",")[0].strip()
    address_size = int(sizes[0]) if len(sizes) == 1 else 0
    entries: dict[str, PtxEntry] = {}
    for m in _ENTRY.finditer(body):
        params = []
        for p in (m.group("params") or "").split(","):
            p = p.strip()
            if not p:
                continue
            t = _PARAM_TYPE.search(p)
            params.append("array" if "[" in p or t is None else t.group(1))
        entries[m.group("name")] = PtxEntry(
            m.group("name"), ".visible" in (m.group("vis") or ""), tuple(params)
        )
    if errors:
        raise SpecError(errors)
    return PtxInfo(version, target, address_size, entries)


def check_ptx(ptx: str, *, target: str = "sm_90", field: str = "ptx") -> PtxInfo:
    """Parse PTX and check it can run on `target` ("sm_90" or "sm_100"): `.version` <= 9.0, a
    known `.target` no newer than the workload's, `.address_size 64`, at least one visible
    entry. Raises SpecError listing every problem."""
    info = parse_ptx(ptx, field)
    errors = []
    if info.version > MAX_PTX_VERSION:
        errors.append(
            (field, f".version {info.version[0]}.{info.version[1]} is newer than the supported "
                    f"{MAX_PTX_VERSION[0]}.{MAX_PTX_VERSION[1]} (CUDA 13.0)")
        )  # fmt: skip
    if info.target not in PTX_TARGETS:
        errors.append(
            (field, f".target {info.target[:20]!r} is not one of {', '.join(PTX_TARGETS)}")
        )
    else:
        if info.version < _MIN_VERSION_FOR_TARGET[info.target]:
            errors.append((field, f".version is too old for .target {info.target}"))
        if _sm_number(info.target) > _sm_number(target):
            errors.append((field, f".target {info.target} cannot run on the workload's {target}"))
        if info.target.endswith("a") and info.target[:-1] != target:
            errors.append((field, f".target {info.target} runs only on {info.target[:-1]}"))
    if info.address_size != 64:
        errors.append((field, "PTX must declare `.address_size 64`"))
    if not any(e.visible for e in info.entries.values()):
        errors.append((field, "PTX has no `.visible .entry` kernel"))
    if errors:
        raise SpecError(errors)
    return info


def _sm_number(arch: str) -> int:
    return int(re.sub(r"\D", "", arch) or 0)


def check_entry(info: PtxInfo, entry: str, params: tuple[KernelParam, ...], errors) -> None:
    """Check the manifest's parameter bindings against the entry's signature; add problems to
    `errors` (anything with .add(field, problem))."""
    e = info.entries.get(entry)
    if e is None or not e.visible:
        names = ", ".join(sorted(n for n, x in info.entries.items() if x.visible))[:200]
        errors.add("baseline.entry", f"no visible entry {entry!r} in the kernel (found: {names})")
        return
    if len(e.param_types) != len(params):
        errors.add(
            "baseline.params",
            f"entry {entry} takes {len(e.param_types)} parameters; the manifest binds "
            f"{len(params)}",
        )
        return
    for i, (declared, p) in enumerate(zip(e.param_types, params, strict=True)):
        if declared == "array" or declared not in _COMPATIBLE[p.ptx_type]:
            errors.add(
                f"baseline.params[{i}].ptx_type",
                f"is {p.ptx_type} but parameter {i} of {entry} is .{declared}",
            )


def launch_problems(launch: Launch, dims: dict[str, int]) -> list[str]:
    """What is wrong with `launch` at `dims` (empty when it is a valid launch)."""
    problems = []
    try:
        grid = [eval_dim_expr(g, dims) for g in launch.grid]
        smem = eval_dim_expr(launch.smem_bytes, dims)
    except SpecError as e:
        return [e.errors[0][1]]
    for axis, (g, limit) in enumerate(zip(grid, MAX_GRID, strict=True)):
        if not 1 <= g <= limit:
            problems.append(f"grid[{axis}] = {g} is outside 1..{limit}")
    for axis, (b, limit) in enumerate(zip(launch.block, MAX_BLOCK, strict=True)):
        if not 1 <= b <= limit:
            problems.append(f"block[{axis}] = {b} is outside 1..{limit}")
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        problems.append(f"a block of {threads} threads is above {MAX_THREADS_PER_BLOCK}")
    if not 0 <= smem <= MAX_SMEM_BYTES:
        problems.append(f"smem_bytes = {smem} is outside 0..{MAX_SMEM_BYTES}")
    if launch.cluster is not None:
        c = launch.cluster
        if c[0] * c[1] * c[2] > MAX_CLUSTER_BLOCKS:
            problems.append(f"a cluster of more than {MAX_CLUSTER_BLOCKS} blocks")
        elif any(g % k for g, k in zip(grid, c, strict=True)):
            problems.append("the grid is not a multiple of the cluster shape")
    return problems


# -- CUDA C --------------------------------------------------------------------------------------

# A directive starts with '#', the digraph '%:' or the trigraph '??='; comments may sit between it
# and the keyword. Lines are spliced first, so "#inc\<newline>lude" is caught too. The scan is
# deliberately blunt: it also matches inside strings and comments, and refuses those too.
_DIRECTIVE = re.compile(
    r"(?:#|%:|\?\?=)(?:[ \t\f\v]|/\*.*?\*/)*(include_next|include|import|embed)\b"
    r"(?P<rest>[^\n]*)",
    re.S,
)
_ALLOWED_INCLUDE = re.compile(r"^[ \t]*(?:<([\w.]+)>|\"([\w.]+)\")[ \t]*(?://[^\n]*)?$")


def check_cuda_includes(source: str, field: str = "baseline.source") -> None:
    """Refuse every include but <cuda_fp16.h> and <cuda_bf16.h>, before any compiler runs."""
    spliced = re.sub(r"\\[ \t]*\r?\n", "", source)
    errors = []
    for m in _DIRECTIVE.finditer(spliced):
        line = spliced.count("\n", 0, m.start()) + 1
        if m.group(1) != "include":
            errors.append((field, f"line {line}: #{m.group(1)} is not allowed"))
            continue
        ok = _ALLOWED_INCLUDE.match(m.group("rest"))
        name = ok and (ok.group(1) or ok.group(2))
        if not ok or name not in ALLOWED_INCLUDES:
            errors.append(
                (field, f"line {line}: only #include <cuda_fp16.h> and <cuda_bf16.h> are allowed "
                        "(no paths, no other files)")
            )  # fmt: skip
    if "__has_include" in spliced:
        errors.append((field, "__has_include is not allowed"))
    if errors:
        raise SpecError(errors[:20])


def _header_dir() -> Path | None:
    for candidate in (
        os.environ.get("PTXF_CUDA_INCLUDE"),
        os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "include"),
        "/usr/local/cuda/include",
    ):
        if candidate and Path(candidate, "cuda_bf16.h").is_file():
            return Path(candidate)
    return None


def _headers_for(source: str) -> dict[str, str]:
    if not any(h in source for h in ALLOWED_INCLUDES):
        return {}
    d = _header_dir()
    if d is None:
        raise SpecError(
            [("baseline.source", "cuda_fp16.h/cuda_bf16.h are not available on this server; "
                                 "use unsigned short for bf16 data and convert with bit shifts")]
        )  # fmt: skip
    headers = {}
    for name in _HEADER_FILES:
        p = d / name
        if p.is_file():
            headers[name] = p.read_text(encoding="utf-8", errors="replace")
    return headers


_LOG_LINE = re.compile(
    r"^"
    + re.escape(CUDA_SOURCE_NAME)
    + r"\((\d+)\): (error|warning|catastrophic error)[^:]*: ?(.*)$"
)


def filter_log(log: str, source: str) -> list[str]:
    """Only messages that point into the customer's own file, with the customer's own line
    quoted back; everything else (other files, NVRTC's source echo) is counted, not shown."""
    lines = source.splitlines()
    shown, hidden = [], 0
    for raw in log.splitlines():
        m = _LOG_LINE.match(raw.strip())
        if not m:
            continue
        n = int(m.group(1))
        message = m.group(3)[:300]
        quoted = lines[n - 1].strip()[:200] if 1 <= n <= len(lines) else ""
        shown.append(f"line {n}: {m.group(2)}: {message}" + (f"  [{quoted}]" if quoted else ""))
    hidden = sum(1 for raw in log.splitlines() if re.search(r"\): (error|warning)", raw)) - len(
        shown
    )
    if hidden > 0:
        shown.append(f"({hidden} more messages from outside your file were hidden)")
    return shown[:30]


def compile_cuda(source: str, *, target: str = "sm_90", timeout_s: float = NVRTC_TIMEOUT_S) -> str:
    """Compile customer CUDA C to PTX for `target` with NVRTC in a sandboxed child process.

    Returns the PTX text. Raises SpecError (field "baseline.source") for refused includes, a
    compile error (filtered log), a timeout or a crash of the compiler."""
    field = "baseline.source"
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        raise SpecError([(field, f"is larger than {MAX_SOURCE_BYTES} bytes")])
    check_cuda_includes(source, field)
    request = json.dumps(
        {
            "source": source,
            "name": CUDA_SOURCE_NAME,
            "arch": target.removeprefix("sm_"),
            "headers": _headers_for(source),
        }
    )
    child = Path(__file__).with_name("_nvrtc_child.py")
    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "CUDA_PATH") if k in os.environ}
    with tempfile.TemporaryDirectory(prefix="ptxf-nvrtc-") as work:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(child)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=env,
                start_new_session=True,
            )
        except OSError:
            raise SpecError([(field, "the CUDA compiler could not be started")]) from None
        try:
            out, _ = proc.communicate(request.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise SpecError([(field, f"compiling took longer than {timeout_s:g} s")]) from None
    if proc.returncode != 0 or len(out) > MAX_PTX_BYTES * 2:
        raise SpecError([(field, "the CUDA compiler failed (out of memory or time?)")])
    try:
        result = json.loads(out)
    except ValueError:
        raise SpecError([(field, "the CUDA compiler failed")]) from None
    if not result.get("ok"):
        messages = filter_log(result.get("log", ""), source) or ["compilation failed"]
        raise SpecError([(field, m) for m in messages])
    return result["ptx"]
