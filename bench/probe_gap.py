"""Why a torch-launched baseline times 1.5-3.5 us slower through the GPU worker than in direct
mode while our kernels time the same (bench/results/2026-12-03-h200-explore10/): the plain
Triton softmax at the suite's shapes, timed under each protocol and with one difference between
them changed at a time.

The worker's protocol (gpuworker.child.Session.op_time): per run, judge_hold (a GPU-side wait
longer than the host's enqueue), judge_read_flush (a 256 MB read), a start event, the entrant,
an end event; inputs are the worker's own allocations (cuMemAlloc) viewed by torch; a torch
baseline's output is a fresh torch tensor. Direct mode (bench.direct.Bench.time_rounds): one
torch.cuda._sleep per round, a torch sum over a 256 MB buffer as the flush, torch events, inputs
and outputs from torch's allocator.

    PYTHONPATH=. python3 -m bench.probe_gap --out DIR

Prints one line per (shape, variant): median, p20, p80 in microseconds; writes probe_gap.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

VARIANTS = {
    # name: (protocol, inputs from, output)
    "worker": ("worker", "cumemalloc", "fresh"),
    "worker_torch_inputs": ("worker", "torch", "fresh"),
    "worker_out_preallocated": ("worker", "cumemalloc", "prealloc"),
    "worker_all_torch": ("worker", "torch", "prealloc"),
    "direct": ("direct", "torch", "fresh"),
    "direct_cumemalloc_inputs": ("direct", "cumemalloc", "fresh"),
    "direct_judge_flush": ("direct_judge_flush", "torch", "fresh"),
    "worker_torch_flush": ("worker_torch_flush", "cumemalloc", "fresh"),
    # as the worker runs a torch baseline: the output buffer poisoned before the hold, the
    # fresh output copied into it after the end event
    "worker_poison_copy": ("worker_poison_copy", "cumemalloc", "fresh"),
}


class _Value:
    value = 0.0


def _view(torch, ptr: int, shape, nbytes_per: int = 2):
    class _Cai:
        __cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": "<i2",
            "data": (int(ptr), False),
            "version": 3,
            "strides": None,
        }

    return torch.as_tensor(_Cai(), device="cuda").view(torch.bfloat16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--hold-us", type=float, default=600.0)
    args = ap.parse_args(argv)

    import torch
    import triton

    from gpuworker import gpu
    from gpuworker import triton_kernels as tk
    from gpuworker.child import Session

    s = Session(_Value(), _Value())
    ext = torch.cuda.ExternalStream(gpu.stream_handle(s.stream))
    torch.cuda.set_stream(ext)
    flush_t = torch.ones((256 << 20) // 4, dtype=torch.int32, device="cuda")
    results = []
    for M, N in ((16384, 4096), (16384, 8192), (32768, 4096)):
        nbytes = M * N * 2
        mem = gpu.DeviceMemory(nbytes)
        x_cu = _view(torch, mem.ptr, (M, N))
        x_cu.copy_(torch.randn(M, N, device="cuda").to(torch.bfloat16))
        x_t = x_cu.clone()
        y_pre = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
        out_mem = gpu.DeviceMemory(nbytes)
        out_view = _view(torch, out_mem.ptr, (M, N))
        block = triton.next_power_of_2(N)
        samples = {name: [] for name in VARIANTS}
        failed = {}
        # rounds interleave the variants, so that a drift of the card's speed over the run
        # moves them all alike
        for r in range(args.runs + 3):
            for name, (proto, src, out) in VARIANTS.items():
                if name in failed:
                    continue
                x = x_cu if src == "cumemalloc" else x_t
                try:
                    us = _one_run(
                        torch,
                        s,
                        gpu,
                        tk,
                        flush_t,
                        args.hold_us,
                        proto,
                        out,
                        x,
                        y_pre,
                        out_mem,
                        out_view,
                        M,
                        N,
                        block,
                        r,
                    )
                except Exception as e:  # noqa: BLE001 - one variant failing must not stop the rest
                    failed[name] = f"{type(e).__name__}: {e}"
                    print(f"{M}x{N} {name}: {failed[name]}", flush=True)
                    continue
                if r >= 3:
                    samples[name].append(us)
        for name, got in samples.items():
            if name in failed or not got:
                results.append({"shape": f"{M}x{N}", "variant": name, "error": failed.get(name)})
                continue
            a_ = np.array(got)
            row = {
                "shape": f"{M}x{N}",
                "variant": name,
                "median_us": float(np.median(a_)),
                "p20_us": float(np.percentile(a_, 20)),
                "p80_us": float(np.percentile(a_, 80)),
                "samples_us": got,
            }
            results.append(row)
            print(
                f"{row['shape']:>11} {name:<26} {row['median_us']:7.1f} "
                f"({row['p20_us']:.1f}-{row['p80_us']:.1f})",
                flush=True,
            )
        out_mem.free()
        mem.free()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    env.update(torch=torch.__version__, triton=triton.__version__)
    (out / "probe_gap.json").write_text(json.dumps({"env": env, "rows": results}, indent=1))
    return 0


def _one_run(
    torch, s, gpu, tk, flush_t, hold_us, proto, out, x, y_pre, out_mem, out_view, M, N, block, r
) -> float:
    """One timed run of the Triton softmax under `proto`; its time in microseconds."""
    warps = tk.num_warps(block)

    def fn():
        y = y_pre if out == "prealloc" else torch.empty_like(x)
        tk.softmax_row[(M,)](x, y, N, BLOCK=block, num_warps=warps)
        return y

    if proto.startswith("worker"):
        if proto == "worker_poison_copy":
            gpu.memset8(out_mem.ptr, 0xFF, M * N * 2, s.stream)
        s.hold(hold_us)
        if proto == "worker_torch_flush":
            flush_t.sum(dtype=torch.int32)
        else:
            s.flush_l2("read", r)
        s.events.record_start(0, s.stream)
        y = fn()
        s.events.record_end(0, s.stream)
        if proto == "worker_poison_copy":
            out_view.copy_(y)
        gpu.sync(s.stream, "probe")
        return s.events.elapsed_us(0)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    if proto == "direct_judge_flush":
        s.flush_l2("read", r)
    else:
        flush_t.sum(dtype=torch.int32)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
