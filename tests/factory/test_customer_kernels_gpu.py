"""On a GPU: the example customer kernels compute their manifest's operator. Each runs at a suite
shape and at the held-out shapes on fresh random inputs, with poisoned outputs, and is compared
with the float64 reference under the manifest's tolerance."""

from pathlib import Path

import numpy as np
import pytest

from factory.spec import (
    STORAGE_DTYPES,
    concrete_shape,
    eval_dim_expr,
    load_manifest,
    random_inputs,
    reference,
    to_float64,
)

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "factory" / "examples"
CASES = [("rmsnorm_cuda.toml", "rmsnorm_cuda.cu"), ("softmax_ptx.toml", "softmax_ptx.ptx")]


@pytest.fixture(scope="module")
def gpu():
    from cuda.bindings import driver as cu
    from cuda.core import Device

    dev = Device()
    dev.set_current()
    return cu, dev, dev.create_stream(), f"sm_{dev.arch}"


def _ck(cu, res):
    if res[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {res[0]}")
    return res[1] if len(res) > 1 else None


def run_baseline(gpu, w, dims, inputs):
    from cuda.core import LaunchConfig, Program, ProgramOptions, launch

    cu, dev, stream, arch = gpu
    b = w.baseline
    kernel = Program(b.ptx, "ptx", ProgramOptions(arch=arch)).compile("cubin").get_kernel(b.entry)
    ptrs, outs = {}, {}
    for name, arr in inputs.items():
        a = np.ascontiguousarray(arr)
        ptrs[name] = int(_ck(cu, cu.cuMemAlloc(max(a.nbytes, 16))))
        _ck(cu, cu.cuMemcpyHtoD(ptrs[name], a.ctypes.data, a.nbytes))
    for o in w.outputs:
        outs[o.name] = np.empty(concrete_shape(o.shape, dims), STORAGE_DTYPES[o.dtype])
        ptrs[o.name] = int(_ck(cu, cu.cuMemAlloc(max(outs[o.name].nbytes, 16))))
        _ck(cu, cu.cuMemsetD8(ptrs[o.name], 0xFF, outs[o.name].nbytes))  # NaN in every format
    args = []
    for p in b.params:
        if p.kind == "tensor":
            args.append(ptrs[p.name])
        elif p.kind == "dim":
            args.append({"u32": np.uint32, "s32": np.int32, "u64": np.uint64, "s64": np.int64}[
                p.ptx_type](dims[p.name]))  # fmt: skip
        else:
            args.append((np.float32 if p.ptx_type == "f32" else np.float64)(p.value))
    grid = tuple(eval_dim_expr(g, dims) for g in b.launch.grid)
    cfg = LaunchConfig(grid=grid, block=b.launch.block,
                       shmem_size=eval_dim_expr(b.launch.smem_bytes, dims))  # fmt: skip
    launch(stream, cfg, kernel, *args)
    stream.sync()
    for o in w.outputs:
        _ck(cu, cu.cuMemcpyDtoH(outs[o.name].ctypes.data, ptrs[o.name], outs[o.name].nbytes))
    for p in ptrs.values():
        _ck(cu, cu.cuMemFree(p))
    return outs


@pytest.mark.parametrize(("manifest", "source"), CASES)
def test_the_example_kernel_matches_the_reference_on_fresh_inputs(gpu, manifest, source):
    text = (EXAMPLES / manifest).read_text()
    w = load_manifest(
        text, baseline_source=(EXAMPLES / source).read_bytes(), baseline_filename=source
    )
    for seed, dims in enumerate([w.shapes[0], *w.heldout_shapes]):
        inputs = random_inputs(w, dims, seed=1000 + seed)
        want = reference(w, inputs, dims)
        got = run_baseline(gpu, w, dims, inputs)
        for o in w.outputs:
            tol = w.tolerance[o.dtype]
            out = to_float64(got[o.name], o.dtype)
            ref = want[o.name]
            assert np.all(np.isfinite(out)), f"{o.name} at {dims}: unwritten or NaN outputs"
            rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert rel <= tol.rel_norm, f"{o.name} at {dims}: rel_norm {rel:.2e}"
            assert np.all(np.abs(out - ref) <= tol.atol + tol.rtol * np.abs(ref)), dims
            print(f"{manifest} {dims}: rel_norm {rel:.2e}")
