"""Costs the next step for K % 16 != 0 (bench/results/2026-12-07-h100-matmul-3): copy A's and B's
rows into buffers of pitch K' = K rounded up to 16 (the columns K..K'-1 zero), then run the
staged 128x256 kernel at K' (K' % 16 == 0 ran at 0.94-0.96x cuBLAS, K = 2056 at 0.62x).

    OUT=<dir> python -m lab.matmul.padk_probe [--shapes 3072x5120x2056,...] [--reps 20]
    python -m lab.matmul.padk_probe --dry-run     # no GPU: emits and compiles the kernel

For each shape, on the same inputs, interleaved in one loop (CUDA events, a 512 MiB L2 flush
before every run, medians):
  torch      cuBLAS (torch a @ b.T) at K
  direct     our kernel on A and B at K (the slow pitch)
  copy_ab    A and B copied into the padded buffers (two strided copies)
  copy_a     A alone (B a weight, padded once outside the call)
  padded     our kernel on the padded buffers at K'
  copy_ab+padded, copy_a+padded   the copies and the kernel between one pair of events
Before timing, the padded path's output (copy then kernel) and the direct one are checked
against a float64 reference of a @ b.T at K (relative error norm < 1e-2, finite). Writes
$OUT/padk_probe.json and prints a table last (vs torch = cuBLAS's time over the row's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCHED = "w256s4t128"  # the default at these shapes (128x256, 4 stages, staged 128 columns)
SHAPES = "3072x5120x2056,3000x5000x2056,4096x4096x4104"
OUT = os.environ.get("OUT", ".")
RES: dict = {"env": {}, "checks": [], "timings": [], "errors": []}


def log(*a):
    print(*a, flush=True)


def save():
    with open(os.path.join(OUT, "padk_probe.json"), "w") as f:
        json.dump(RES, f, indent=1)


def parse(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",") if s]


def padded_k(k: int) -> int:
    """K rounded up to 16: the smallest pitch 2 K' bytes that is a multiple of 32."""
    return -(-k // 16) * 16


def dry_run() -> int:
    from factory.compile import compile_ptx
    from factory.families.matmul.emit import emit
    from lab.matmul.variants import epilogue_irs, schedules

    r = compile_ptx(emit(epilogue_irs()["plain"], schedules()[SCHED]).ptx, "sm_90a", cache=False)
    log(f"dry run: {SCHED} ok={r.ok} registers={r.registers} spills={r.spill_store_bytes}")
    for m, n, k in parse(SHAPES):
        log(f"  {m}x{n}x{k}: K' = {padded_k(k)}")
    return 0 if r.ok and not r.spill_store_bytes else 1


def run_shape(torch, kern_k, kern_p, m, n, k, reps):
    from lab.matmul.gemm_bench import time_interleaved

    kp = padded_k(k)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5 * 4).to(torch.bfloat16)
    ap = torch.zeros(m, kp, device="cuda", dtype=torch.bfloat16)  # pad columns stay zero
    bp = torch.zeros(n, kp, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cp = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    kern_k.bind({"a": a, "b": b, "c": c}, {"M": m, "N": n, "K": k})
    kern_p.bind({"a": ap, "b": bp, "c": cp}, {"M": m, "N": n, "K": kp})
    stream = torch.cuda.current_stream().cuda_stream

    def copy_a():
        ap[:, :k].copy_(a)

    def copy_ab():
        ap[:, :k].copy_(a)
        bp[:, :k].copy_(b)

    runners = {
        "torch": lambda: a @ b.T,
        "direct": lambda: kern_k.launch(stream),
        "copy_ab": copy_ab,
        "copy_a": copy_a,
        "padded": lambda: kern_p.launch(stream),
        "copy_ab+padded": lambda: (copy_ab(), kern_p.launch(stream)),
        "copy_a+padded": lambda: (copy_a(), kern_p.launch(stream)),
    }
    # checks: the padded path (copy, then the kernel at K') and the direct kernel at K
    ref = a.double() @ b.double().T
    for name, out in (("copy_ab+padded", cp), ("direct", c)):
        out.fill_(float("nan"))
        bp.zero_()
        ap.zero_()
        runners[name]()
        torch.cuda.synchronize()
        rel = float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))
        ok = bool(torch.isfinite(out).all()) and rel < 1e-2
        RES["checks"].append({"shape": [m, n, k], "path": name, "rel_norm": rel, "ok": ok})
        log(f"check {m}x{n}x{k} {name}: rel {rel:.2e} -> {'OK' if ok else 'FAIL'}")
        if not ok:
            save()
            return None
    del ref
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    samples, clk0, clk1 = time_interleaved(torch, runners, reps, flush)
    rows = {}
    for lab, xs in samples.items():
        xs = np.array(xs)
        rows[lab] = {
            "median_us": float(np.median(xs)),
            "p20_us": float(np.percentile(xs, 20)),
            "p80_us": float(np.percentile(xs, 80)),
        }
    for lab in rows:
        rows[lab]["vs_torch"] = rows["torch"]["median_us"] / rows[lab]["median_us"]
    rec = {"shape": [m, n, k], "k_padded": kp, "rows": rows, "sm_clock_mhz": [clk0, clk1]}
    RES["timings"].append(rec)
    save()
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=90.0)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run()
    import torch

    from lab.matmul.gemm_bench import Kernel
    from lab.matmul.variants import epilogue_irs, schedules

    start = time.time()
    dev = torch.cuda.get_device_properties(0)
    RES["env"] = {"gpu": dev.name, "torch": torch.__version__, "sms": dev.multi_processor_count}
    ir, s = epilogue_irs()["plain"], schedules()[SCHED]
    kern_k, kern_p = Kernel(ir, s), Kernel(ir, s)
    RES["env"]["registers"] = kern_k.report.registers
    recs = []
    for m, n, k in parse(args.shapes):
        if time.time() - start > args.timeout:
            log("out of time budget; stopping")
            break
        try:
            rec = run_shape(torch, kern_k, kern_p, m, n, k, args.reps)
        except Exception as e:  # noqa: BLE001 - recorded; the next shape still runs
            log(f"ERROR {m}x{n}x{k}: {e}")
            RES["errors"].append(f"{m}x{n}x{k}: {e}")
            save()
            continue
        if rec:
            recs.append(rec)
    save()
    log("")
    head = f"{'shape':16} {'Kp':>5} {'path':16} {'med us':>8} {'p20':>8} {'p80':>8}"
    log(f"{head} {'vs torch':>8} clk")
    for rec in recs:
        shape = "x".join(map(str, rec["shape"]))
        for lab, r in rec["rows"].items():
            log(
                f"{shape:16} {rec['k_padded']:5d} {lab:16} {r['median_us']:8.1f} "
                f"{r['p20_us']:8.1f} {r['p80_us']:8.1f} {r['vs_torch']:8.3f} {rec['sm_clock_mhz']}"
            )
    bad = [c for c in RES["checks"] if not c["ok"]]
    return 1 if bad or RES["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
