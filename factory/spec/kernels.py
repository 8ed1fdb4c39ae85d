"""Customer baseline kernels: PTX checks, and CUDA C compiled to PTX by NVRTC in a sandbox.

PTX is text; we check the header directives (`.version` <= 9.0, a known `.target`,
`.address_size 64`) and parse the `.entry` signatures so a manifest's parameter bindings can be
checked against the kernel. CUDA C is compiled in a child process (wall-clock timeout, CPU,
memory and file-size limits, a fresh empty working folder, no include paths). Before compiling,
every `#include` except the fp16/bf16 headers is refused: NVRTC reads any file named by an
absolute path and quotes it in its errors. The compiler log is filtered to messages that point
into the customer's own source, so it can never show another file's contents."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
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

# Every pattern here is linear in the input: no `\s*` that can cross lines at each line start, no
# lazy `.*?` that rescans the rest of the file for every unclosed comment.
_VERSION = re.compile(r"^[ \t]*\.version[ \t]+(\d{1,3})\.(\d{1,3})[ \t]*$", re.M)
_TARGET = re.compile(r"^[ \t]*\.target[ \t]+([^\n]{1,200}?)[ \t]*$", re.M)
_ADDRESS_SIZE = re.compile(r"^[ \t]*\.address_size[ \t]+(\d{1,3})[ \t]*$", re.M)
_ENTRY_HEAD = re.compile(
    r"((?:\.(?:visible|weak|extern)[ \t\n]+){0,3})\.entry[ \t\n]+([A-Za-z_$%][\w$%]{0,1023})"
)
_PARAM_TYPE = re.compile(r"\.([usbf](?:8|16|32|64))\b")


class AmbiguousSource(ValueError):
    """A quote whose meaning depends on C++ lexing details (digit separator or prefixed
    character literal)."""


def strip_comments(text: str, *, strict: bool = False) -> str:
    """Replace // and /* */ comments by a space, leaving string and character literals alone
    (a comment marker inside a literal is not a comment). One linear pass; an unclosed comment
    runs to the end; a literal ends at its closing quote or at the end of the line. With
    `strict`, a ' right after a letter or digit (1'000, L'x') raises AmbiguousSource: whether it
    opens a literal decides what is a comment, and a wrong guess could hide a directive."""
    out: list[str] = []
    i, n, start = 0, len(text), 0
    special = re.compile(r"[\"'/]")
    while True:
        m = special.search(text, i)
        if m is None:
            break
        k = m.start()
        c = text[k]
        if c == "/":
            nxt = text[k + 1 : k + 2]
            if nxt == "/":
                end = text.find("\n", k)
                end = n if end < 0 else end
            elif nxt == "*":
                end = text.find("*/", k + 2)
                end = n if end < 0 else end + 2
            else:
                i = k + 1
                continue
            out.append(text[start:k])
            out.append(" ")
            i = start = end
            continue
        # A string or character literal: skip to the matching unescaped quote on this line.
        if strict and c == "'" and k > 0 and (text[k - 1].isalnum() or text[k - 1] == "_"):
            line = text.count("\n", 0, k) + 1
            raise AmbiguousSource(f"line {line}: digit separators and prefixed character "
                                  "literals (1'000, L'x') are not allowed")  # fmt: skip
        j = k + 1
        while j < n and text[j] != c and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        i = min(j + 1, n)
    out.append(text[start:])
    return "".join(out)


def parse_ptx(ptx: str, field: str = "ptx") -> PtxInfo:
    """Parse the header directives and entry signatures of PTX text. Raises SpecError."""
    if len(ptx) > MAX_PTX_BYTES:
        raise SpecError([(field, f"PTX is larger than {MAX_PTX_BYTES} bytes")])
    if not ptx.isascii():
        raise SpecError([(field, "PTX must be ASCII text")])
    body = strip_comments(ptx)
    errors = []
    versions = _VERSION.findall(body)
    targets = _TARGET.findall(body)
    sizes = _ADDRESS_SIZE.findall(body)
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
    pos = 0
    while len(entries) <= 10_000:
        m = _ENTRY_HEAD.search(body, pos)
        if m is None:
            break
        pos = m.end()
        rest = body[pos : pos + 1 + 64].lstrip()
        params: list[str] = []
        if rest.startswith("("):
            open_at = body.index("(", pos)
            close_at = body.find(")", open_at)
            if close_at < 0:
                errors.append((field, f"entry {m.group(2)[:64]}: parameter list is not closed"))
                break  # no ')' anywhere after this point: nothing more to parse
            for p in body[open_at + 1 : close_at].split(","):
                p = p.strip()
                if p:
                    t = _PARAM_TYPE.search(p)
                    params.append("array" if "[" in p or t is None else t.group(1))
            pos = close_at + 1
        entries[m.group(2)] = PtxEntry(m.group(2), ".visible" in m.group(1), tuple(params))
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

# The include scan runs on the source as the preprocessor sees it: trigraphs refused, lines
# spliced, comments removed (string literals respected), then every line that starts with '#' or
# the digraph '%:' is a directive. Raw string literals are refused: telling them apart from an
# identifier ending in R needs a real lexer, and kernels have no use for them.
_DIRECTIVE_LINE = re.compile(r"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*([A-Za-z_]\w{0,31})?(.*)$", re.M)
_FILE_DIRECTIVES = ("include", "include_next", "import", "embed")
_ALLOWED_INCLUDE = re.compile(r"^[ \t]*(?:<([\w.]{1,64})>|\"([\w.]{1,64})\")[ \t]*$")
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>-]")


def check_cuda_includes(source: str, field: str = "baseline.source") -> None:
    """Refuse every include but <cuda_fp16.h> and <cuda_bf16.h>, before any compiler runs."""
    errors = []
    if _TRIGRAPH.search(source):
        errors.append((field, "trigraphs (??=, ??/, ...) are not allowed"))
    spliced = re.sub(r"\\[ \t]*\r?\n", "", source)
    if 'R"' in spliced:
        errors.append((field, 'raw string literals (R"...") are not allowed'))
    for word in ("__has_include", "__has_embed"):
        if word in spliced:
            errors.append((field, f"{word} is not allowed"))
    try:
        code = strip_comments(spliced, strict=True)
    except AmbiguousSource as e:
        raise SpecError([*errors, (field, str(e))]) from None
    # Two views: the lexed code, and the raw lines (in case the lexer and the compiler ever
    # disagree about where a comment starts). A directive must pass in both.
    views = [code, spliced]
    for m in (m for view in views for m in _DIRECTIVE_LINE.finditer(view)):
        word = m.group(1) or ""
        if word not in _FILE_DIRECTIVES:
            continue
        line = m.string.count("\n", 0, m.start()) + 1
        if word != "include":
            errors.append((field, f"line {line}: #{word} is not allowed"))
            continue
        ok = _ALLOWED_INCLUDE.match(re.sub(r"//.*$|/\*.*?\*/", " ", m.group(2)[:512]))
        name = ok and (ok.group(1) or ok.group(2))
        if not ok or name not in ALLOWED_INCLUDES:
            errors.append(
                (field, f"line {line}: only #include <cuda_fp16.h> and <cuda_bf16.h> are allowed "
                        "(no paths, no other files)")
            )  # fmt: skip
        if len(errors) >= 20:
            break
    if errors:
        raise SpecError(list(dict.fromkeys(errors))[:20])


def _header_dirs() -> list[Path]:
    """Where NVIDIA's fp16/bf16 headers are: $PTXF_CUDA_INCLUDE, $CUDA_HOME/include, the CUDA
    toolkit, or an nvidia-* wheel's include folder. (The NVRTC 13.0 wheel does not build them
    in, despite older documentation; they are handed to NVRTC in memory, never as a path.)"""
    candidates = [
        os.environ.get("PTXF_CUDA_INCLUDE"),
        os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "include"),
        "/usr/local/cuda/include",
    ]
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for base in (spec.submodule_search_locations or []) if spec else []:
            candidates.extend(str(p.parent) for p in Path(base).glob("*/include/cuda_bf16.h"))
    except (ImportError, ValueError, OSError):
        pass
    return [Path(c) for c in candidates if c and Path(c, "cuda_bf16.h").is_file()]


def _headers_for(source: str) -> dict[str, str]:
    if not any(h in source for h in ALLOWED_INCLUDES):
        return {}
    dirs = _header_dirs()
    if not dirs:
        raise SpecError(
            [("baseline.source", "cuda_fp16.h/cuda_bf16.h are not available on this server; "
                                 "use unsigned short for bf16 data and convert with bit shifts")]
        )  # fmt: skip
    headers = {}
    for name in _HEADER_FILES:
        for d in (dirs[0], dirs[0] / "cccl"):
            p = d / name
            if p.is_file():
                headers[name] = p.read_text(encoding="utf-8", errors="replace")
                break
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
    key = (hashlib.sha256(source.encode("utf-8")).hexdigest(), target)
    if key in _COMPILED:  # the same upload validated twice (outside and inside a transaction)
        return _COMPILED[key]
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
    env["PTXF_NVRTC_PARENT"] = str(os.getpid())  # the child dies with us (_nvrtc_child.py)
    with _compile_slot(field), tempfile.TemporaryDirectory(prefix="ptxf-nvrtc-") as work:
        try:
            proc = subprocess.Popen(
                [os.environ.get("PTXF_PYTHON") or sys.executable, "-I", str(child)],
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
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[key] = result["ptx"]
    return result["ptx"]


# Successful compiles of this process, by (sha256 of the source, target), oldest first.
_COMPILED: dict[tuple[str, str], str] = {}
_COMPILED_MAX = 32


@contextlib.contextmanager
def _compile_slot(field: str):
    """One of PTXF_NVRTC_SLOTS (2) compile slots shared by every process of this machine
    (flock on files under PTXF_NVRTC_SLOT_DIR), so concurrent uploads cannot run more compilers
    than that; an upload that finds none free within PTXF_NVRTC_WAIT_S (10) seconds is refused
    with a message instead of queueing behind a compile bomb."""
    import fcntl

    slots = max(1, int(os.environ.get("PTXF_NVRTC_SLOTS") or 2))
    wait_s = float(os.environ.get("PTXF_NVRTC_WAIT_S") or 10)
    folder = Path(
        os.environ.get("PTXF_NVRTC_SLOT_DIR")
        or Path(tempfile.gettempdir()) / f"ptxf-nvrtc-slots-{os.getuid()}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for index in range(slots):
            handle = open(folder / f"slot{index}", "a")  # noqa: SIM115 - held while compiling
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        if time.monotonic() >= deadline:
            raise SpecError(
                [(field, "the CUDA compiler is busy with other uploads: try again in a minute")]
            )
        time.sleep(0.1)
