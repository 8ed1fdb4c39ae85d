"""Direct timing of generated kernels with CUDA events, without the GPU worker.

For development of the generator (and as the suite's fallback when gpuworker is not installed):
compiles each schedule, checks the output rows against float64 on a sample of rows, and times the
kernel with an L2 flush before every run. The suite's recorded numbers come from
gpuworker.run_batch; these are for picking schedules.
"""

from __future__ import annotations

import time

import numpy as np

from factory.compile import compile_ptx, rejection_reason
from factory.emit import emit
from factory.ir import ROLE_COL, ROLE_ROW, ROLE_ROWSCALAR

L2_FLUSH_BYTES = 256 << 20  # several times the H200's 60 MB L2


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    f = a.astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


class Device:
    def __init__(self):
        from cuda.bindings import driver as cu
        from cuda.core import Device as CoreDevice

        self.cu = cu
        self.dev = CoreDevice()
        self.dev.set_current()
        self.stream = self.dev.create_stream()
        self.flush = self.alloc(L2_FLUSH_BYTES)
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT
        self.ev0 = self._ck(cu.cuEventCreate(flags))
        self.ev1 = self._ck(cu.cuEventCreate(flags))

    def _ck(self, res):
        if res[0] != self.cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA error {res[0]}")
        return res[1] if len(res) > 1 else None

    def alloc(self, nbytes: int) -> int:
        return int(self._ck(self.cu.cuMemAlloc(max(int(nbytes), 16))))

    def free(self, p: int) -> None:
        self._ck(self.cu.cuMemFree(p))

    def upload(self, p: int, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        self._ck(self.cu.cuMemcpyHtoD(p, a.ctypes.data, a.nbytes))

    def download(self, p: int, a: np.ndarray) -> np.ndarray:
        self._ck(self.cu.cuMemcpyDtoH(a.ctypes.data, p, a.nbytes))
        return a

    def time_us(self, fn, reps: int = 30) -> list[float]:
        """Median-ready samples: L2 flushed before each run, one event pair around each."""
        cu, h = self.cu, self.stream.handle
        samples = []
        fn()
        self.stream.sync()
        for _ in range(reps):
            self._ck(cu.cuMemsetD32Async(self.flush, 0, L2_FLUSH_BYTES // 4, h))
            self._ck(cu.cuEventRecord(self.ev0, h))
            fn()
            self._ck(cu.cuEventRecord(self.ev1, h))
            self._ck(cu.cuEventSynchronize(self.ev1))
            samples.append(float(self._ck(cu.cuEventElapsedTime(self.ev0, self.ev1))) * 1e3)
        return samples

    def copy_ceiling_tbps(self, nbytes: int = 1 << 30) -> float:
        a, b = self.alloc(nbytes), self.alloc(nbytes)
        h = self.stream.handle
        s = self.time_us(lambda: self._ck(self.cu.cuMemcpyDtoDAsync(b, a, nbytes, h)), reps=20)
        self.free(a)
        self.free(b)
        return 2 * nbytes / (float(np.median(s)) * 1e-6) / 1e12


def run_ir(device: Device, ir, schedules, dims, ref_fn=None, reps: int = 30) -> list[dict]:
    """Time every schedule of `ir` at `dims`. `ref_fn(host_f64_inputs, rows) -> {out: f64}`
    checks a sample of rows when given."""
    from cuda.core import LaunchConfig, ObjectCode, launch

    from bench.suite import eval_launch

    m, n = dims["M"], dims["N"]
    rng = np.random.default_rng(1)
    host, ptrs, f64 = {}, {}, {}
    for t in ir.inputs:
        shape = {ROLE_ROW: (m, n), ROLE_COL: (n,), ROLE_ROWSCALAR: (m,)}.get(t.role, (1,))
        if t.dtype.startswith("int"):
            a = rng.integers(0, n, size=shape).astype(t.dtype)
            f64[t.name] = a
        elif t.dtype == "bf16":
            a = _bf16_bits(rng.uniform(-4, 4, size=shape))
            f64[t.name] = _bf16_f64(a)
        else:
            a = rng.uniform(-4, 4, size=shape).astype(np.float32 if t.dtype == "fp32" else t.dtype)
            f64[t.name] = a.astype(np.float64)
        host[t.name] = a
        ptrs[t.name] = device.alloc(a.nbytes)
        device.upload(ptrs[t.name], a)
    out_host = {}
    for o in ir.outputs:
        shape = (m, n) if o.role == ROLE_ROW else (m,)
        dt = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32}[o.dtype]
        out_host[o.name] = np.zeros(shape, dt)
        ptrs[o.name] = device.alloc(out_host[o.name].nbytes)
    nbytes = ir.bytes_per_row(n) * m + sum(
        n * t.elem_bytes for t in ir.inputs if t.role == ROLE_COL
    )
    results = []
    for s in schedules:
        rec = {"schedule": s.to_dict(), "tag": s.tag(), "dims": dims}
        em = emit(ir, s)
        rep = compile_ptx(em.ptx)
        why = rejection_reason(rep, s.threads_per_block)
        rec["registers"] = rep.registers
        if why:
            results.append(rec | {"status": "rejected", "reason": why})
            continue
        kernel = ObjectCode.from_cubin(rep.cubin).get_kernel(em.entry)
        grid = tuple(eval_launch(g, dims) for g in em.launch.grid)
        cfg = LaunchConfig(grid=grid, block=tuple(em.launch.block), shmem_size=0)
        args = [ptrs[p.name] if p.kind == "tensor" else np.uint32(dims[p.name]) for p in em.params]

        def go(cfg=cfg, kernel=kernel, args=args):
            launch(device.stream, cfg, kernel, *args)

        try:
            for o in ir.outputs:
                device._ck(device.cu.cuMemsetD8(ptrs[o.name], 0xFF, out_host[o.name].nbytes))
            go()
            device.stream.sync()
            if ref_fn is not None:
                rec["check"] = _check_sample(device, ir, ptrs, out_host, f64, ref_fn, m)
            t0 = time.perf_counter()
            samples = device.time_us(go, reps)
            med = float(np.median(samples))
            rec |= {
                "status": "ok",
                "median_us": med,
                "p20_us": float(np.percentile(samples, 20)),
                "p80_us": float(np.percentile(samples, 80)),
                "tbps": nbytes / (med * 1e-6) / 1e12,
                "time_s": time.perf_counter() - t0,
            }
        except Exception as e:  # noqa: BLE001 - a crash is a result
            rec |= {"status": "crashed", "reason": str(e)[:300]}
            results.append(rec)
            break  # the context may be unusable
        results.append(rec)
    for p in ptrs.values():
        device.free(p)
    return results


def _check_sample(device, ir, ptrs, out_host, f64, ref_fn, m) -> dict:
    rows = sorted({0, 1, m // 2, m - 1})
    worst = {}
    for o in ir.outputs:
        got = device.download(ptrs[o.name], out_host[o.name])[rows]
        got = _bf16_f64(got) if o.dtype == "bf16" else got.astype(np.float64)
        ref = ref_fn(o, f64, rows)
        rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
        worst[o.name] = rel if np.isfinite(got).all() else float("nan")
    return worst
