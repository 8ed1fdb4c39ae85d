"""Bench of the attention emitter on the GPU (issue 49): check every kernel, then time it beside
SDPA (flash, cuDNN), flex_attention under torch.compile, and eager attention.

    python3 -m lab.attention.bench [--out DIR] [--budget-s 230] [--quick] [--swap-v-offsets]
        [--phase all|check|time [--checked CHECK_JSON]] [--variants plain,alibi,...]
        [--labels 128x128s2ovpp,...] [--shapes 0,1,3] [--dry-run]

`--labels` keeps those schedules of CHECK_SCHEDULES only, `--shapes` those TIME_SHAPES (by
index); `--dry-run` (no GPU, no torch) emits and compiles every selected kernel here, prints
their registers and spills and the cases the time phase would run, and exits.

lab/attention/run_device.sh runs the check phase and then the time phase in separate processes
(a kernel that hangs in the first leaves the baselines' timings of the second).

1. Checks, before any timing. For each variant (plain, soft cap 30 tanh(s/30), ALiBi, sliding
   window, document mask; causal and not), each schedule of the check list and each check shape
   (small, held-out odd lengths not a multiple of any tile, GQA, head dims 64 and 128): fresh
   random inputs (the seed from the clock, recorded), outputs poisoned with NaN, the kernel run
   twice (the two outputs must be bitwise equal), compared with the factory's float64 reference
   (factory.spec.reference, the same the judge uses) with the manifest's tolerances for o (bf16)
   and lse (fp32). Every first launch waits under a watchdog: a kernel that hangs ends the
   process with the results so far written. A kernel that fails any check is never timed.
2. Timings at the issue's shapes (4x32x4096x128, 1x32x16384x128, 8x32x2048x64, GQA
   4x32(8)x8192x128; causal and not): ours (each kernel that passed), SDPA flash and cuDNN (plain
   operator), flex_attention compiled (same score and mask), eager where its fp32 score matrix
   fits in 4 GiB (with --eager). CUDA events around each run, a 256 MiB read flushing L2 before
   each, runners interleaved, median and p20/p80 over the reps; TFLOP/s of the unmasked work
   (the band's pairs, the document mask's pairs counted from the ids). One pass: plain first
   (beside SDPA), then ALiBi, window, document and soft cap beside flex; once the budget runs
   low, ours alone (recorded), then nothing. JSON is written after every case to
   OUT/attention_<phase>.json; a table is printed last.

Our kernels are compiled by ptxas as a whole program where the CUDA toolkit is present
(setmaxnreg honoured; wholeprog.py), a "jit" label by nvJitLink (setmaxnreg ignored, as in run 1
and in the GPU worker). The check phase runs the overlapped and ping-pong kernels last, so a hang
there (the watchdog ends the process) leaves the other kernels checked.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from factory.compile import compile_ptx  # noqa: E402
from factory.families.attention import emit as attn_emit  # noqa: E402
from factory.families.attention import features as F  # noqa: E402
from factory.families.attention.ir import lower  # noqa: E402
from factory.families.attention.schedule import AttentionSchedule, is_valid  # noqa: E402
from factory.families.attention.wholeprog import (  # noqa: E402
    compile_whole,
    find_ptxas,
    setmaxnreg_ignored,
)
from factory.spec import eval_dim_expr, load_manifest  # noqa: E402
from factory.spec.reference import reference, to_storage  # noqa: E402
from gpuworker import tensormap  # noqa: E402
from lab.attention.variants import VARIANTS, manifest  # noqa: E402

RESULTS: dict = {"env": {}, "checks": [], "timings": [], "compile": {}, "errors": []}
OUT = "."
T0 = time.time()

# the schedules checked (and, where they pass, timed) per head dim, each with its compiler:
# "whole" = ptxas on the PTX as a whole program (setmaxnreg honoured: producer 40 registers,
# consumers 232), "jit" = nvJitLink (relocatable: setmaxnreg ignored, every thread at the
# launch count), the compiler of run 1 and of the GPU worker
# ping-pong kernels also take the polynomial tanh (a no-op without a tanh in the score)
OV, PP = {"overlap": True}, {"overlap": True, "pingpong": True, "poly_tanh": True}
PPP = {**PP, "persistent": True}  # one CTA an SM walking the work tiles (not the document)
CHECK_SCHEDULES = {
    128: {
        "128x128s2": (AttentionSchedule(128, 128, 2), "whole"),
        "128x128s2jit": (AttentionSchedule(128, 128, 2), "jit"),
        "128x128s3ov": (AttentionSchedule(128, 128, 3, **OV), "whole"),
        "128x128s2ovpp": (AttentionSchedule(128, 128, 2, **PP), "whole"),
        "128x128s3ovpp": (AttentionSchedule(128, 128, 3, **PP), "whole"),
        "128x176s2ovpp": (AttentionSchedule(128, 176, 2, **PP), "whole"),
        "128x128s2ovppP": (AttentionSchedule(128, 128, 2, **PPP), "whole"),
        "128x128s2ovppX": (AttentionSchedule(128, 128, 2, overlap=True, pingpong=True), "whole"),
    },
    64: {
        "128x128s3": (AttentionSchedule(128, 128, 3), "whole"),
        "128x128s3ov": (AttentionSchedule(128, 128, 3, **OV), "whole"),
        "128x128s3ovpp": (AttentionSchedule(128, 128, 3, **PP), "whole"),
        "128x176s3ovpp": (AttentionSchedule(128, 176, 3, **PP), "whole"),
        "128x128s3ovppP": (AttentionSchedule(128, 128, 3, **PPP), "whole"),
    },
}
# labels built for some variants only: the jit build on plain attention (the compiler's
# effect), the exact tanh beside the polynomial one on the soft cap, and the 176-key tiles
# where they compile without spills at 232 registers (not the soft cap; at D=128 not the
# document mask)
ONLY = {
    "128x128s2jit": ("plain",),
    "128x128s2ovppX": ("softcap",),
    "128x176s2ovpp": ("plain", "alibi", "window"),
    "128x176s3ovpp": ("plain", "alibi", "window", "document"),
}
# (B, H, HKV, S, D): small, odd held-out lengths (a partial last tile; one shorter than a tile),
# GQA (4 query heads a kv head), longer than the 1024 window, head dims 128 and 64
CHECK_SHAPES = [
    (1, 2, 2, 256, 128),
    (2, 4, 1, 333, 128),
    (1, 3, 3, 77, 128),
    (1, 2, 1, 1300, 128),
    (1, 2, 1, 1000, 64),
    (1, 2, 2, 1300, 64),
]
# extra checks with the second half's query rows scaled up: the soft cap's scores then leave
# the polynomial tanh's range in some warps of a tile and not in others (both paths and the
# warps' vote run; 320 rows: tile 1's first warp fast, its others not)
LOUD_CHECKS = {"softcap": [((1, 2, 2, 320, 128), 12.0), ((1, 2, 1, 333, 64), 12.0)]}
TIME_SHAPES = [
    (4, 32, 32, 4096, 128),
    (1, 32, 32, 16384, 128),
    (8, 32, 32, 2048, 64),
    (4, 32, 8, 8192, 128),
]


def log(*a):
    print(*a, flush=True)


RESULTS_NAME = "attention_all.json"


def save():
    with open(os.path.join(OUT, RESULTS_NAME), "w") as f:
        json.dump(RESULTS, f, indent=1)


def left_s(budget: float) -> float:
    return budget - (time.time() - T0)


def wait_or_die(torch, what: str, seconds: float = 10.0):
    """Poll the stream's completion; a kernel stuck on a barrier ends the run (results kept)."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > seconds:
            log(f"HANG: {what} did not finish in {seconds} s")
            RESULTS["hang"] = what
            save()
            os._exit(3)
        time.sleep(0.0005)


def shape_dims(shape) -> dict:
    b, h, hkv, s, _ = shape
    return {"B": b, "H": h, "HKV": hkv, "S": s}


def workload(variant: str, causal: bool, shape, window: int = 1024):
    b, h, hkv, s, d = shape
    return load_manifest(manifest(variant, causal, d, shape_dims(shape), window=window))


# compiled kernels kept on the GPU host between the check and the time process (the same PTX
# and compiler give the same cubin; the time phase then skips a minute of ptxas on busy cores)
CUBIN_CACHE = os.environ.get("ATTN_CUBIN_CACHE", os.path.join(tempfile.gettempdir(), "attn_cubins"))


def compile_with(ptx: str, compiler: str):
    """The CompileReport of `ptx` for sm_90a by ptxas as a whole program ("whole") or by
    nvJitLink ("jit"), kept in CUBIN_CACHE under the hash of both."""
    import hashlib
    import pickle

    use_whole = compiler == "whole" and find_ptxas() is not None
    key = hashlib.sha256(f"{use_whole}\0{ptx}".encode()).hexdigest()
    path = os.path.join(CUBIN_CACHE, key + ".pkl")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # noqa: S301 - written by this bench on this host
    except (OSError, pickle.PickleError, EOFError):
        pass
    if use_whole:
        rep = compile_whole(ptx, "sm_90a")
    else:
        rep = compile_ptx(ptx, "sm_90a", cache=False)  # "jit", or no toolkit here (recorded)
    try:
        os.makedirs(CUBIN_CACHE, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump(rep, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return rep


class Kernel:
    """One emitted kernel, compiled here (ptxas whole program or nvJitLink) and launched
    through the driver."""

    def __init__(self, ir, sched: AttentionSchedule, em=None, report=None, compiler="whole"):
        from cuda.bindings import driver as cu

        self.ir, self.s = ir, sched
        self.em = em or attn_emit.emit(ir, sched)
        r = report or compile_with(self.em.ptx, compiler)
        if not r.ok:
            raise RuntimeError(r.log[-2000:])
        self.report = r
        err, self.mod = cu.cuModuleLoadData(r.cubin)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        err, self.fn = cu.cuModuleGetFunction(self.mod, self.em.entry.encode())
        assert err == cu.CUresult.CUDA_SUCCESS, err
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (err,) = cu.cuFuncSetAttribute(self.fn, attr, self.em.launch.smem_bytes)
        assert err == cu.CUresult.CUDA_SUCCESS, err

    def bind(self, tensors: dict, dims: dict):
        keep, ptrs = [], []
        for p in self.em.params:
            if p.kind == "tmap":
                arg = tensormap.encode_param(
                    {"dims": list(p.dims), "box": list(p.box), "swizzle": p.swizzle},
                    tensors[p.name].data_ptr(),
                    dims,
                    self.ir.dtype,
                )
            elif p.kind == "tensor":
                arg = ctypes.c_uint64(tensors[p.name].data_ptr())
            elif p.kind == "dim":
                arg = ctypes.c_uint32(int(dims[p.name]))
            else:
                raise ValueError(p.kind)
            keep.append(arg)
            ptrs.append(ctypes.addressof(arg))
        arr = (ctypes.c_void_p * len(ptrs))(*ptrs)
        grid = [int(eval_dim_expr(g, dims)) for g in self.em.launch.grid]
        self._args = (keep, arr, grid)

    def launch(self, stream: int):
        from cuda.bindings import driver as cu

        _, arr, grid = self._args
        b = self.em.launch.block
        (err,) = cu.cuLaunchKernel(
            self.fn, *grid, *b, self.em.launch.smem_bytes, stream, ctypes.addressof(arr), 0
        )
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"launch: {err}")


def np_inputs(w, dims: dict, seed: int, q_scale: float = 1.0) -> dict:
    """Storage-form inputs: q, k, v standard normal (scores of about unit spread; the query
    rows of the second half of the sequence times `q_scale`), ALiBi slopes in [0.001, 0.1],
    document ids sorted per batch entry (contiguous documents)."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in w.inputs:
        shape = tuple(dims[x] if isinstance(x, str) else x for x in d.shape)
        if d.name == "doc":
            out[d.name] = np.sort(rng.integers(0, 4, size=shape), axis=-1).astype(np.int32)
        elif d.name == "slope":
            out[d.name] = rng.uniform(0.001, 0.1, size=shape).astype(np.float32)
        else:
            a = rng.standard_normal(shape)
            if d.name == "q" and q_scale != 1.0:
                a[..., shape[-2] // 2 :, :] *= q_scale
            out[d.name] = to_storage(a, d.dtype)
    return out


def to_torch(torch, arr: np.ndarray, dtype: str):
    if dtype == "bf16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(arr).cuda()


_REFS: dict = {}


def check(
    torch, kern: Kernel, w, variant: str, causal: bool, shape, seed: int, q_scale: float = 1.0
) -> bool:
    dims = shape_dims(shape)
    key = (variant, causal, tuple(shape), seed, q_scale)
    if key not in _REFS:  # the same inputs and reference for every schedule of a variant
        if len(_REFS) > 128:
            _REFS.clear()
        x = np_inputs(w, dims, seed, q_scale)
        _REFS[key] = (x, reference(w, x, dims))
    x, ref = _REFS[key]
    t = {d.name: to_torch(torch, x[d.name], d.dtype) for d in w.inputs}
    ir = kern.ir
    t[ir.out] = torch.empty(ref[ir.out].shape, dtype=torch.bfloat16, device="cuda")
    if ir.lse:
        t[ir.lse] = torch.empty(ref[ir.lse].shape, dtype=torch.float32, device="cuda")
    kern.bind(t, dims)
    stream = torch.cuda.current_stream().cuda_stream
    runs = []
    what = f"{variant}{' causal' if causal else ''} {kern.s.label()} {shape}"
    for _ in range(2):
        t[ir.out].fill_(float("nan"))
        if ir.lse:
            t[ir.lse].fill_(float("nan"))
        kern.launch(stream)
        wait_or_die(torch, what)
        runs.append({n: t[n].clone() for n in (ir.out, ir.lse) if n})
    rec = {"variant": variant, "causal": causal, "schedule": kern.s.label(), "shape": shape}
    rec["seed"], rec["q_scale"] = seed, q_scale
    ok = True
    for o in w.outputs:
        got = runs[0][o.name].double().cpu().numpy()
        want = ref[o.name]
        tol = w.tolerance[o.dtype]
        finite = bool(np.isfinite(got).all())
        diff = np.abs(got - want)
        rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        bad = int((diff > tol.atol + tol.rtol * np.abs(want)).sum()) if finite else got.size
        same = bool(torch.equal(runs[0][o.name], runs[1][o.name])) if finite else False
        this = finite and rel <= tol.rel_norm and bad == 0 and same
        rec[o.name] = {
            "rel_norm": rel if finite else None,
            "max_err": float(diff.max()) if finite else None,
            "n_bad": bad,
            "repeat_equal": same,
            "finite": finite,
            "ok": this,
        }
        if not finite:
            rec[o.name]["nan_count"] = int(np.isnan(got).sum())
        ok &= this
    rec["ok"] = ok
    RESULTS["checks"].append(rec)
    save()
    parts = " ".join(
        f"{n}: rel {rec[n]['rel_norm']} bad {rec[n]['n_bad']}" for n in (ir.out, ir.lse) if n
    )
    log(f"check {what}: {parts} -> {'OK' if ok else 'FAIL'}")
    return ok


def _key(name: str):
    variant, causal, d, lab = name.split("/")
    return variant, causal == "True", int(d), lab


LABELS: set | None = None  # --labels: the CHECK_SCHEDULES labels kept (None: all)


def compile_all(variants, only, load: bool = True) -> dict:
    """{(variant, causal, d, label): Kernel or None} for every checked schedule (or those in
    `only`), compiled side by side. Without `load` (--dry-run): {key: CompileReport}, nothing
    loaded on a GPU."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    todo = []
    for variant in variants:
        for causal in (False, True):
            for d, scheds in CHECK_SCHEDULES.items():
                ir = lower(workload(variant, causal, (1, 2, 1, 64, d)))
                for lab, (sched, compiler) in scheds.items():
                    if only is not None and (variant, causal, d, lab) not in only:
                        continue
                    if variant not in ONLY.get(lab, (variant,)):
                        continue
                    if LABELS is not None and lab not in LABELS:
                        continue
                    if is_valid(ir, sched) is None:
                        em = attn_emit.emit(ir, sched)
                        todo.append(((variant, causal, d, lab), ir, sched, em, compiler))
    RESULTS["env"]["ptxas"] = find_ptxas()
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        reports = list(pool.map(lambda x: compile_with(x[3].ptx, x[4]), todo))
    log(f"compiled {len(todo)} kernels at {time.time() - T0:.1f} s")
    if not load:
        return {key: rep for (key, *_), rep in zip(todo, reports, strict=True)}
    out = {}
    for (key, ir, sched, em, compiler), rep in zip(todo, reports, strict=True):
        name = "/".join(str(x) for x in key)
        RESULTS["compile"][name] = {
            "ok": rep.ok,
            "compiler": compiler,
            "compiler_version": rep.nvjitlink_version,
            "spill_bytes": rep.spill_store_bytes,
            "stack_bytes": rep.stack_bytes,
            "registers": rep.registers,
            "setmaxnreg_ignored": setmaxnreg_ignored(rep),
        }
        try:
            if rep.spill_store_bytes or rep.spill_load_bytes or rep.stack_bytes:
                raise RuntimeError(f"spills or stack: {rep.spill_store_bytes} B, not run")
            kern = Kernel(ir, sched, em, rep)
            kern.sha = hashlib.sha256(em.ptx.encode()).hexdigest()
            out[key] = kern
        except Exception as e:  # noqa: BLE001
            RESULTS["errors"].append(f"{name}: {str(e)[:500]}")
            out[key] = None
    save()
    return out


def unmasked_pairs(w, ir, dims: dict, tensors: dict) -> float:
    """(query, key) pairs the mask keeps, over every batch entry and query head."""
    s, hq, bsz = dims["S"], dims["H"], dims["B"]
    if not ir.elementwise:
        return bsz * hq * F.kept_pairs(s, s, ir.band_lo, ir.band_hi)
    doc = tensors["doc"].cpu().numpy()
    total = 0.0
    for b in range(bsz):
        _, counts = np.unique(doc[b], return_counts=True)
        for n in counts:  # documents are contiguous runs of ids
            if ir.band_hi == 0 and ir.band_lo is None:
                total += n * (n + 1) / 2
            else:
                total += n * n
    return total * hq


def doc_ids(bsz: int, s: int) -> np.ndarray:
    """The timed document ids: documents of 256 to 2048 tokens (generator seed 7), the ids
    increasing along each sequence."""
    rng = np.random.default_rng(7)
    doc = np.zeros((bsz, s), np.int32)
    for b in range(bsz):
        pos, i = 0, 0
        while pos < s:
            n = int(rng.integers(256, 2049))
            doc[b, pos : pos + n] = i
            pos, i = pos + n, i + 1
    return doc


def time_case(
    torch,
    kerns: dict,
    w,
    variant: str,
    causal: bool,
    shape,
    reps: int,
    budget: float,
    flex: bool,
    eager: bool = False,
):
    """Ours (every passing kernel) beside SDPA flash/cuDNN (plain only), flex compiled (with
    `flex`, while the budget lasts) and eager (with `eager`, where its fp32 scores fit)."""
    from factory.families.attention import baselines as B

    dims = shape_dims(shape)
    bsz, h, hkv, s, d = shape
    ir = lower(w)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    t = {
        ir.q: torch.randn(bsz, h, s, d, device="cuda", generator=gen).to(torch.bfloat16),
        ir.k: torch.randn(bsz, hkv, s, d, device="cuda", generator=gen).to(torch.bfloat16),
        ir.v: torch.randn(bsz, hkv, s, d, device="cuda", generator=gen).to(torch.bfloat16),
    }
    if variant == "alibi":
        t["slope"] = torch.linspace(0.001, 0.1, h, device="cuda")
    if variant == "document":
        t["doc"] = torch.from_numpy(doc_ids(bsz, s)).cuda()
    t[ir.out] = torch.empty(bsz, h, s, d, device="cuda", dtype=torch.bfloat16)
    if ir.lse:
        t[ir.lse] = torch.empty(bsz, h, s, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    runners = {}
    for lab, kern in kerns.items():
        kern.bind(t, dims)
        runners[f"ours {lab}"] = (lambda kk: lambda: kk.launch(stream))(kern)
    inputs = {n: t[n] for n in (ir.q, ir.k, ir.v, *(x.name for x in ir.extra))}
    skipped = {}
    fns = {}  # baselines: label -> fn(inputs) -> {output name: tensor}
    if variant == "plain":
        wp = load_manifest(manifest("plain", causal, d, dims, lse=False))
        for backend in ("flash", "cudnn"):
            fns[f"sdpa {backend}"] = B.sdpa(wp, backend)
    if not flex:
        skipped["flex compiled"] = "not asked (plain: SDPA) or no budget"
    elif left_s(budget) > 20:
        torch._dynamo.reset()  # each case compiles afresh: no earlier case's graphs or limits
        fn = B.flex(w, compile_flex=True)
        try:
            t0 = time.time()
            fn(inputs)
            torch.cuda.synchronize()
            RESULTS.setdefault("flex_compile_s", []).append(round(time.time() - t0, 1))
            fns["flex compiled"] = fn
        except Exception as e:  # noqa: BLE001 - a baseline that fails is recorded, not fatal
            skipped["flex compiled"] = f"error: {str(e)[:300]}"
    else:
        skipped["flex compiled"] = "time budget"
    if not eager:
        pass  # not a criterion of the issue; costs seconds a case
    elif bsz * h * s * s * 4 <= 4 * 2**30:
        fns["eager"] = B.eager(w)
    else:
        skipped["eager"] = "fp32 score matrix over 4 GiB"
    for lab, fn in fns.items():
        runners[lab] = (lambda f: lambda: f(inputs))(fn)
    for lab, f in list(runners.items()):
        try:
            f()
            wait_or_die(torch, lab, 20.0)  # a kernel that hangs ends the phase
        except Exception as e:  # noqa: BLE001
            skipped[lab] = f"error: {str(e)[:300]}"
            runners.pop(lab)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    t_warm = time.time()
    while time.time() - t_warm < 0.2:
        for f in runners.values():
            f()
        torch.cuda.synchronize()
    evs = []
    for _ in range(reps):
        for lab, f in runners.items():
            flush.sum()  # a read of 256 MiB: the L2 holds none of the inputs
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            evs.append((lab, e0, e1))
    torch.cuda.synchronize()
    samples: dict = {lab: [] for lab in runners}
    for lab, e0, e1 in evs:
        samples[lab].append(e0.elapsed_time(e1) * 1e3)
    pairs = unmasked_pairs(w, ir, dims, t)
    flops = 4.0 * d * pairs
    rows = {}
    for lab, xs in samples.items():
        xs = np.array(xs)
        med = float(np.median(xs))
        rows[lab] = {
            "median_us": med,
            "p20_us": float(np.percentile(xs, 20)),
            "p80_us": float(np.percentile(xs, 80)),
            "tflops": flops / med / 1e6,
            "samples_us": [round(float(v), 2) for v in xs],
        }
    # the timed kernels' outputs again, after timing, against a baseline's (sdpa flash for the
    # plain operator, else flex or eager: the same operator)
    ref_lab = next(
        (lab for lab in ("sdpa flash", "flex compiled", "eager") if lab in runners), None
    )
    if kerns and ref_lab is not None:
        want = fns[ref_lab](inputs)[ir.out].double()
        for lab, kern in kerns.items():
            t[ir.out].fill_(float("nan"))
            kern.launch(stream)
            wait_or_die(torch, lab)
            got = t[ir.out].double()
            rel = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
            rows[f"ours {lab}"]["after_timing_rel_vs"] = {ref_lab: rel}
    rec = {
        "variant": variant,
        "causal": causal,
        "shape": list(shape),
        "unmasked_flops": flops,
        "rows": rows,
        "skipped": skipped,
        "pass": "one",
    }
    RESULTS["timings"].append(rec)
    save()
    return rec


def dry_run(variants, time_shapes) -> None:
    """--dry-run: emit and compile the selected kernels on this machine (ptxas as a whole
    program where present, else nvJitLink), print registers and spills, and the timed cases."""
    RESULTS["env"] = {"dry_run": True}
    reps = compile_all(variants, only=None, load=False)
    bad = 0
    for (variant, causal, d, lab), r in sorted(reps.items()):
        spill = r.spill_store_bytes + r.spill_load_bytes + r.stack_bytes
        bad += (not r.ok) or spill > 0
        log(
            f"{variant:9s} {str(causal):5s} d{d:<4d} {lab:16s} ok={r.ok} regs={r.registers} "
            f"spill={spill}"
        )
    order = ("plain", "alibi", "window", "document", "softcap")
    for v in sorted(variants, key=lambda v: order.index(v) if v in order else 9):
        for sh in time_shapes:
            for c in (True, False):
                log(f"would time {v} causal={c} {sh}")
    log(f"dry run: {len(reps)} kernels compiled, {bad} failed or spilled")
    if bad:
        sys.exit(1)


def main():
    global OUT, RESULTS_NAME
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=230.0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="plain and soft cap, two shapes")
    ap.add_argument("--swap-v-offsets", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--eager", action="store_true", help="time materialised attention too")
    ap.add_argument(
        "--phase",
        default="all",
        choices=("all", "check", "time"),
        help="check only, or time only the kernels that passed in --checked (its own process)",
    )
    ap.add_argument("--checked", default="", help="the check phase's JSON (--phase time)")
    ap.add_argument("--labels", default="", help="schedule labels kept (default: all)")
    ap.add_argument("--shapes", default="", help="TIME_SHAPES indices kept (default: all)")
    ap.add_argument(
        "--dry-run", action="store_true", help="compile here and list the cases; no GPU"
    )
    args = ap.parse_args()
    OUT = args.out
    global LABELS
    if args.labels:
        LABELS = set(args.labels.split(","))
    time_shapes = TIME_SHAPES
    if args.shapes:
        time_shapes = [TIME_SHAPES[int(i)] for i in args.shapes.split(",")]
    if args.dry_run:
        dry_run(args.variants.split(","), time_shapes)
        return
    RESULTS_NAME = f"attention_{args.phase}.json"
    if args.phase == "time" and not args.checked:
        args.checked = os.path.join(OUT, "attention_check.json")
    os.makedirs(OUT, exist_ok=True)
    attn_emit.SWAP_V_OFFSETS = args.swap_v_offsets
    import torch

    prop = torch.cuda.get_device_properties(0)
    RESULTS["env"] = {
        "gpu": prop.name,
        "sms": prop.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "swap_v_offsets": args.swap_v_offsets,
    }
    log(RESULTS["env"])
    torch.zeros(1, device="cuda")
    from cuda.bindings import driver as cu

    cu.cuInit(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(torch.cuda.current_device()))
    cu.cuCtxSetCurrent(ctx)
    variants = args.variants.split(",")
    if args.quick:
        variants = [v for v in variants if v in ("plain", "softcap")]
    seed = int(time.time() * 1000) % 2**31
    RESULTS["seed"] = seed

    # 1. checks: every (variant, causal, schedule) at every check shape, before any timing.
    # The IR names its dims, so the kernel checked here is the one timed below (the time phase
    # in its own process recompiles the same PTX, matched by its hash). Compiled side by side
    # first (nvJitLink releases the GIL).
    passed: dict = {}  # (variant, causal, d) -> {label: Kernel}
    if args.phase in ("all", "check"):
        kernels = compile_all(variants, only=None)

        def risk(key):  # the newest loop structures last: a hang there ends the phase
            lab = key[3]
            return (lab.endswith(("P", "X")), "pp" in lab, "ov" in lab)

        for variant, causal, d, lab in sorted(kernels, key=risk):
            kern = kernels[(variant, causal, d, lab)]
            good = passed.setdefault((variant, causal, d), {})
            if kern is None:
                continue
            ok = True
            shapes = [(sh, 1.0) for sh in CHECK_SHAPES if sh[4] == d]
            shapes += [(sh, qs) for sh, qs in LOUD_CHECKS.get(variant, []) if sh[4] == d]
            for i, (sh, qs) in enumerate(shapes):
                w = workload(variant, causal, sh)
                try:
                    ok &= check(torch, kern, w, variant, causal, sh, seed + i, qs)
                except Exception as e:  # noqa: BLE001
                    RESULTS["errors"].append(f"check {variant} {lab} {sh}: {e}")
                    traceback.print_exc()
                    ok = False
            if ok:
                good[lab] = kern
                RESULTS.setdefault("passed", {})[f"{variant}/{causal}/{d}/{lab}"] = kern.sha
        save()
        log(f"checks done at {time.time() - T0:.1f} s")
    if args.phase == "time":
        with open(args.checked) as f:
            checked = json.load(f).get("passed", {})
        RESULTS["checked_from"] = args.checked
        only = {tuple(_key(k)) for k in checked}
        kernels = compile_all(variants, only=only)
        for (variant, causal, d, lab), kern in kernels.items():
            good = passed.setdefault((variant, causal, d), {})
            name = f"{variant}/{causal}/{d}/{lab}"
            if kern is not None and checked.get(name) == kern.sha:
                good[lab] = kern  # the very PTX that passed the check phase
            elif kern is not None:
                RESULTS["errors"].append(f"{name}: PTX differs from the checked one; not timed")
    if args.phase == "check":
        return

    # 2. timings, one pass: plain beside SDPA flash and cuDNN first, then each variant beside
    # flex_attention compiled (ALiBi, window and document first: they had no valid flex
    # number yet); when the budget runs low, ours alone (no flex compile), then nothing.
    shapes = time_shapes[:2] if args.quick else time_shapes
    table = []
    order = ("plain", "alibi", "window", "document", "softcap")
    ordered = sorted(variants, key=lambda v: order.index(v) if v in order else 9)
    cases = [(v, sh, c) for v in ordered for sh in shapes for c in (True, False)]
    for variant, shape, causal in cases:
        if left_s(args.budget_s) < 6:
            RESULTS["errors"].append(f"time budget: {variant} {shape} causal={causal} untimed")
            continue
        flex = variant != "plain" and left_s(args.budget_s) > 25
        d = shape[4]
        w = workload(variant, causal, shape)
        kerns = passed.get((variant, causal, d), {})
        try:
            rec = time_case(
                torch,
                kerns,
                w,
                variant,
                causal,
                shape,
                args.reps,
                args.budget_s,
                flex,
                args.eager,
            )
        except Exception as e:  # noqa: BLE001
            RESULTS["errors"].append(f"time {variant} {shape} {causal}: {str(e)[:500]}")
            traceback.print_exc()
            save()
            continue
        for lab, row in rec["rows"].items():
            table.append((variant, causal, shape, lab, row["median_us"], row["tflops"]))
    RESULTS["wall_s"] = round(time.time() - T0, 1)
    save()
    n_ok = sum(1 for c in RESULTS["checks"] if c["ok"])
    log(f"\nchecks: {n_ok} of {len(RESULTS['checks'])} passed; wall {RESULTS['wall_s']} s")
    log(
        f"{'variant':9s} {'causal':6s} {'shape':22s} {'runner':22s} "
        f"{'median us':>10s} {'TFLOP/s':>8s}"
    )
    for variant, causal, shape, lab, med, tf in table:
        sh = "x".join(str(x) for x in shape)
        log(f"{variant:9s} {str(causal):6s} {sh:22s} {lab:22s} {med:10.1f} {tf:8.1f}")


if __name__ == "__main__":
    main()
