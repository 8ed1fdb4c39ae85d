"""Thin, checked wrappers over the CUDA driver for the worker's child process.

Memory is plain device memory (cuMemAlloc: never managed memory), copies and fills go through the
driver, kernels are loaded and launched with cuda.core. Nothing here runs at import time: CUDA is
initialised only when `open_device` is called, and only ever in the worker's child process.
"""

from __future__ import annotations

import os

import numpy as np

DTYPE_CODES = {"fp32": 0, "bf16": 1, "fp16": 2, "int32": 3, "int64": 4}
NUMPY_STORAGE = {
    "fp32": np.float32,
    "bf16": np.uint16,
    "fp16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
}
# The quiet-NaN bit pattern a kernel must overwrite: every element it fails to write stays NaN.
POISON = {"fp32": (4, 0x7FC00000), "bf16": (2, 0x7FC0), "fp16": (2, 0x7E00)}
# Integer outputs cannot hold NaN; an unlikely byte pattern stands in.
INT_POISON_BYTE = 0xA7
OUTPUT_GUARD_BYTE = 0x5A  # a stray write into the guard changes this pattern
INPUT_GUARD_BYTE = 0xFF  # NaN in every float format: a read past the end poisons the result
GUARD_BYTES = 1 << 20
ALIGN = 256


class CudaError(RuntimeError):
    """A CUDA driver call failed. `sticky` errors leave the context unusable."""

    STICKY = {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_UNKNOWN",
    }

    def __init__(self, name: str, where: str):
        self.name = name
        self.where = where
        self.sticky = name in self.STICKY
        super().__init__(f"{name} in {where}")


def _cu():
    from cuda.bindings import driver

    return driver


def check(result, where: str = "cuda"):
    """Unpack a cuda.bindings result tuple, raising CudaError on failure."""
    cu = _cu()
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise CudaError(name.decode() if isinstance(name, bytes) else str(err), where)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


class DeviceMemory:
    """One plain device allocation; `ptr` is the address as an int."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self._ptr = check(_cu().cuMemAlloc(self.nbytes), "cuMemAlloc")
        self.ptr = int(self._ptr)

    def free(self):
        if self._ptr is not None:
            check(_cu().cuMemFree(self._ptr), "cuMemFree")
            self._ptr = None


class GuardedTensor:
    """A tensor with guard bytes on both sides: [guard][data, padded][guard]."""

    def __init__(self, nbytes: int, guard_byte: int, guard_bytes: int = GUARD_BYTES):
        self.data_bytes = int(nbytes)
        self.guard_bytes = guard_bytes
        self.guard_byte = guard_byte
        self.padded = align_up(max(self.data_bytes, 1))
        self.mem = DeviceMemory(2 * guard_bytes + self.padded)
        self.ptr = self.mem.ptr + guard_bytes  # what the kernel sees

    def fill_guards(self, stream):
        memset8(self.mem.ptr, self.guard_byte, self.guard_bytes, stream)
        tail = self.ptr + self.data_bytes
        memset8(tail, self.guard_byte, self.mem.ptr + self.mem.nbytes - tail, stream)

    def guard_ranges(self):
        """(ptr, nbytes) of the two guard regions, including the padding after the data."""
        tail = self.ptr + self.data_bytes
        return [(self.mem.ptr, self.guard_bytes), (tail, self.mem.ptr + self.mem.nbytes - tail)]

    def free(self):
        self.mem.free()


def stream_handle(stream) -> int:
    return int(stream.handle)


def memset8(ptr: int, value: int, n: int, stream):
    if n > 0:
        check(_cu().cuMemsetD8Async(ptr, value, n, stream.handle), "cuMemsetD8Async")


def poison(ptr: int, dtype: str, nbytes: int, stream):
    """Fill an output with NaN (float) or a byte pattern (int) before a run."""
    cu = _cu()
    if dtype in POISON:
        width, pattern = POISON[dtype]
        if width == 4:
            check(cu.cuMemsetD32Async(ptr, pattern, nbytes // 4, stream.handle), "poison")
        else:
            check(cu.cuMemsetD16Async(ptr, pattern, nbytes // 2, stream.handle), "poison")
    else:
        memset8(ptr, INT_POISON_BYTE, nbytes, stream)


def upload(ptr: int, host: np.ndarray):
    host = np.ascontiguousarray(host)
    check(_cu().cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")


def download(ptr: int, host: np.ndarray):
    check(_cu().cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes), "cuMemcpyDtoH")
    return host


def copy_d2d(dst: int, src: int, nbytes: int, stream):
    check(_cu().cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def sync(stream, where="stream synchronize"):
    check(_cu().cuStreamSynchronize(stream.handle), where)


class EventPool:
    """Timing events created once and recorded many times (one start/end pair per run)."""

    def __init__(self, n_pairs: int):
        cu = _cu()
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT
        self.start = [check(cu.cuEventCreate(flags), "cuEventCreate") for _ in range(n_pairs)]
        self.end = [check(cu.cuEventCreate(flags), "cuEventCreate") for _ in range(n_pairs)]

    def record_start(self, i: int, stream):
        check(_cu().cuEventRecord(self.start[i], stream.handle), "cuEventRecord")

    def record_end(self, i: int, stream):
        check(_cu().cuEventRecord(self.end[i], stream.handle), "cuEventRecord")

    def elapsed_us(self, i: int) -> float:
        ms = check(_cu().cuEventElapsedTime(self.start[i], self.end[i]), "cuEventElapsedTime")
        return float(ms) * 1000.0


def set_max_dynamic_smem(kernel, smem_bytes: int, device_ordinal: int):
    """More than 48 KB of dynamic shared memory must be opted into per kernel."""
    cu = _cu()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, cu.CUkernel):
        dev = check(cu.cuDeviceGet(device_ordinal), "cuDeviceGet")
        check(cu.cuKernelSetAttribute(attr, smem_bytes, handle, dev), "cuKernelSetAttribute")
    else:
        check(cu.cuFuncSetAttribute(handle, attr, smem_bytes), "cuFuncSetAttribute")


def launch_config(grid, block, smem_bytes: int = 0, cluster=None):
    """A cuda.core LaunchConfig from a grid counted in blocks (as launch descriptions count it).
    With a cluster shape, cuda.core counts the grid in clusters: the grid is divided by it (it
    must be a multiple; callers check and say so in their own terms)."""
    from cuda.core import LaunchConfig

    grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
    if cluster:
        cluster = tuple(int(c) for c in cluster)
        if any(g % c for g, c in zip(grid, cluster, strict=True)):
            raise ValueError(f"grid {grid} is not a multiple of cluster {cluster}")
        grid = tuple(g // c for g, c in zip(grid, cluster, strict=True))
        return LaunchConfig(grid=grid, cluster=cluster, block=block, shmem_size=smem_bytes)
    return LaunchConfig(grid=grid, block=block, shmem_size=smem_bytes)


def scalar_arg(ptx_type: str, value):
    """cuda.core passes a Python int as a pointer and a float as a double: be explicit."""
    conv = {
        "u32": np.uint32,
        "s32": np.int32,
        "u64": np.uint64,
        "s64": np.int64,
        "f32": np.float32,
        "f64": np.float64,
    }
    return conv[ptx_type](value)


def sm_clock_mhz(nvml_handle) -> int | None:
    """The SM clock now, through NVML (None when NVML is unavailable)."""
    if nvml_handle is None:
        return None
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetClockInfo(nvml_handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - a clock we cannot read is recorded as unknown
        return None


def nvml_handle_for(pci_bus_id: str | None):
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML is optional: clocks are then unknown
        return None
    try:
        if pci_bus_id:
            return pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    except Exception:  # noqa: BLE001, S110 - bus id spelled differently: fall back to the index
        pass
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
    except Exception:  # noqa: BLE001 - NVML is optional: clocks are then unknown
        return None
