"""The lab's CUDA kernels (lab/kernels/*.cu) as PTX: generated PTX is not committed, so each is
compiled with nvcc on first use (and again when its source is newer)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def ptx_path(name: str, arch: str = "sm_90") -> Path:
    """lab/kernels/<name>.ptx, made from <name>.cu (`nvcc -ptx -arch=sm_90`) where it is missing
    or older than its source."""
    cu, out = KERNELS / f"{name}.cu", KERNELS / f"{name}.ptx"
    if out.exists() and out.stat().st_mtime >= cu.stat().st_mtime:
        return out
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError(f"{out} is not built and there is no nvcc here to build it from {cu}")
    cmd = [nvcc, "-ptx", f"-arch={arch}", cu.name, "-o", out.name]
    subprocess.run(cmd, cwd=KERNELS, check=True)
    return out
