"""Hardware facts per compilation target, in one record.

Every module that sizes a grid, checks a resource or draws a roofline reads these records rather
than keeping constants of its own. Figures are for the cards the factory is lent: the H100 SXM
and the H200 share the sm_90 chip (132 SMs, the same tensor cores); the H200's HBM3e is faster.
Bandwidths are the measured device-to-device copy ceilings, not datasheet numbers: a kernel's
honest roofline is what a copy reaches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One target's resources. Units are in the names."""

    arch: str  # "sm_90"
    name: str
    sms: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int  # 32-bit registers in one SM's file
    max_registers_per_thread: int
    smem_per_block_bytes: int  # dynamic shared memory one block may opt in to
    smem_per_sm_bytes: int
    l2_bytes: int
    copy_bytes_per_us: float  # measured copy ceiling, bytes read + written per microsecond
    peak_bf16_flops_per_us: float  # dense tensor-core peak (bf16/fp16 in, fp32 accumulate)
    peak_fp32_flops_per_us: float  # CUDA-core fp32 FMA peak
    launch_floor_us: float = 2.0  # a launch's fixed cost as the timer sees it

    def copy_tbps(self) -> float:
        return self.copy_bytes_per_us / 1e6


# sm_90: H200 figures (its copy ceiling 4.28 TB/s measured 2026-12-02); the H100's is ~3.0 TB/s
# (2026-12-07). Dense bf16 peak 989 TFLOP/s on both; fp32 FMA 67 TFLOP/s.
SM_90 = Device(
    arch="sm_90",
    name="NVIDIA H200 / H100 SXM (Hopper)",
    sms=132,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    registers_per_sm=65536,
    max_registers_per_thread=255,
    smem_per_block_bytes=227 * 1024,
    smem_per_sm_bytes=228 * 1024,
    l2_bytes=50 * 1024 * 1024,
    copy_bytes_per_us=4.3e6,
    peak_bf16_flops_per_us=989e6,
    peak_fp32_flops_per_us=67e6,
)

# sm_100 (B200): emitted for and compiled, never yet run here; figures from the datasheet class.
SM_100 = Device(
    arch="sm_100",
    name="NVIDIA B200 (Blackwell)",
    sms=148,
    max_threads_per_block=1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    registers_per_sm=65536,
    max_registers_per_thread=255,
    smem_per_block_bytes=227 * 1024,
    smem_per_sm_bytes=228 * 1024,
    l2_bytes=126 * 1024 * 1024,
    copy_bytes_per_us=7.0e6,
    peak_bf16_flops_per_us=2250e6,
    peak_fp32_flops_per_us=80e6,
)

_BY_ARCH = {"sm_90": SM_90, "sm_90a": SM_90, "sm_100": SM_100, "sm_100a": SM_100}


def device_for(arch: str | None) -> Device:
    """The record of `arch` ("sm_90", "sm_90a", ...); sm_90 when None. Raises KeyError naming the
    known targets for anything else."""
    if arch is None:
        return SM_90
    try:
        return _BY_ARCH[arch]
    except KeyError:
        raise KeyError(f"no device record for {arch!r}; known: {', '.join(_BY_ARCH)}") from None


DEFAULT = SM_90
