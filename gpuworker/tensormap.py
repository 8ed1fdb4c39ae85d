"""CUtensorMap descriptors for kernels that load tiles with the tensor memory accelerator (TMA).

A kernel parameter of kind "tmap" (factory.spec.types.KernelParam) describes a 2D (or higher)
tiled map over a row-major tensor: `dims` are the tensor's extents as dim expressions, innermost
(contiguous) first, `box` the tile the kernel loads per copy, innermost first, in elements, and
`swizzle` the shared-memory swizzle in bytes (0, 32, 64, 128). The descriptor is 128 opaque bytes
passed to the kernel by value (a `.param .align 64 .b8 name[128]` parameter); the driver encodes
it (cuTensorMapEncodeTiled) from the tensor's device address, so it is rebuilt for every buffer.

Loads past the tensor's extents are filled with zeros by the hardware, which is how the matmul
kernels handle tails in M, N and K. Hardware rules checked here: the address is 16-byte aligned,
every stride but the innermost is a multiple of 16 bytes, each box extent is in [1, 256], and with
a swizzle the box's inner extent in bytes is at most the swizzle span.
"""

from __future__ import annotations

import ctypes

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
SWIZZLES = (0, 32, 64, 128)


class TensorMapError(ValueError):
    """The tensor and box cannot be described by a tensor map."""


def plan(param: dict, dims: dict[str, int], dtype: str) -> dict:
    """Extents, byte strides, box and swizzle of one "tmap" parameter at `dims` (pure Python:
    what encode() hands the driver). Raises TensorMapError for what the hardware refuses."""
    from factory.spec import eval_dim_expr

    if dtype not in ELEMENT_BYTES:
        raise TensorMapError(f"no tensor map for dtype {dtype}")
    size = ELEMENT_BYTES[dtype]
    extents = [int(eval_dim_expr(d, dims)) for d in param["dims"]]
    box = [int(x) for x in param["box"]]
    swizzle = int(param.get("swizzle", 0))
    if len(extents) != len(box) or not 1 <= len(box) <= 5:
        raise TensorMapError("dims and box must have the same rank, 1 to 5")
    if any(e < 1 for e in extents):
        raise TensorMapError(f"empty extent in {extents}")
    if any(not 1 <= b <= 256 for b in box):
        raise TensorMapError(f"box {box}: each extent must be in [1, 256]")
    if swizzle not in SWIZZLES:
        raise TensorMapError(f"swizzle {swizzle} not in {SWIZZLES}")
    if (box[0] * size) % 16:
        raise TensorMapError("the box's inner extent must be a multiple of 16 bytes")
    if swizzle and box[0] * size > swizzle:
        raise TensorMapError(f"box inner extent {box[0] * size} B exceeds the {swizzle} B swizzle")
    strides = []
    acc = size
    for e in extents[:-1]:
        acc *= e
        strides.append(acc)
    if any(s % 16 for s in strides):
        raise TensorMapError(f"row strides {strides} B must be multiples of 16 bytes")
    return {
        "extents": extents,
        "strides": strides,
        "box": box,
        "swizzle": swizzle,
        "elem_bytes": size,
        "dtype": dtype,
    }


def encode(ptr: int, p: dict):
    """The 128-byte descriptor for the device address `ptr` and a plan() result, as a ctypes
    object whose address and size a launcher passes as the kernel argument (64-byte aligned)."""
    from cuda.bindings import driver as cu

    if ptr % 16:
        raise TensorMapError("the tensor's address must be 16-byte aligned")
    dt = {
        "bf16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "fp16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "fp32": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    }[p["dtype"]]
    sw = {
        0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
        64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
        128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
    }[p["swizzle"]]
    rank = len(p["extents"])
    err, tmap = cu.cuTensorMapEncodeTiled(
        dt,
        rank,
        ptr,
        [cu.cuuint64_t(e) for e in p["extents"]],
        [cu.cuuint64_t(s) for s in p["strides"]],
        [cu.cuuint32_t(b) for b in p["box"]],
        [cu.cuuint32_t(1)] * rank,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        sw,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise TensorMapError(f"cuTensorMapEncodeTiled: {err} for {p}")
    return as_arg(ctypes.string_at(tmap.getPtr(), 128))


def as_arg(raw: bytes) -> ctypes.Array:
    """A 64-byte aligned ctypes copy of a 128-byte descriptor (the object keeps its buffer)."""
    if len(raw) != 128:
        raise TensorMapError("a tensor map is 128 bytes")
    buf = ctypes.create_string_buffer(128 + 64)
    off = (-ctypes.addressof(buf)) % 64
    arr = (ctypes.c_uint8 * 128).from_buffer(buf, off)
    ctypes.memmove(ctypes.addressof(arr), raw, 128)
    arr._keep = buf  # noqa: SLF001 - keeps the backing buffer alive with the view
    return arr


def encode_param(param: dict, ptr: int, dims: dict[str, int], dtype: str):
    """plan() then encode(): the launch argument for one "tmap" parameter."""
    return encode(ptr, plan(param, dims, dtype))


def _arg_ctype(a):
    """A ctypes object holding one kernel argument as the kernel's parameter reads it."""
    import numpy as np

    if isinstance(a, ctypes.Array | ctypes._SimpleCData):  # noqa: SLF001
        return a
    if isinstance(a, np.generic):
        conv = {
            np.uint32: ctypes.c_uint32,
            np.int32: ctypes.c_int32,
            np.uint64: ctypes.c_uint64,
            np.int64: ctypes.c_int64,
            np.float32: ctypes.c_float,
            np.float64: ctypes.c_double,
        }
        return conv[type(a)](a.item())
    if isinstance(a, int):  # a device pointer, as cuda.core takes it
        return ctypes.c_uint64(a)
    raise TensorMapError(f"cannot pass {type(a).__name__} to a kernel with tensor maps")


def launch_raw(
    stream_handle: int, grid, block, smem_bytes: int, kernel, args, cluster=None
) -> None:
    """Launch `kernel` (a cuda.core Kernel, or a CUfunction/CUkernel handle) through the driver
    with a hand-built argument array: cuda.core's launch takes no 128-byte by-value arguments,
    so kernels with tensor-map parameters go this way. `args` as for cuda.core's launch, plus the
    ctypes descriptors from encode(). `grid` counts CTAs; with a `cluster` shape it must be a
    multiple of it (cuLaunchKernelEx with the cluster-dimension attribute)."""
    from cuda.bindings import driver as cu

    handle = getattr(kernel, "handle", kernel)
    if isinstance(handle, cu.CUkernel):
        # the driver takes a CUkernel wherever a CUfunction is expected
        handle = cu.CUfunction(int(handle))
    held = [_arg_ctype(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(held)))(*[ctypes.addressof(h) for h in held])
    if cluster and any(int(c) > 1 for c in cluster):
        if any(int(g) % int(c) for g, c in zip(grid, cluster, strict=True)):
            raise TensorMapError(f"grid {list(grid)} is not a multiple of cluster {list(cluster)}")
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(g) for g in grid)
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(b) for b in block)
        cfg.sharedMemBytes = int(smem_bytes)
        cfg.hStream = cu.CUstream(stream_handle)
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = attr.value.clusterDim
        dim.x, dim.y, dim.z = (int(c) for c in cluster)
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        (err,) = cu.cuLaunchKernelEx(cfg, handle, ctypes.addressof(ptrs), 0)
    else:
        (err,) = cu.cuLaunchKernel(
            handle,
            int(grid[0]),
            int(grid[1]),
            int(grid[2]),
            int(block[0]),
            int(block[1]),
            int(block[2]),
            int(smem_bytes),
            stream_handle,
            ctypes.addressof(ptrs),
            0,
        )
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernel: {err}")
