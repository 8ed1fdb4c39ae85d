"""Bench of the wgmma GEMM emitter on the GPU: verify each variant, then time it beside cuBLAS.

    python -m lab.matmul.gemm_bench [--plan "op:sched+sched;op:sched"] [--check-shapes MxNxK,..]
        [--time-shapes MxNxK,..] [--allow-cp-async ...] [--dry-run]

--dry-run needs no GPU or torch: it resolves the plan's names, emits and compiles each kernel
(nvJitLink) and fails on a build error, a spill or a serialised wgmma (C7509/C7511/C7515).

For every (epilogue, schedule) variant: emit PTX, compile with nvJitLink (sm_90a), load with the
driver, and launch through cuLaunchKernel with the CUtensorMap parameters from gpuworker.tensormap.
Correctness: fresh random bf16 inputs per check, the output poisoned with NaN first, compared with
a float64 reference (on the GPU) by relative error norm and elementwise
|out - ref| <= 2^-7 |ref| + atol, atol = 2^-7 rms(ref) (1 + K / 2^16); each check runs twice and
the two outputs must be bitwise equal (a race shows as a difference). Shapes include tails
(4095x4097x4000, 1 row, sizes below one tile). Timing (only after the variant passed at that
shape): CUDA events on the launching stream, a 512 MiB L2 flush before every run, candidate and
torch (cuBLAS) interleaved in the same loop, warm-up, median with p20/p80; the clocks from NVML.
Writes $OUT/gemm_bench.json (or ./gemm_bench.json) and prints a table last.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import importlib  # noqa: E402

from factory.compile import compile_ptx  # noqa: E402

gemm_emit = importlib.import_module("factory.families.matmul.emit")
from factory.families.matmul.schedule import is_valid  # noqa: E402
from gpuworker import tensormap  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

OUT = os.environ.get("OUT", ".")
RESULTS: dict = {"checks": [], "timings": [], "compile": {}, "env": {}}


def save():
    with open(os.path.join(OUT, "gemm_bench.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def log(*a):
    print(*a, flush=True)


def use_primary_context(cu) -> None:
    """Make device 0's primary context current on this thread (the one torch uses) unless a
    context is current already: loading a module needs one, and a test may run before torch
    has touched the GPU."""
    (err,) = cu.cuInit(0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, ctx = cu.cuCtxGetCurrent()
    if err == cu.CUresult.CUDA_SUCCESS and int(ctx) != 0:
        return
    err, dev = cu.cuDeviceGet(0)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    (err,) = cu.cuCtxSetCurrent(ctx)
    assert err == cu.CUresult.CUDA_SUCCESS, err


def ptxas_path() -> str | None:
    """A standalone ptxas: on PATH, the CUDA toolkit's, or the one Triton ships."""
    import shutil

    found = shutil.which("ptxas")
    if found:
        return found
    cands = ["/usr/local/cuda/bin/ptxas"]
    import importlib.util

    spec = importlib.util.find_spec("triton")  # Triton is only one more place to look
    if spec is not None and spec.origin:
        cands.append(os.path.join(os.path.dirname(spec.origin), "backends/nvidia/bin/ptxas"))
    return next((c for c in cands if os.path.exists(c)), None)


def compile_whole_program(ptx: str):
    """The PTX compiled as a whole program (ptxas without -c), where ptxas honours setmaxnreg;
    nvJitLink compiles every PTX input relocatable (-c) and ignores it (C7504). Returns a
    factory.compile.CompileReport-like object (ok, cubin, log, registers, spill_store_bytes)."""
    import subprocess
    import tempfile
    from types import SimpleNamespace

    from factory.compile import parse_resource_log

    tool = ptxas_path()
    if tool is None:
        return SimpleNamespace(ok=False, log="no ptxas found", cubin=None)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run(
            [tool, "-arch=sm_90a", "-v", src, "-o", dst], capture_output=True, text=True
        )
        log = p.stdout + p.stderr
        if p.returncode != 0:
            return SimpleNamespace(ok=False, log=log, cubin=None)
        with open(dst, "rb") as f:
            cubin = f.read()
    ents = parse_resource_log(log)
    e0 = ents[0] if ents else None
    return SimpleNamespace(
        ok=True,
        cubin=cubin,
        log=log,
        tool=tool,
        registers=e0.registers if e0 else 0,
        spill_store_bytes=e0.spill_store_bytes if e0 else 0,
    )


class Kernel:
    def __init__(self, ir, s, compiler: str = "nvjitlink"):
        from cuda.bindings import driver as cu

        use_primary_context(cu)
        self.ir, self.s, self.compiler = ir, s, compiler
        e = gemm_emit.emit(ir, s)
        self.em = e
        if compiler == "ptxas":
            r = compile_whole_program(e.ptx)
        else:
            r = compile_ptx(e.ptx, "sm_90a", cache=False)
        if not r.ok:
            raise RuntimeError(r.log[-2000:])
        self.report = r
        self.setmaxnreg_ignored = "C7504" in r.log
        err, self.mod = cu.cuModuleLoadData(r.cubin)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        err, self.fn = cu.cuModuleGetFunction(self.mod, e.entry.encode())
        assert err == cu.CUresult.CUDA_SUCCESS, err
        smem = e.launch.smem_bytes
        (err,) = cu.cuFuncSetAttribute(
            self.fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
        )
        assert err == cu.CUresult.CUDA_SUCCESS, err
        self._args = None

    def bind(self, tensors: dict, dims: dict):
        """Arguments for these tensors (torch, by name) and dims; kept alive on self."""
        from factory.spec import eval_dim_expr

        keep, ptrs = [], []
        for p in self.em.params:
            if p.kind == "tmap":
                t = tensors[p.name]
                arg = tensormap.encode_param(
                    {"dims": list(p.dims), "box": list(p.box), "swizzle": p.swizzle},
                    t.data_ptr(),
                    dims,
                    "bf16",
                )
            elif p.kind == "tensor":
                arg = ctypes.c_uint64(tensors[p.name].data_ptr())
            elif p.kind == "dim":
                arg = ctypes.c_uint32(dims[p.name])
            else:
                raise ValueError(p.kind)
            keep.append(arg)
            ptrs.append(ctypes.addressof(arg))
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        keep.append(arr)
        grid = [int(eval_dim_expr(g, dims)) for g in self.em.launch.grid]
        self._args = (keep, arr, grid)

    def launch(self, stream: int):
        from cuda.bindings import driver as cu

        keep, arr, grid = self._args
        b = self.em.launch.block
        if self.em.launch.cluster:
            tensormap.launch_raw(
                stream,
                grid,
                b,
                self.em.launch.smem_bytes,
                self.fn,
                keep[:-1],
                self.em.launch.cluster,
            )
            return
        (err,) = cu.cuLaunchKernel(
            self.fn,
            grid[0],
            grid[1],
            grid[2],
            b[0],
            b[1],
            b[2],
            self.em.launch.smem_bytes,
            stream,
            ctypes.addressof(arr),
            0,
        )
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"launch: {err}")


def child_path_check(torch, kern, m=1000, n=1030, k=1000):
    """Load the same cubin the way gpuworker.child does (cuda.core ObjectCode, a CUkernel) and
    launch it through gpuworker.tensormap.launch_raw with the worker's argument types. A staged
    kernel (tma_store) needs output rows of a multiple of 16 bytes: N is rounded up to 8 there
    (N = 1030 made the output map refuse a 2060-byte row stride)."""
    import numpy as np
    from cuda.core import ObjectCode

    from gpuworker import gpu

    if kern.s.tma_store:
        n = -(-n // 8) * 8

    code = ObjectCode.from_cubin(kern.report.cubin)
    k_obj = code.get_kernel(kern.em.entry)
    gpu.set_max_dynamic_smem(k_obj, kern.em.launch.smem_bytes, 0)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    t = make_inputs(torch, "plain", m, n, k, gen)
    dims = {"M": m, "N": n, "K": k}
    args = []
    for p in kern.em.params:
        if p.kind == "tmap":
            args.append(
                tensormap.encode_param(
                    {"dims": list(p.dims), "box": list(p.box), "swizzle": p.swizzle},
                    t[p.name].data_ptr(),
                    dims,
                    "bf16",
                )
            )
        elif p.kind == "tensor":
            args.append(t[p.name].data_ptr())
        else:
            args.append(np.uint32(dims[p.name]))
    from factory.spec import eval_dim_expr

    grid = [eval_dim_expr(g, dims) for g in kern.em.launch.grid]
    t["c"].fill_(float("nan"))
    tensormap.launch_raw(
        torch.cuda.current_stream().cuda_stream,
        grid,
        kern.em.launch.block,
        kern.em.launch.smem_bytes,
        k_obj,
        args,
    )
    wait_or_die(torch, "child path")
    ref = reference(torch, "plain", t)
    rel = float(torch.linalg.norm(t["c"].double() - ref) / torch.linalg.norm(ref))
    ok = bool(torch.isfinite(t["c"]).all()) and rel < 1e-2
    RESULTS["child_path"] = {"ok": ok, "rel_norm": rel, "shape": [m, n, k]}
    save()
    log(f"child path (cuda.core CUkernel + launch_raw): rel {rel:.2e} -> {'OK' if ok else 'FAIL'}")
    return ok


BATCH = 3  # Bt of the batched variant: A and the output have BATCH * M rows


def rows_of(name, m):
    return BATCH * m if name == "batched_row" else m


def make_inputs(torch, name, m, n, k, gen, dev="cuda"):
    if name == "batched_row":
        t = make_inputs(torch, "plain", BATCH * m, n, k, gen, dev)
        t["rs"] = torch.randn(m, device=dev, generator=gen).to(torch.bfloat16)
        return t
    t = {
        "a": torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16),
        "b": (torch.randn(n, k, device=dev, generator=gen) / math.sqrt(k) * 4).to(torch.bfloat16),
    }
    if name in ("bias_gelu", "bias_silu"):
        t["bias"] = torch.randn(n, device=dev, generator=gen).to(torch.bfloat16)
    if name == "residual":
        t["res"] = torch.randn(m, n, device=dev, generator=gen).to(torch.bfloat16)
    if name == "swiglu":
        t["b2"] = (torch.randn(n, k, device=dev, generator=gen) / math.sqrt(k) * 4).to(
            torch.bfloat16
        )
    if name == "rowq_fp8":
        # products of about 4 rms times 2..40: the large rows saturate at 448
        t["rs"] = 2 + 38 * torch.rand(m, device=dev, generator=gen)
        t["c"] = torch.empty(m, n, device=dev, dtype=torch.uint8)  # e4m3 bits
        return t
    if name == "groupq_fp8":
        t["c"] = torch.empty(m, n, device=dev, dtype=torch.uint8)  # e4m3 bits
        t["cs"] = torch.empty(m, (n + 127) // 128, device=dev, dtype=torch.float32)
        return t
    t["c"] = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    return t


FP8_OPS = ("rowq_fp8", "groupq_fp8")


def group_quant(torch, y):
    """What a user writes for e4m3 with a scale per row and 128-column group: (q, scales)."""
    m, n = y.shape
    pad = (-n) % 128
    yg = torch.nn.functional.pad(y.float(), (0, pad)).view(m, -1, 128)
    s = yg.abs().amax(-1) / 448.0
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    q = (yg * inv[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(m, -1)[:, :n], s


def dequant(torch, name, out, t=None):
    """float64 values of an output: bf16/fp16/fp32 as they are, e4m3 decoded, group-scaled e4m3
    times its scales (ours: t["c"] with t["cs"]; a baseline's: the (q, scales) pair)."""
    if isinstance(out, tuple):
        q, sc = out
        return q.float().double() * sc.double().repeat_interleave(128, dim=1)[:, : q.shape[1]]
    if name == "groupq_fp8":
        v = decode(torch, name, out)
        return v * t["cs"].double().repeat_interleave(128, dim=1)[:, : out.shape[1]]
    if out.dtype == torch.uint8:
        return decode(torch, name, out)
    return out.float().double()


_E4M3 = {}


def decode(torch, name, out):
    """The output as float64: fp8 e4m3 bits through a table of the 256 codes (the spec's)."""
    if name not in FP8_OPS:
        return out.double()
    if out.device not in _E4M3:
        from factory.spec.reference import _e4m3_bits_to_f64

        table = _e4m3_bits_to_f64(np.arange(256, dtype=np.uint8))
        _E4M3[out.device] = torch.tensor(table, dtype=torch.float64, device=out.device)
    return _E4M3[out.device][out.view(torch.uint8).long()]


def poison(torch, name, out):
    if name in FP8_OPS:
        out.view(torch.uint8).fill_(0x7F)  # a NaN code of e4m3fn
    else:
        out.fill_(float("nan"))


def reference(torch, name, t):
    a, b = t["a"].double(), t["b"].double()
    x = a @ b.T
    if name == "plain":
        return x
    if name in ("bias_gelu", "bias_silu"):
        x = x + t["bias"].double()
        if name == "bias_silu":
            return x * torch.sigmoid(x)
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "residual":
        return x + t["res"].double()
    if name == "relu2":
        return torch.clamp(x, min=0) ** 2
    if name == "swiglu":
        u = a @ t["b2"].double().T
        return x * torch.sigmoid(x) * u
    if name == "batched_row":
        return x * t["rs"].double().repeat(BATCH)[:, None]
    if name == "rowq_fp8":
        # what the e4m3 store can hold: the scaled product, saturated at +-448
        return torch.clamp(x * t["rs"].double()[:, None], -448.0, 448.0)
    if name == "groupq_fp8":
        return x  # the dequantised output approximates the product
    raise KeyError(name)


def torch_baseline(torch, name, t):
    """What a user would write in eager torch for this operator."""
    F = torch.nn.functional
    a, b = t["a"], t["b"]
    if name == "plain":
        return lambda: torch.matmul(a, b.T)
    if name == "bias_gelu":
        return lambda: F.gelu(torch.addmm(t["bias"], a, b.T), approximate="tanh")
    if name == "bias_silu":
        return lambda: F.silu(torch.addmm(t["bias"], a, b.T))
    if name == "residual":
        return lambda: torch.addmm(t["res"], a, b.T)
    if name == "relu2":
        return lambda: torch.square(F.relu(torch.matmul(a, b.T)))
    if name == "swiglu":
        return lambda: F.silu(torch.matmul(a, b.T)) * torch.matmul(a, t["b2"].T)
    if name == "batched_row":
        rs = t["rs"].repeat(BATCH)[:, None]
        return lambda: torch.matmul(a, b.T) * rs
    if name == "rowq_fp8":
        rs = t["rs"][:, None]
        return lambda: (torch.matmul(a, b.T) * rs).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if name == "groupq_fp8":
        return lambda: group_quant(torch, torch.matmul(a, b.T))
    raise KeyError(name)


def wait_or_die(torch, what, seconds=10.0):
    """A kernel that deadlocks on a barrier would hang the whole run: poll, and exit with the
    results so far when it does not finish in time."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > seconds:
            log(f"HANG: {what} did not finish in {seconds} s")
            RESULTS["hang"] = what
            save()
            os._exit(3)
        time.sleep(0.001)


def check(torch, kern, name, m, n, k, seed):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    t = make_inputs(torch, name, m, n, k, gen)
    dims = {"M": m, "N": n, "K": k, "Bt": BATCH}
    kern.bind(t, dims)
    stream = torch.cuda.current_stream().cuda_stream
    outs = []
    for _ in range(2):
        poison(torch, name, t["c"])
        if "cs" in t:
            t["cs"].fill_(float("nan"))
        kern.launch(stream)
        wait_or_die(torch, f"{name} {label_of(kern)} {m}x{n}x{k}")
        outs.append(t["c"].clone())
    ref = reference(torch, name, t)
    rec = {"op": name, "schedule": label_of(kern), "shape": [m, n, k]}
    rec.update(compare(torch, name, outs, t, ref, m, n, k))
    RESULTS["checks"].append(rec)
    save()
    log(
        f"check {name:9s} {label_of(kern):28s} {m}x{n}x{k}: rel {rec['rel_norm']:.2e} "
        f"bad {rec['n_bad']} same {rec['repeat_equal']} -> {'OK' if rec['ok'] else 'FAIL'}"
    )
    return rec["ok"]


def compare(torch, name, outs, t, ref, m, n, k) -> dict:
    """The verdict on two runs' outputs `outs` (t["cs"] holding the scales of a group-scaled
    output) against the float64 reference `ref`."""
    out = dequant(torch, name, outs[0], t)
    scale_err = None
    if name == "groupq_fp8":
        # each scale against amax / 448 of its group of the float64 product
        pad = (-n) % 128
        amax = torch.nn.functional.pad(ref.abs(), (0, pad)).view(m, -1, 128).amax(-1)
        scale_err = float(((t["cs"].double() - amax / 448).abs() / (amax / 448)).max())
    finite = bool(torch.isfinite(out).all())
    diff = (out - ref).abs()
    rel = float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref)) if finite else float("nan")
    rms = float(torch.sqrt((ref**2).mean()))
    atol = 2**-7 * rms * (1 + k / 65536)
    # bf16 keeps 8 bits (2^-8 relative rounding), e4m3 4 bits (2^-4; its subnormal step 2^-9)
    rtol, rel_max = (2**-3, 7e-2) if name in FP8_OPS else (2**-7, 1e-2)
    if name in FP8_OPS:
        atol += 2**-9
    bad = int((diff > atol + rtol * ref.abs()).sum()) if finite else rows_of(name, m) * n
    same = bool(torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8)))
    ok = finite and rel < rel_max and bad == 0 and same
    if scale_err is not None:
        ok = ok and scale_err < 1e-2  # NaN (a scale not written) fails too
    return {
        "rel_norm": rel,
        "max_err": float(diff.max()) if finite else None,
        "n_bad": bad,
        "repeat_equal": same,
        "scale_rel_err": scale_err,
        "finite": finite,
        "ok": ok,
    }


def sm_clock():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001
        return None


def label_of(kern) -> str:
    """The schedule's label, and the compiler when it is not nvJitLink."""
    lab = kern.s.label()
    return lab if kern.compiler == "nvjitlink" else f"{lab} [{kern.compiler}]"


def time_interleaved(torch, runners: dict, reps: int, flush):
    """Warm every runner (label -> callable) up for 0.3 s, then launch each in turn `reps`
    times between CUDA events, zeroing `flush` before each launch (so the L2 holds none of the
    inputs). Returns the samples in microseconds a label and the SM clock (MHz, or None) before
    and after the timed launches."""
    samples: dict = {lab: [] for lab in runners}
    t0 = time.time()
    while time.time() - t0 < 0.3:
        for f in runners.values():
            f()
        torch.cuda.synchronize()
    clk0 = sm_clock()
    evs = []
    for _ in range(reps):
        for lab, f in runners.items():
            flush.zero_()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            evs.append((lab, e0, e1))
    torch.cuda.synchronize()
    clk1 = sm_clock()
    for lab, e0, e1 in evs:
        samples[lab].append(e0.elapsed_time(e1) * 1e3)
    return samples, clk0, clk1


def time_pair(torch, kerns: dict, name, m, n, k, reps):
    """Time the kernels in `kerns` (label -> Kernel) and torch interleaved, same inputs."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    t = make_inputs(torch, name, m, n, k, gen)
    dims = {"M": m, "N": n, "K": k, "Bt": BATCH}
    stream = torch.cuda.current_stream().cuda_stream
    for kern in kerns.values():
        kern.bind(t, dims)
    base = torch_baseline(torch, name, t)
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    runners = {"torch": base}
    for lab, kern in kerns.items():
        runners[lab] = (lambda kk: lambda: kk.launch(stream))(kern)
    samples, clk0, clk1 = time_interleaved(torch, runners, reps, flush)
    # the timed runs' output must still be right: recheck the last kernel's output cheaply
    flops = 2.0 * rows_of(name, m) * n * k * (2 if name == "swiglu" else 1)
    rows = {}
    for lab, xs in samples.items():
        xs = np.array(xs)
        med = float(np.median(xs))
        rows[lab] = {
            "median_us": med,
            "p20_us": float(np.percentile(xs, 20)),
            "p80_us": float(np.percentile(xs, 80)),
            "tflops": flops / med / 1e6,
            "samples_us": [round(float(x), 2) for x in xs],
        }
    for lab in kerns:
        rows[lab]["vs_torch"] = rows["torch"]["median_us"] / rows[lab]["median_us"]
    rec = {"op": name, "shape": [m, n, k], "rows": rows, "sm_clock_mhz": [clk0, clk1]}
    RESULTS["timings"].append(rec)
    save()
    return rec


def parse_shapes(txt: str) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in s.split("x")) for s in txt.split(",") if s]


def plan_of(args) -> list[tuple[str, list[str]]]:
    """(op, schedule names) pairs: --plan "op:a+b;op:c" or every --ops with every --scheds."""
    if args.plan:
        return [
            (part.split(":")[0], part.split(":")[1].split("+"))
            for part in args.plan.split(";")
            if part
        ]
    return [(op, args.scheds.split(",")) for op in args.ops.split(",")]


def dry_run(args) -> int:
    """The plan without a GPU or torch: each (op, schedule) named, valid (is_valid, with the
    --allow-* gates applied), emitted and compiled for sm_90a (nvJitLink, or ptxas for
    "name@ptxas"), with its registers, spills and any wgmma serialisation warning (C7509, C7511,
    C7515); each check and time shape against is_valid at that shape. Prints one line per
    kernel; returns 1 if a name is unknown, a kernel fails to build, spills or is serialised."""
    import re

    irs, scheds = epilogue_irs(), schedules()
    shapes = parse_shapes(args.check_shapes) + parse_shapes(args.time_shapes)
    bad = 0
    for op, snames in plan_of(args):
        for sn in snames:
            base, _, compiler = sn.partition("@")
            if op not in irs or base not in scheds:
                log(f"UNKNOWN {op}:{sn}")
                bad += 1
                continue
            ir, s = irs[op], scheds[base]
            why = is_valid(ir, s)
            if why:
                log(f"skip {op} {sn}: {why}")
                continue
            e = gemm_emit.emit(ir, s)
            if compiler == "ptxas":
                r = compile_whole_program(e.ptx)
            else:
                r = compile_ptx(e.ptx, "sm_90a", cache=False)
            serial = sorted(set(re.findall(r"C75(?:09|11|15)", r.log))) if r.ok else []
            refused = [
                "x".join(map(str, sh))
                for sh in shapes
                if is_valid(ir, s, {"M": sh[0], "N": sh[1], "K": sh[2], "Bt": 3})
            ]
            ok = r.ok and not r.spill_store_bytes and not serial
            bad += not ok
            log(
                f"{'ok  ' if ok else 'FAIL'} {op:9s} {sn:18s} {s.label():40s} "
                + (
                    f"{r.registers} regs, {r.spill_store_bytes} B spilled"
                    + (f", serialised {serial}" if serial else "")
                    if r.ok
                    else "COMPILE FAILED " + r.log[-300:]
                )
                + (f"; refused at {', '.join(refused)}" if refused else "")
            )
    log(f"dry run: {'all kernels built clean' if not bad else f'{bad} FAILED'}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="plain")
    ap.add_argument("--scheds", default="w256s4")
    ap.add_argument(
        "--check-shapes", default="333x250x72,1x4096x4096,4095x4097x4000,4096x4096x4096"
    )
    ap.add_argument("--time-shapes", default="4096x4096x4096,8192x8192x8192")
    ap.add_argument(
        "--plan", default="", help="op:sched+sched;op:sched ... (overrides --ops/--scheds)"
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument(
        "--allow-batch", action="store_true", help="let is_valid pass batched IRs (to verify them)"
    )
    ap.add_argument(
        "--allow-cluster",
        action="store_true",
        help="let is_valid pass 2x1 clusters (to verify them)",
    )
    ap.add_argument(
        "--allow-splitk", action="store_true", help="let is_valid pass split-K (to verify it)"
    )
    ap.add_argument(
        "--allow-tma-store",
        action="store_true",
        help="let is_valid pass the TMA-store epilogue (to verify it)",
    )
    ap.add_argument(
        "--allow-wide-k", action="store_true", help="let is_valid pass tile_k 128 (to verify it)"
    )
    ap.add_argument(
        "--allow-cp-async",
        action="store_true",
        help="let is_valid pass the cp.async load path (verified and open since "
        "bench/results/2026-12-07-h100-matmul-3: kept for older command lines)",
    )
    ap.add_argument(
        "--allow-tma-store-fallback",
        action="store_true",
        help="emit the staged kernels with their register-store fallback for output rows that "
        "are not a multiple of 16 bytes (schedule.TMA_STORE_FALLBACK_VERIFIED)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: check the plan's names, emit and compile (nvJitLink) each kernel, check "
        "the shapes against is_valid; exit status 1 on any failure",
    )
    ap.add_argument("--timeout", type=float, default=500.0)
    args = ap.parse_args()
    start = time.time()
    if args.allow_cp_async:
        from factory.families.matmul import schedule as _schedule

        _schedule.CP_ASYNC_VERIFIED = True
    if args.allow_tma_store_fallback:
        from factory.families.matmul import schedule as _schedule

        _schedule.TMA_STORE_FALLBACK_VERIFIED = True
    if args.allow_batch:
        from factory.families.matmul import schedule as _schedule

        _schedule.BATCH_VERIFIED = True
    if args.allow_cluster:
        from factory.families.matmul import schedule as _schedule

        _schedule.CLUSTER_VERIFIED = True
    if args.allow_splitk:
        from factory.families.matmul import schedule as _schedule

        _schedule.SPLITK_VERIFIED = True
    if args.allow_tma_store:
        from factory.families.matmul import schedule as _schedule

        _schedule.TMA_STORE_VERIFIED = True
        _schedule.TMA_STORE_FP8_VERIFIED = True
    if args.allow_wide_k:
        from factory.families.matmul import schedule as _schedule

        _schedule.WIDE_K_VERIFIED = True
    if args.dry_run:
        sys.exit(dry_run(args))
    import torch

    dev = torch.cuda.get_device_properties(0)
    RESULTS["env"] = {
        "gpu": dev.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sms": dev.multi_processor_count,
    }
    try:
        import subprocess

        RESULTS["env"]["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except Exception as e:  # noqa: BLE001 - the driver line is a record, not a requirement
        RESULTS["env"]["driver"] = f"unknown ({e})"
    log(RESULTS["env"])
    torch.zeros(1, device="cuda")  # torch's primary context exists from here
    from cuda.bindings import driver as cu

    cu.cuInit(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(torch.cuda.current_device()))
    cu.cuCtxSetCurrent(ctx)
    irs, scheds = epilogue_irs(), schedules()
    parse = parse_shapes
    table = []
    plan = plan_of(args)
    for op, snames in plan:
        kerns = {}
        for sn in snames:
            # "name@ptxas": the same schedule compiled as a whole program by ptxas (setmaxnreg
            # honoured) instead of by nvJitLink
            base, _, compiler = sn.partition("@")
            ir, s = irs[op], scheds[base]
            why = is_valid(ir, s)
            if why:
                log(f"skip {op} {sn}: {why}")
                continue
            try:
                kern = Kernel(ir, s, compiler or "nvjitlink")
                RESULTS["compile"][f"{op}/{sn}"] = {
                    "registers": kern.report.registers,
                    "spills": kern.report.spill_store_bytes,
                    "compiler": compiler or "nvjitlink",
                    "setmaxnreg_ignored": kern.setmaxnreg_ignored,
                    "tool": getattr(kern.report, "tool", "nvJitLink"),
                }
                ok = True
                for i, (m, n, k) in enumerate(parse(args.check_shapes)):
                    ok &= check(torch, kern, op, m, n, k, seed=100 + i)
                if ok:
                    kerns[sn] = kern
                    if op == "plain" and "child_path" not in RESULTS:
                        try:
                            child_path_check(torch, kern)
                        except Exception as e:  # noqa: BLE001
                            log(f"child path ERROR: {e}")
                            RESULTS["child_path"] = {"ok": False, "error": str(e)}
            except Exception as e:  # noqa: BLE001
                log(f"ERROR {op} {sn}: {e}")
                traceback.print_exc()
                RESULTS.setdefault("errors", []).append(f"{op} {sn}: {e}")
                save()
                if "ILLEGAL" in str(e) or "LAUNCH_FAILED" in str(e):
                    raise
        for m, n, k in parse(args.time_shapes):
            if time.time() - start > args.timeout:
                log("out of time budget; stopping timings")
                break
            if not kerns:
                break
            # verify at the timed shape first
            good = {}
            for sn, kern in kerns.items():
                if check(torch, kern, op, m, n, k, seed=7):
                    good[sn] = kern
            if not good:
                continue
            rec = time_pair(torch, good, op, m, n, k, args.reps)
            for lab, r in rec["rows"].items():
                table.append(
                    (
                        op,
                        f"{m}x{n}x{k}",
                        lab if lab == "torch" else label_of(good[lab]),
                        r["tflops"],
                        r["median_us"],
                        r["p20_us"],
                        r["p80_us"],
                        r.get("vs_torch", 1.0),
                        rec["sm_clock_mhz"],
                    )
                )
    save()
    log("")
    log(
        f"{'op':9s} {'shape':16s} {'variant':30s} {'TFLOP/s':>8s} {'med us':>9s} "
        f"{'p20':>9s} {'p80':>9s} {'vs torch':>8s} clk"
    )
    for row in table:
        op, sh, lab, tf, med, p20, p80, vs, clk = row
        log(
            f"{op:9s} {sh:16s} {lab:30s} {tf:8.1f} {med:9.1f} {p20:9.1f} {p80:9.1f} {vs:8.3f} {clk}"
        )


if __name__ == "__main__":
    main()
