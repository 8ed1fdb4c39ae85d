"""PTX -> cubin through nvJitLink, with the resource report parsed into data.

nvJitLink is the same compiler the driver's JIT uses (13.0.88 on the H200 hosts), and it runs on a
machine without a GPU, so every candidate is compiled and inspected on the CPU before it costs any
GPU time. `compile_ptx` never raises on bad PTX: the report says `ok=False` and carries the log
(with ptxas line numbers); `rejection_reason` says why a report that compiled must still be
dropped before it is timed (local memory, too many registers for the block, too much smem).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from factory.device import SM_90, device_for

# The static checks' limits, from the device records (factory.device).
REGISTER_FILE_PER_SM = SM_90.registers_per_sm  # 32-bit registers per SM
MAX_REGISTERS_PER_THREAD = SM_90.max_registers_per_thread
MAX_SMEM_PER_BLOCK_BYTES = {
    arch: device_for(arch).smem_per_block_bytes for arch in ("sm_90", "sm_90a", "sm_100")
}


@dataclass
class EntryResources:
    """Resources of one `.entry` as ptxas reports them."""

    name: str
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0  # static shared memory declared by the kernel (not the driver reserve)
    barriers: int = 0
    cmem_bytes: int = 0


@dataclass
class CompileReport:
    """What compiling one PTX text produced. Resource fields describe the first entry (our
    kernels have exactly one); `entries` has them all. `cubin` is None when `ok` is False."""

    ok: bool
    arch: str
    log: str = ""
    cubin: bytes | None = None
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    smem_bytes: int = 0
    barriers: int = 0
    compile_ms: float = 0.0  # what compiling took, also when this report came from the cache
    nvjitlink_version: str = ""
    entries: list[EntryResources] = field(default_factory=list)
    cached: bool = False  # read back from the compile cache, not compiled by this call

    def to_dict(self) -> dict:
        """JSON-ready form; the cubin is summarised by its size, never embedded."""
        d = asdict(self)
        d.pop("cubin")
        d["cubin_bytes"] = len(self.cubin) if self.cubin else 0
        return d


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_BARRIERS = re.compile(r"used (\d+) barriers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_resource_log(log: str) -> list[EntryResources]:
    """Parse ptxas's `-verbose` lines ("ptxas info : Used 30 registers, used 1 barriers, 1024
    bytes smem, 380 bytes cmem[0]") into one record per entry, in the order compiled."""
    entries: list[EntryResources] = []
    current: EntryResources | None = None
    for line in log.splitlines():
        if not line.startswith("ptxas"):
            continue  # the linker's own "info :" summary repeats the data with driver smem added
        m = _PTXAS_ENTRY.search(line)
        if m:
            current = EntryResources(name=m.group(1))
            entries.append(current)
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            current.stack_bytes = int(m.group(1))
            current.spill_store_bytes = int(m.group(2))
            current.spill_load_bytes = int(m.group(3))
            continue
        m = _PTXAS_USED.search(line)
        if m:
            current.registers = int(m.group(1))
            b = _PTXAS_BARRIERS.search(line)
            current.barriers = int(b.group(1)) if b else 0
            s = _PTXAS_SMEM.search(line)
            current.smem_bytes = int(s.group(1)) if s else 0
            c = _PTXAS_CMEM.search(line)
            current.cmem_bytes = int(c.group(1)) if c else 0
    if not entries:
        entries = _parse_linker_summary(log)
    return entries


_LINK_FUNC = re.compile(r"Function properties for '([^']+)'")
_LINK_USED = re.compile(
    r"used (\d+) registers, used (\d+) barriers, (\d+) stack, (\d+) bytes smem, "
    r"(\d+) bytes cmem\[0\], (\d+) bytes lmem"
)
# The linker's summary counts the 1 KB of shared memory the driver reserves per block on sm_90.
_DRIVER_SMEM_BYTES = 1024


def _parse_linker_summary(log: str) -> list[EntryResources]:
    """Fallback when no ptxas lines came through: the linker's own per-function summary."""
    entries: list[EntryResources] = []
    current = None
    for line in log.splitlines():
        m = _LINK_FUNC.search(line)
        if m:
            current = EntryResources(name=m.group(1))
            entries.append(current)
            continue
        m = _LINK_USED.search(line)
        if m and current is not None:
            regs, bars, stack, smem, cmem, _lmem = (int(x) for x in m.groups())
            current.registers, current.barriers, current.stack_bytes = regs, bars, stack
            current.smem_bytes = max(0, smem - _DRIVER_SMEM_BYTES)
            current.cmem_bytes = cmem
    return entries


def _read_log(getter_size, getter, handle) -> str:
    try:
        n = getter_size(handle)
    except Exception:  # noqa: BLE001 - a broken handle simply has no log to show
        return ""
    if n <= 1:
        return ""
    buf = bytearray(n)
    getter(handle, buf)
    return bytes(buf).rstrip(b"\x00").decode("utf-8", errors="replace")


# --- the compile cache ----------------------------------------------------------------------------
# The same PTX is compiled again and again: the agents screen the seed layouts of a job in every
# worker process, the build stage compiles every candidate the agents already compiled, and a
# job run again on a workload starts from the same seeds. Compiling is deterministic for a given
# PTX text, architecture, options and nvJitLink version, so a report is kept on disk under the
# hash of those and read back instead (a few ms instead of 40-200 ms a kernel). Off unless a
# directory is configured (`configure_cache`, or PTXF_COMPILE_CACHE in the environment).

CACHE_FORMAT = 1
CACHE_MAX_ENTRIES = 5_000  # 70 KB a report with its cubin: about 350 MB at the most
_CACHE_PRUNE_EVERY = 200  # writes between two counts of the directory
_cache_dir: Path | None = None
_cache_configured = False
_cache_writes = 0
_cache_lock = threading.Lock()


def configure_cache(path: str | os.PathLike | None) -> None:
    """Keep compile reports under `path` (created when first written); None turns the cache
    off. Without a call, PTXF_COMPILE_CACHE in the environment names the directory."""
    global _cache_dir, _cache_configured
    _cache_dir = Path(path) if path else None
    _cache_configured = True


def cache_dir() -> Path | None:
    if not _cache_configured:
        return (
            Path(os.environ["PTXF_COMPILE_CACHE"]) if os.environ.get("PTXF_COMPILE_CACHE") else None
        )
    return _cache_dir


def _cache_path(root: Path, ptx: str, arch: str, opts: list[str], version: str) -> Path:
    h = hashlib.sha256()
    for part in (f"format {CACHE_FORMAT}", version, arch, "\0".join(opts), ptx):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    key = h.hexdigest()
    return root / key[:2] / f"{key}.json"


def _cache_read(path: Path) -> CompileReport | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = [EntryResources(**e) for e in data.pop("entries")]
        cubin = data.pop("cubin_b64")
        report = CompileReport(**data, entries=entries)
        report.cubin = base64.b64decode(cubin) if cubin is not None else None
    except (OSError, ValueError, TypeError, KeyError):  # absent, torn or from another format
        return None
    report.cached = True
    return report


def _cache_write(root: Path, path: Path, report: CompileReport) -> None:
    """Write atomically (a reader sees the whole file or none); a failure to write costs only
    the saving, never the compile."""
    global _cache_writes
    data = asdict(report)
    data.pop("cached")
    data.pop("cubin")
    data["cubin_b64"] = base64.b64encode(report.cubin).decode() if report.cubin else None
    try:
        write_atomically(path, json.dumps(data).encode("utf-8"))
    except OSError:
        return
    with _cache_lock:
        _cache_writes += 1
        prune = _cache_writes % _CACHE_PRUNE_EVERY == 0
    if prune:
        prune_cache(root)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the whole file or none (another process may
    be writing the same name); raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remove_oldest(files: list[Path], keep: int) -> int:
    """Remove all but the `keep` most recently modified of `files`; returns how many went (a
    file another process removed first is not counted)."""
    try:
        aged = sorted((f.stat().st_mtime, f) for f in files)
    except OSError:
        return 0
    removed = 0
    for _, f in aged[: max(0, len(aged) - keep)]:
        try:
            f.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def prune_cache(root: Path, max_entries: int = CACHE_MAX_ENTRIES) -> int:
    """Remove the least recently written reports beyond 80% of `max_entries` once the cache
    holds more than `max_entries`. Returns how many were removed."""
    files = list(root.glob("??/*.json"))
    if len(files) <= max_entries:
        return 0
    return remove_oldest(files, int(max_entries * 0.8))


_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+)([af]?)\b", re.MULTILINE)


def target_arch(ptx: str, arch: str) -> str:
    """`arch`, or its chip-specific variant ("sm_90" -> "sm_90a") where the PTX's `.target`
    asks for that variant on the same chip: instructions such as wgmma and setmaxnreg exist only
    there, and nvJitLink refuses to link such PTX for the portable arch."""
    m = _TARGET.search(ptx)
    if m and m.group(2) and m.group(1) == arch:
        return arch + m.group(2)
    return arch


def compile_ptx(
    ptx: str, arch: str = "sm_90", options: tuple[str, ...] = (), *, cache: bool = True
) -> CompileReport:
    """Compile `ptx` for `arch` ("sm_90", "sm_90a", "sm_100") into a cubin with nvJitLink.

    Always returns a report: on bad PTX `ok` is False and `log` holds ptxas's errors with line
    numbers. Extra `options` are passed to nvJitLink as is (e.g. "-maxrregcount=64" is spelled
    "-Xptxas=-maxrregcount=64"). `compile_ms` is host wall time for the whole link. With a cache
    directory configured, a PTX text compiled before (same arch, options and nvJitLink) is read
    back from it (`cached` is then True); `cache=False` compiles afresh and keeps nothing (the
    cubin a GPU worker times and the one an artifact ships come from the PTX itself).
    """
    arch = target_arch(ptx, arch)
    try:
        from cuda.bindings import nvjitlink as nj
    except ImportError as exc:  # the wheel is a pinned dependency; say so rather than crash
        return CompileReport(ok=False, arch=arch, log=f"nvJitLink is not installed: {exc}")

    opts = [f"-arch={arch}", "-verbose", *options]
    version = ".".join(str(v) for v in nj.version())
    root = cache_dir() if cache else None
    if root is not None:
        path = _cache_path(root, ptx, arch, opts, version)
        hit = _cache_read(path)
        if hit is not None:
            return hit
    report = _link(nj, ptx, arch, opts, version)
    if root is not None:
        _cache_write(root, path, report)
    return report


def _link(nj, ptx: str, arch: str, opts: list[str], version: str) -> CompileReport:
    start = time.perf_counter()
    try:
        handle = nj.create(len(opts), opts)
    except Exception as exc:  # noqa: BLE001 - bad options are a report, not a crash
        return CompileReport(ok=False, arch=arch, log=f"nvJitLink refused the options: {exc}")
    try:
        data = ptx.encode("utf-8")
        ok = True
        try:
            nj.add_data(handle, nj.InputType.PTX, data, len(data), "kernel.ptx")
            nj.complete(handle)
        except nj.nvJitLinkError:
            ok = False
        info = _read_log(nj.get_info_log_size, nj.get_info_log, handle)
        error = _read_log(nj.get_error_log_size, nj.get_error_log, handle)
        cubin = None
        if ok:
            size = nj.get_linked_cubin_size(handle)
            buf = bytearray(size)
            nj.get_linked_cubin(handle, buf)
            cubin = bytes(buf)
    finally:
        nj.destroy(handle)
    compile_ms = (time.perf_counter() - start) * 1e3

    log = "\n".join(x for x in (error, info) if x)
    entries = parse_resource_log(info)
    report = CompileReport(
        ok=ok,
        arch=arch,
        log=log,
        cubin=cubin,
        compile_ms=round(compile_ms, 3),
        nvjitlink_version=version,
        entries=entries,
    )
    if entries:
        first = entries[0]
        report.registers = first.registers
        report.spill_store_bytes = first.spill_store_bytes
        report.spill_load_bytes = first.spill_load_bytes
        report.stack_bytes = first.stack_bytes
        report.smem_bytes = first.smem_bytes
        report.barriers = first.barriers
    return report


def rejection_reason(
    report: CompileReport, threads_per_block: int | None = None, dynamic_smem_bytes: int = 0
) -> str:
    """Why a compiled candidate must not be sent to a GPU, or "" when it may go.

    Rejects: a failed compile; any spill or stack frame (local memory is slow device memory, and
    our kernels never need it); a block whose registers exceed one SM's 64K register file (it
    could not launch); static + dynamic shared memory over the per-block limit of the arch.
    """
    if not report.ok:
        first = report.log.strip().splitlines()[:1]
        return f"compile error: {first[0] if first else 'unknown'}"
    if report.spill_store_bytes or report.spill_load_bytes:
        return (
            f"register spills: {report.spill_store_bytes} bytes stored, "
            f"{report.spill_load_bytes} bytes loaded"
        )
    if report.stack_bytes:
        return f"stack frame of {report.stack_bytes} bytes (local memory)"
    if threads_per_block:
        # Registers are allocated per warp in units of 256 (8 per thread, rounded up).
        regs_per_thread = -(-max(report.registers, 1) // 8) * 8
        warps = -(-threads_per_block // 32)
        if regs_per_thread * 32 * warps > REGISTER_FILE_PER_SM:
            return (
                f"{report.registers} registers x {threads_per_block} threads exceeds the "
                f"{REGISTER_FILE_PER_SM}-register file"
            )
    limit = MAX_SMEM_PER_BLOCK_BYTES.get(report.arch, 48 * 1024)
    total_smem = report.smem_bytes + dynamic_smem_bytes
    if total_smem > limit:
        return (
            f"{total_smem} bytes of shared memory exceeds the {limit}-byte limit on {report.arch}"
        )
    return ""
