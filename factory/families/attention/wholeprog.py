"""Compile an attention kernel's PTX as a whole program with the CUDA toolkit's ptxas.

nvJitLink compiles PTX as a relocatable unit and then ignores `setmaxnreg` (ptxas's C7504:
"'setmaxnreg' ignored to maintain compatibility across compilation units"), so every thread of
the CTA keeps the entry's register count (168 with two consumer warpgroups) and the producer
warpgroup's registers never move to the consumers. ptxas compiling the same PTX as a whole
program honours it: the producer drops to PRODUCER_REGS and each consumer thread may use
`consumer_regs()` (232 with two consumers). This module runs ptxas where the toolkit is
installed (the GPU hosts have it under /usr/local/cuda/bin) and returns the same CompileReport
as factory.compile.compile_ptx, so a caller can use either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from factory.compile import CompileReport, parse_resource_log

PTXAS_DIRS = ("/usr/local/cuda/bin", "/usr/local/cuda-13.0/bin")


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
        proc = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", src, "-o", dst],
            capture_output=True,
            text=True,
            timeout=300,
        )
        cubin = None
        if proc.returncode == 0 and os.path.exists(dst):
            with open(dst, "rb") as f:
                cubin = f.read()
    log = (proc.stderr + proc.stdout).strip()
    version = ""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        pass
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


def setmaxnreg_ignored(report: CompileReport) -> bool:
    """Whether ptxas said it ignored setmaxnreg (C7504, C7508 and kin name it)."""
    return any("setmaxnreg" in line and "ignored" in line for line in report.log.splitlines())
