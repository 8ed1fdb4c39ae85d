"""Compile an attention kernel's PTX as a whole program with the CUDA toolkit's ptxas.

nvJitLink compiles PTX as a relocatable unit and then ignores `setmaxnreg` (ptxas's C7504:
"'setmaxnreg' ignored to maintain compatibility across compilation units"), so every thread of
the CTA keeps the entry's register count (168 with two consumer warpgroups) and the producer
warpgroup's registers never move to the consumers. ptxas compiling the same PTX as a whole
program honours it: the producer drops to PRODUCER_REGS and each consumer thread may use
`consumer_regs()` (232 with two consumers). This module runs ptxas where the toolkit is
installed (the GPU hosts have it under /usr/local/cuda/bin) and returns the same CompileReport
as factory.compile.compile_ptx, so a caller can use either.

`PTXF_WHOLE_PROGRAM=1` (`whole_program_enabled`, read at each use) turns it on for the factory:
the GPU worker compiles PTX that uses setmaxnreg with ptxas (`choose_compiler`, then
gpuworker.runner._compile) and the attention space admits the schedules that fit only when
setmaxnreg is honoured (schedule.whole_program). Off (the default), nvJitLink compiles
everything and the space keeps to what fits the launch register count.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache

from factory.compile import CompileReport, parse_resource_log

PTXAS_DIRS = ("/usr/local/cuda/bin", "/usr/local/cuda-13.0/bin")

WHOLE_PROGRAM_VAR = "PTXF_WHOLE_PROGRAM"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
# the instruction (after a label or a predicate too), not the word in a comment
_SETMAXNREG = re.compile(r"(?<![\w$.])setmaxnreg\.")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)

COMPILER_WHOLE = "ptxas-whole"
COMPILER_NVJITLINK = "nvjitlink"


def whole_program_enabled(environ=None) -> bool:
    """Whether PTXF_WHOLE_PROGRAM is on ("1"; also true/yes/on) in `environ` (os.environ),
    read now, not at import. Unset, empty or "0" (also false/no/off) is off; anything else is a
    ValueError that names the variable, not a silent default."""
    env = os.environ if environ is None else environ
    value = str(env.get(WHOLE_PROGRAM_VAR, "")).strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{WHOLE_PROGRAM_VAR}={env.get(WHOLE_PROGRAM_VAR)!r}: expected 1 or 0")


def uses_setmaxnreg(ptx: str) -> bool:
    """Whether `ptx` issues setmaxnreg (what a relocatable compile ignores)."""
    return "setmaxnreg" in ptx and _SETMAXNREG.search(_COMMENT.sub(" ", ptx)) is not None


def choose_compiler(ptx: str, environ=None) -> tuple[str, str | None, str]:
    """(compiler, ptxas path, note) for the GPU worker: (COMPILER_WHOLE, path, "") when
    PTXF_WHOLE_PROGRAM is on, `ptx` uses setmaxnreg and ptxas is found; else
    (COMPILER_NVJITLINK, None, note), the note saying why where the setting asked for ptxas
    (empty when the setting is off or the PTX has no setmaxnreg)."""
    if not whole_program_enabled(environ) or not uses_setmaxnreg(ptx):
        return COMPILER_NVJITLINK, None, ""
    ptxas = find_ptxas()
    if ptxas is None:
        return (
            COMPILER_NVJITLINK,
            None,
            f"{WHOLE_PROGRAM_VAR}=1 but no ptxas found (PATH, {', '.join(PTXAS_DIRS)}): "
            "compiled by nvJitLink, which ignores setmaxnreg",
        )
    return COMPILER_WHOLE, ptxas, ""


def find_ptxas() -> str | None:
    """The ptxas on PATH, else in the usual toolkit folders; None when there is none."""
    found = shutil.which("ptxas")
    if found:
        return found
    for d in PTXAS_DIRS:
        path = os.path.join(d, "ptxas")
        if os.access(path, os.X_OK):
            return path
    return None


def compile_whole(ptx: str, arch: str = "sm_90a", ptxas: str | None = None) -> CompileReport:
    """`ptx` compiled by ptxas as a whole program (not relocatable) for `arch`, with the
    verbose resource report parsed. A report with ok False and the reason in `log` when ptxas
    is missing or refuses the PTX."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        return CompileReport(ok=False, arch=arch, log="no ptxas found (CUDA toolkit absent)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attn_ptxas_") as tmp:
        src, dst = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w", encoding="utf-8") as f:
            f.write(ptx)
        try:
            proc = subprocess.run(
                [ptxas, f"-arch={arch}", "-v", src, "-o", dst],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.SubprocessError) as e:  # a report, never a raise
            return CompileReport(ok=False, arch=arch, log=f"ptxas did not run ({ptxas}): {e}")
        cubin = None
        if proc.returncode == 0 and os.path.exists(dst):
            with open(dst, "rb") as f:
                cubin = f.read()
    log = (proc.stderr + proc.stdout).strip()
    version = _ptxas_version(ptxas)
    entries = parse_resource_log(log)
    report = CompileReport(
        ok=cubin is not None,
        arch=arch,
        log=log,
        cubin=cubin,
        compile_ms=round((time.perf_counter() - start) * 1e3, 3),
        nvjitlink_version=f"ptxas {version}".strip(),
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


@lru_cache(maxsize=8)
def _ptxas_version(ptxas: str) -> str:
    """The last line of `ptxas --version` ("Cuda compilation tools, release 13.0, ..."), or ""."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def setmaxnreg_ignored(report: CompileReport) -> bool:
    """Whether ptxas said it ignored setmaxnreg (C7504, C7508 and kin name it)."""
    return any("setmaxnreg" in line and "ignored" in line for line in report.log.splitlines())


@lru_cache(maxsize=256)
def _whole(ptx: str, ptxas: str) -> CompileReport:
    return compile_whole(ptx, "sm_90a", ptxas)


def compile_reports(ptxs: list[str]) -> list[CompileReport]:
    """factory.emit.hopper.compile_reports (nvJitLink, the family's review compiles), except
    that each PTX the GPU worker would compile with ptxas (`choose_compiler`: the setting on,
    setmaxnreg, ptxas found here) is compiled by ptxas as a whole program, as the worker will:
    with nvJitLink's report the reviewer would turn away, for its spills, every schedule that
    fits only where setmaxnreg is honoured. With the setting off this is hopper's function."""
    from concurrent.futures import ThreadPoolExecutor

    from factory.emit.hopper import compile_reports as jit_reports

    whole = {}
    for p in dict.fromkeys(ptxs):
        compiler, ptxas, _ = choose_compiler(p)
        if compiler == COMPILER_WHOLE:
            whole[p] = ptxas
    if not whole:
        return jit_reports(ptxs)
    if len(whole) > 1:  # ptxas runs as its own process: side by side
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(whole))) as pool:
            list(pool.map(lambda item: _whole(*item), whole.items()))
    rest = [p for p in ptxs if p not in whole]
    jit = dict(zip(rest, jit_reports(rest), strict=True))
    return [_whole(p, whole[p]) if p in whole else jit[p] for p in ptxs]
