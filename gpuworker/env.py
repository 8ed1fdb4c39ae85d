"""What machine and software a result was measured on, and the `probe` command's report.

Version lookups never initialise CUDA. `probe()` does (it asks the driver for the device), so it
is meant for the command line and the worker's child process, never for an import.
"""

from __future__ import annotations

import platform
import socket
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    return {
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "cuda_core": _version("cuda-core"),
        "cuda_bindings": _version("cuda-bindings"),
        "nvjitlink": _version("nvidia-nvjitlink") or _version("nvidia-nvjitlink-cu13"),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
    }


def probe() -> dict:
    """The device and driver as this process sees them. Never raises: without a driver or a GPU
    the result has ``"gpu": None`` and ``"error"`` says why."""
    info = {"hostname": socket.gethostname(), **software_versions()}
    try:
        from cuda.core import Device
    except Exception as e:  # noqa: BLE001 - reported, not raised
        info.update(gpu=None, error=f"cuda.core is not importable: {e}")
        return info
    try:
        dev = Device()
        dev.set_current()
    except Exception as e:  # noqa: BLE001 - no driver / no device: a clean report
        info.update(gpu=None, error=f"no GPU: {e}")
        return info
    props = dev.properties
    cc = dev.compute_capability
    try:
        from cuda.bindings import driver

        _, drv = driver.cuDriverGetVersion()
        cuda_driver = f"{drv // 1000}.{(drv % 1000) // 10}"
    except Exception:  # noqa: BLE001
        cuda_driver = None
    info.update(
        gpu=dev.name,
        sm=f"sm_{cc.major}{cc.minor}",
        sm_count=props.multiprocessor_count,
        l2_bytes=props.l2_cache_size,
        pci_bus_id=dev.pci_bus_id,
        cuda_driver_api=cuda_driver,
        driver=_nvml_driver_version(),
    )
    return info


def _nvml_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - NVML is optional
        return None
