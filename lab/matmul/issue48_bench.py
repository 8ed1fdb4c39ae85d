"""Issue 48's benchmark: the wgmma GEMM family at the issue's shapes against cuBLAS, eager torch
and torch.compile max-autotune, every kernel verified before it is timed.

    python3 -m lab.matmul.issue48_bench [--budget 280] [--compile-budget 120] [--ops ...]

Per (shape, op): each candidate schedule of the family (a few per shape, chosen from the tile
count: wide tiles where they fill the SMs, narrow and 64-row tiles and split-K where they do not)
is emitted, compiled (nvJitLink, sm_90a) and checked at that exact shape against a float64
reference on fresh inputs (gemm_bench.check: output poisoned with NaN first, relative error norm
and elementwise bounds that grow with K, two runs bitwise equal); only the schedules that pass are
timed. Baselines at the same inputs: eager torch (cuBLAS through torch.matmul / addmm; the fused
ops as a user writes them) and torch.compile(mode="max-autotune-no-cudagraphs") of the same
function, compiled once per (op, shape) while the compile budget lasts (each compile's wall time
recorded; what was skipped is listed). A baseline's output is compared with the reference too.
Timing: CUDA events, everything interleaved in one loop, a 512 MiB L2 flush before each run,
medians. TFLOP/s counts 2 M N K per product; the share of the card's dense bf16 peak comes from
factory.device; a kernel above the peak is flagged implausible.

Writes $OUT/issue48_bench.json after every record; prints a table and the issue's summary last
(plain: min and geomean of ours / cuBLAS; fused: min and geomean of ours / best(eager,
max-autotune); 8192^3 share of peak). Held-out shapes (odd sizes) are checked and timed after the
issue's shapes while the budget lasts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lab.matmul import gemm_bench as gb  # noqa: E402
from lab.matmul.variants import epilogue_irs, schedules  # noqa: E402

ISSUE_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 14336, 4096),
    (16384, 4096, 14336),
    (4096, 28672, 8192),
    (512, 4096, 4096),
    (128, 8192, 8192),
    (2048, 2048, 8192),
]
# held out: no dim a multiple of the tile (K a multiple of 8, as the tensor maps need)
HELDOUT_SHAPES = [(3000, 5000, 2056), (777, 4099, 1032), (4095, 4097, 4000), (1, 4096, 4096)]
FUSED = ("bias_gelu", "bias_silu", "residual", "relu2", "swiglu", "rowq_fp8", "groupq_fp8")
OPS = ("plain", *FUSED)
SMS = 132

OUT = os.environ.get("OUT", ".")
RES: dict = {"env": {}, "records": [], "skipped": [], "compile_s": {}, "errors": []}


def save():
    gb.RESULTS.setdefault("checks", [])
    RES["checks"] = gb.RESULTS["checks"]
    with open(os.path.join(OUT, "issue48_bench.json"), "w") as f:
        json.dump(RES, f, indent=1)


def log(*a):
    print(*a, flush=True)


def candidates(
    op: str,
    m: int,
    n: int,
    k: int,
    allow_splitk: bool,
    extra: list[str],
    allow_tma_store: bool = False,
    allow_cp_async: bool = False,
) -> list:
    """Schedule names (lab.matmul.variants.schedules) worth timing at this shape, those the
    validity predicate lets through for this op at this shape (split-K only with allow_splitk,
    the TMA-store epilogue only with allow_tma_store; with allow_cp_async and K % 64 != 0, each
    name's cp.async twin "<name>ca" where the variants have one, beside it)."""
    from factory.families.matmul import schedule as sched_mod

    irs, scheds = epilogue_irs(), schedules()
    names = _candidates(op, m, n, k, allow_splitk, extra)
    if allow_tma_store:
        names += ["glu128s4t128"] if op == "swiglu" else ["w256s4t128", "w256s3t256"]
        if op in ("rowq_fp8", "groupq_fp8"):
            names.append("w256s4t256")  # two 128-column fp8 boxes a consumer
    if allow_cp_async and (2 * k) % 128:
        names += [x + "ca" for x in names if x + "ca" in scheds]
    was = (
        sched_mod.SPLITK_VERIFIED,
        sched_mod.TMA_STORE_VERIFIED,
        sched_mod.TMA_STORE_FP8_VERIFIED,
        sched_mod.CP_ASYNC_VERIFIED,
    )
    sched_mod.SPLITK_VERIFIED = was[0] or allow_splitk
    sched_mod.TMA_STORE_VERIFIED = was[1] or allow_tma_store
    sched_mod.TMA_STORE_FP8_VERIFIED = was[2] or allow_tma_store
    sched_mod.CP_ASYNC_VERIFIED = was[3] or allow_cp_async
    dims = {"M": m, "N": n, "K": k, "Bt": 3}
    try:
        return [
            x
            for x in dict.fromkeys(names)
            if sched_mod.is_valid(irs[op], scheds[x]) is None
            and sched_mod.is_valid(irs[op], scheds[x], dims) is None
        ]
    finally:
        (
            sched_mod.SPLITK_VERIFIED,
            sched_mod.TMA_STORE_VERIFIED,
            sched_mod.TMA_STORE_FP8_VERIFIED,
            sched_mod.CP_ASYNC_VERIFIED,
        ) = was


def _candidates(op, m, n, k, allow_splitk, extra) -> list:
    if op == "swiglu":
        out = ["glu128s4"]
        if allow_splitk and math.ceil(m / 128) * math.ceil(n / 128) * 2 <= SMS:
            out.append("sk2glu128s4")
        return out + [x for x in extra if x.startswith(("glu", "cl2glu"))]
    wide = math.ceil(m / 128) * math.ceil(n / 256)
    out = ["w256s4"]
    if wide < 2 * SMS:
        # fewer than two waves of wide tiles: narrower or 64-row tiles fill more SMs (staged
        # where the output allows; the validity check drops what does not fit)
        out += ["w128s5", "w128s5t128", "w128s6t128", "w128s4c1", "w128s4c1t128", "w128s8c1"]
        out += ["w128s7c1t128"]
        out += ["w256s5c1", "w256s5c1t128"]
    else:
        out += ["w128s5"]
    if k < 4096:
        # a short K leaves the cooperative kernel's epilogue a large share of each tile: the
        # ping-pong consumers run one tile's epilogue beside the other's main loop
        out.append("pp128s6")
    if allow_splitk and wide * 2 <= SMS:
        out += ["sk2w256s4"]
        if wide * 4 <= SMS:
            out.append("sk4w256s4")
        if math.ceil(m / 128) * math.ceil(n / 128) * 2 <= SMS:
            out.append("sk2w128s4")
        if math.ceil(m / 64) * math.ceil(n / 128) * 4 <= 2 * SMS:
            out.append("sk4c1w128s4")
    return out + [x for x in extra if not x.startswith(("glu", "cl2glu"))]


def torch_fn(torch, name):
    """The operator as a function of its tensors (for eager and torch.compile alike)."""
    F = torch.nn.functional
    if name == "plain":
        return lambda a, b: torch.matmul(a, b.T)
    if name == "bias_gelu":
        return lambda a, b, bias: F.gelu(torch.addmm(bias, a, b.T), approximate="tanh")
    if name == "bias_silu":
        return lambda a, b, bias: F.silu(torch.addmm(bias, a, b.T))
    if name == "residual":
        return lambda a, b, res: torch.addmm(res, a, b.T)
    if name == "relu2":
        return lambda a, b: torch.square(F.relu(torch.matmul(a, b.T)))
    if name == "swiglu":
        return lambda a, b, b2: F.silu(torch.matmul(a, b.T)) * torch.matmul(a, b2.T)
    if name == "groupq_fp8":
        return lambda a, b: gb.group_quant(torch, torch.matmul(a, b.T))
    if name == "rowq_fp8":
        return lambda a, b, rs: (
            (torch.matmul(a, b.T) * rs[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        )
    raise KeyError(name)


def fn_args(name, t):
    extra = {
        "bias_gelu": "bias",
        "bias_silu": "bias",
        "residual": "res",
        "swiglu": "b2",
        "rowq_fp8": "rs",
    }
    return (t["a"], t["b"]) + ((t[extra[name]],) if name in extra else ())


def rel_err(torch, out, ref, name="", t=None) -> float:
    out = gb.dequant(torch, name, out, t)
    if not bool(torch.isfinite(out).all()):
        return float("nan")
    return float(torch.linalg.norm(out - ref) / torch.linalg.norm(ref))


def peak_tflops(gpu_name: str) -> float:
    from factory.device import device_for

    return device_for("sm_90").peak_bf16_flops_per_us / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: the issue's eight)")
    ap.add_argument("--heldout", default=",".join("x".join(map(str, s)) for s in HELDOUT_SHAPES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument(
        "--budget", type=float, default=250.0, help="no new (op, shape) after this many seconds"
    )
    ap.add_argument("--compile-budget", type=float, default=120.0)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines")
    ap.add_argument("--allow-splitk", action="store_true", help="verify and time split-K")
    ap.add_argument("--allow-cluster", action="store_true")
    ap.add_argument(
        "--allow-tma-store", action="store_true", help="verify and time the TMA-store epilogue"
    )
    ap.add_argument(
        "--allow-cp-async",
        action="store_true",
        help="time the cp.async twin of each candidate beside it where K %% 64 != 0",
    )
    ap.add_argument(
        "--allow-tma-store-fallback",
        action="store_true",
        help="staged kernels with their register-store fallback (held-out N %% 8 != 0)",
    )
    ap.add_argument("--extra", default="", help="more schedule names for every shape")
    ap.add_argument(
        "--compile-plain", action="store_true", help="max-autotune for the plain GEMM too"
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: emit and compile (nvJitLink) every kernel of the plan, print the plan",
    )
    args = ap.parse_args()
    start = time.time()
    from factory.families.matmul import schedule as sched_mod

    if args.allow_splitk:
        sched_mod.SPLITK_VERIFIED = True
    if args.allow_cluster:
        sched_mod.CLUSTER_VERIFIED = True
    if args.allow_tma_store:
        sched_mod.TMA_STORE_VERIFIED = True
        sched_mod.TMA_STORE_FP8_VERIFIED = True
    if args.allow_cp_async:
        sched_mod.CP_ASYNC_VERIFIED = True
    if args.allow_tma_store_fallback:
        sched_mod.TMA_STORE_FALLBACK_VERIFIED = True
    if args.dry_run:
        return dry_run(args)
    import torch

    dev = torch.cuda.get_device_properties(0)
    peak = peak_tflops(dev.name)
    RES["env"] = {
        "gpu": dev.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sms": dev.multi_processor_count,
        "peak_bf16_tflops": peak,
        "argv": sys.argv[1:],
    }
    try:
        import triton

        RES["env"]["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001 - a version line is a record, not a requirement
        RES["env"]["triton"] = f"unknown ({e})"
    log(RES["env"])
    torch.zeros(1, device="cuda")
    from cuda.bindings import driver as cu

    cu.cuInit(0)
    _, ctx = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(torch.cuda.current_device()))
    cu.cuCtxSetCurrent(ctx)
    import torch._dynamo
    import torch._inductor.config as ind

    # one compiled graph per (op, shape): room for all of them, no dynamic shapes, no cache
    # (each compile's time is its own); a setting this torch does not have is skipped
    for cfg, key, value in (
        (torch._dynamo.config, "recompile_limit", 1024),
        (torch._dynamo.config, "cache_size_limit", 1024),
        (torch._dynamo.config, "automatic_dynamic_shapes", False),
        (ind, "fx_graph_cache", False),
    ):
        try:
            setattr(cfg, key, value)
        except Exception as e:  # noqa: BLE001
            RES["errors"].append(f"config {key}: {e}")

    parse = _parse_shapes
    shapes = [(s, False) for s in (parse(args.shapes) if args.shapes else ISSUE_SHAPES)]
    shapes += [(s, True) for s in parse(args.heldout)]
    ops = [o for o in args.ops.split(",") if o]
    irs, scheds = epilogue_irs(), schedules()
    extra = [x for x in args.extra.split(",") if x]
    kernels: dict = {}
    gb_save = gb.save
    gb.save = lambda: (gb_save(), save())  # a hang exits from gemm_bench with both files
    compile_left = 0.0 if args.no_compile else args.compile_budget
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    table = []

    def kernel(op, sn):
        key = (op, sn)
        if key not in kernels:
            why = sched_mod.is_valid(irs[op], scheds[sn])
            if why:
                kernels[key] = why
            else:
                try:
                    kernels[key] = gb.Kernel(irs[op], scheds[sn])
                except Exception as e:  # noqa: BLE001
                    kernels[key] = f"build failed: {e}"
                    RES["errors"].append(f"{op} {sn}: {e}")
        return kernels[key]

    for (m, n, k), heldout in shapes:
        for op in ops:
            if time.time() - start > args.budget:
                RES["skipped"].append({"op": op, "shape": [m, n, k], "why": "run budget"})
                continue
            rec = {"op": op, "shape": [m, n, k], "heldout": heldout, "rows": {}}
            flops = 2.0 * m * n * k * (2 if op == "swiglu" else 1)
            # ours: check at this shape first
            good = {}
            for sn in candidates(
                op, m, n, k, args.allow_splitk, extra, args.allow_tma_store, args.allow_cp_async
            ):
                kern = kernel(op, sn)
                if isinstance(kern, str):
                    rec.setdefault("refused", {})[sn] = kern
                    continue
                try:
                    if gb.check(torch, kern, op, m, n, k, seed=hash((op, m, n, k, sn)) % 10**6):
                        good[kern.s.label()] = kern
                    else:
                        rec.setdefault("failed", []).append(kern.s.label())
                except Exception as e:  # noqa: BLE001
                    RES["errors"].append(f"{op} {sn} {m}x{n}x{k}: {e}")
                    traceback.print_exc()
                    if "ILLEGAL" in str(e) or "LAUNCH_FAILED" in str(e):
                        save()
                        raise
            # inputs for timing and the baselines
            gen = torch.Generator(device="cuda")
            gen.manual_seed(4800 + m + n + k)
            t = gb.make_inputs(torch, op, m, n, k, gen)
            ref = gb.reference(torch, op, t)
            eager = torch_fn(torch, op)
            argv = fn_args(op, t)
            runners = {"eager": lambda f=eager, a=argv: f(*a)}
            rec["baseline_rel_err"] = {"eager": rel_err(torch, eager(*argv), ref, op, t)}
            if op != "plain" or args.compile_plain:
                if compile_left > 0:
                    try:
                        c0 = time.time()
                        comp = torch.compile(
                            torch_fn(torch, op), mode="max-autotune-no-cudagraphs", dynamic=False
                        )
                        out = comp(*argv)
                        torch.cuda.synchronize()
                        spent = time.time() - c0
                        compile_left -= spent
                        RES["compile_s"][f"{op} {m}x{n}x{k}"] = round(spent, 1)
                        rec["baseline_rel_err"]["max_autotune"] = rel_err(torch, out, ref, op, t)
                        runners["max_autotune"] = lambda f=comp, a=argv: f(*a)
                    except Exception as e:  # noqa: BLE001
                        RES["errors"].append(f"compile {op} {m}x{n}x{k}: {e}")
                else:
                    RES["skipped"].append(
                        {"op": op, "shape": [m, n, k], "why": "max-autotune: compile budget"}
                    )
            del ref
            stream = torch.cuda.current_stream().cuda_stream
            dims = {"M": m, "N": n, "K": k, "Bt": gb.BATCH}
            for lab, kern in good.items():
                kern.bind(t, dims)
                runners[lab] = lambda kk=kern, st=stream: kk.launch(st)
            samples = {lab: [] for lab in runners}
            t0 = time.time()
            while time.time() - t0 < 0.15:
                for f in runners.values():
                    f()
                torch.cuda.synchronize()
            evs = []
            for _ in range(args.reps):
                for lab, f in runners.items():
                    flush.zero_()
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    f()
                    e1.record()
                    evs.append((lab, e0, e1))
            torch.cuda.synchronize()
            for lab, e0, e1 in evs:
                samples[lab].append(e0.elapsed_time(e1) * 1e3)
            rate(rec, samples, set(good), flops, peak)
            # the timed kernels' output (last run, timing inputs) still matches the reference
            if good:
                ref = gb.reference(torch, op, t)
                rec["timed_output_rel_err"] = rel_err(torch, t["c"], ref, op, t)
                del ref
            RES["records"].append(rec)
            save()
            r = rec["rows"]
            table.append(
                (
                    op,
                    f"{m}x{n}x{k}" + ("*" if heldout else ""),
                    rec.get("best", "-"),
                    r[rec["best"]]["tflops"] if "best" in rec else float("nan"),
                    r[rec["best"]]["share_of_peak"] if "best" in rec else float("nan"),
                    r["eager"]["tflops"],
                    r["max_autotune"]["tflops"] if "max_autotune" in r else float("nan"),
                    rec.get("vs_eager", float("nan")),
                    rec.get("vs_best_baseline", float("nan")),
                )
            )
            log(f"done {op} {m}x{n}x{k} ({time.time() - start:.0f} s)")
            del t

    summary = summarize(RES["records"])
    RES["summary"] = summary
    save()
    log("")
    log(
        f"{'op':9s} {'shape (*held out)':19s} {'ours (best verified)':30s} {'TFLOP/s':>7s} "
        f"{'peak':>5s} {'eager':>6s} {'max-at':>6s} {'x eag':>6s} {'x best':>6s}"
    )
    for op, sh, lab, tf, share, te, tm, ve, vb in table:
        log(
            f"{op:9s} {sh:19s} {lab[:30]:30s} {tf:7.1f} {share:5.0%} {te:6.1f} {tm:6.1f} "
            f"{ve:6.3f} {vb:6.3f}"
        )
    log(f"skipped: {len(RES['skipped'])} (see JSON); errors: {len(RES['errors'])}")
    log(json.dumps(summary))


def rate(rec: dict, samples: dict, ours: set, flops: float, peak: float) -> None:
    """Fill rec["rows"] (median, p20, p80, TFLOP/s, share of peak, implausible above it) from
    each runner's samples (microseconds), and rec["best"] (our fastest verified kernel) with its
    ratios: vs_eager, vs_max_autotune (when compiled) and vs_best_baseline (the faster of the
    two); > 1 means ours is faster."""
    for lab, xs in samples.items():
        med = float(np.median(xs))
        tf = flops / med / 1e6
        rec["rows"][lab] = {
            "median_us": med,
            "p20_us": float(np.percentile(xs, 20)),
            "p80_us": float(np.percentile(xs, 80)),
            "tflops": tf,
            "share_of_peak": tf / peak,
            "implausible": tf > peak,
        }
    r = rec["rows"]
    mine = {lab: x for lab, x in r.items() if lab in ours}
    if not mine:
        return
    best = min(mine, key=lambda x: mine[x]["median_us"])
    rec["best"] = best
    t = mine[best]["median_us"]
    rec["vs_eager"] = r["eager"]["median_us"] / t
    if "max_autotune" in r:
        rec["vs_max_autotune"] = r["max_autotune"]["median_us"] / t
    rec["vs_best_baseline"] = (
        min(r[x]["median_us"] for x in ("eager", "max_autotune") if x in r) / t
    )


def _parse_shapes(txt: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s.split("x")) for s in txt.split(",") if s]


def dry_run(args) -> int:
    """The plan without a GPU: which schedules each (op, shape) would check and time, each
    emitted and compiled for sm_90a here (registers, spills); exit status 1 if any fails."""
    from factory.compile import compile_ptx
    from factory.families.matmul import schedule as sched_mod
    from factory.families.matmul.emit import emit

    irs, scheds = epilogue_irs(), schedules()
    shapes = _parse_shapes(args.shapes) if args.shapes else ISSUE_SHAPES
    shapes += _parse_shapes(args.heldout)
    extra = [x for x in args.extra.split(",") if x]
    built: dict = {}
    bad = 0
    for m, n, k in shapes:
        for op in [o for o in args.ops.split(",") if o]:
            names = candidates(
                op, m, n, k, args.allow_splitk, extra, args.allow_tma_store, args.allow_cp_async
            )
            line = []
            for sn in names:
                if (op, sn) not in built:
                    why = sched_mod.is_valid(irs[op], scheds[sn], {"M": m, "N": n, "K": k})
                    if why:
                        built[(op, sn)] = f"refused: {why}"
                    else:
                        r = compile_ptx(emit(irs[op], scheds[sn]).ptx, "sm_90a", cache=False)
                        built[(op, sn)] = (
                            f"{r.registers} regs, {r.spill_store_bytes} B spilled"
                            if r.ok
                            else "COMPILE FAILED"
                        )
                        bad += not r.ok
                line.append(f"{sn} ({built[(op, sn)]})")
            log(f"{op:9s} {m}x{n}x{k}: " + "; ".join(line))
    return 1 if bad else 0


def summarize(records: list) -> dict:
    """The issue's criteria over the issue's (not held-out) shapes that were timed."""
    out: dict = {}
    plain = [
        r["vs_eager"] for r in records if r["op"] == "plain" and not r["heldout"] and "best" in r
    ]
    if plain:
        out["plain_vs_cublas_min"] = min(plain)
        out["plain_vs_cublas_geomean"] = float(np.exp(np.mean(np.log(plain))))
    fused = [
        r["vs_best_baseline"]
        for r in records
        if r["op"] != "plain" and not r["heldout"] and "vs_best_baseline" in r
    ]
    if fused:
        out["fused_vs_best_min"] = min(fused)
        out["fused_vs_best_geomean"] = float(np.exp(np.mean(np.log(fused))))
        out["fused_with_max_autotune"] = sum(
            1
            for r in records
            if r["op"] != "plain" and not r["heldout"] and "max_autotune" in r["rows"]
        )
        out["fused_timed"] = len(fused)
    for r in records:
        if r["op"] == "plain" and r["shape"] == [8192, 8192, 8192] and "best" in r:
            out["plain_8192_share_of_peak"] = r["rows"][r["best"]]["share_of_peak"]
    out["unverified_or_failed"] = sorted(
        {f"{r['op']} {lab}" for r in records for lab in r.get("failed", [])}
    )
    return out


if __name__ == "__main__":
    sys.exit(main() or 0)
