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

    PYTHONPATH=. python3 -m lab.probes.probe_gap --out DIR

Prints one line per (shape, variant): median, p20, p80 in microseconds; writes probe_gap.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

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
    # as bench.direct calls a torch baseline: the previous run's output is still referenced
    # when the next is allocated, so two output blocks alternate
    "direct_alternate": ("direct", "torch", "alternate"),
    "worker_alternate": ("worker", "cumemalloc", "alternate"),
    # inputs drawn as bench.direct draws them: uniform over the manifest's range
    "direct_uniform": ("direct", "uniform", "fresh"),
    "direct_uniform_alternate": ("direct", "uniform", "alternate"),
}
# --holds: the worker's protocol with the hold's length changed (0: none, the flush and the run
# queued back to back), and with a busy hold (the 256 MB read flush repeated for that long
# instead of a GPU-side sleep, so the memory system never idles before the timed run)
HOLD_VARIANTS = {
    "hold_0": ("worker_hold", 0.0),
    "hold_100": ("worker_hold", 100.0),
    "hold_300": ("worker_hold", 300.0),
    "hold_600": ("worker_hold", 600.0),
    "hold_2000": ("worker_hold", 2000.0),
    "busy_600": ("worker_busy", 600.0),
    "busy_2000": ("worker_busy", 2000.0),
}
FLUSH_US = 60.0  # one 256 MB read flush on the H200


class _Value:
    value = 0.0


def _view(torch, ptr: int, shape):
    """A bf16 torch tensor over memory we allocated, as the worker views its buffers."""
    from gpuworker.child import torch_view

    return torch_view(torch, ptr, "bf16", shape)


def summary_row(shape: str, variant: str, samples_us: list[float]) -> dict:
    """Median and p20/p80 of one variant's timed runs, printed as one line."""
    a = np.array(samples_us)
    row = {
        "shape": shape,
        "variant": variant,
        "median_us": float(np.median(a)),
        "p20_us": float(np.percentile(a, 20)),
        "p80_us": float(np.percentile(a, 80)),
        "samples_us": list(samples_us),
    }
    print(
        f"{shape:>11} {variant:<26} {row['median_us']:7.1f} "
        f"({row['p20_us']:.1f}-{row['p80_us']:.1f}) n={len(samples_us)}",
        flush=True,
    )
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--hold-us", type=float, default=600.0)
    ap.add_argument("--holds", action="store_true", help="the hold variants instead")
    ap.add_argument(
        "--rounds",
        action="store_true",
        help="as bench.direct queues a round: one sleep, then 6 runs back to back (flush, start, "
        "run, end each); the first run of the round and the other five, kept apart",
    )
    args = ap.parse_args(argv)

    import torch
    import triton

    from gpuworker import gpu
    from gpuworker import triton_kernels as tk
    from gpuworker.child import Session

    s = Session(_Value(), _Value())
    ext = torch.cuda.ExternalStream(gpu.stream_handle(s.stream))  # kept for the whole run
    torch.cuda.set_stream(ext)
    flush_t = torch.ones((256 << 20) // 4, dtype=torch.int32, device="cuda")
    if args.holds:
        variants = {k: (p, "cumemalloc", "fresh", us) for k, (p, us) in HOLD_VARIANTS.items()}
    else:
        variants = {k: v + (args.hold_us,) for k, v in VARIANTS.items()}
    results = []
    for M, N in ((16384, 4096), (16384, 8192), (32768, 4096)):
        shape = f"{M}x{N}"
        mem, out_mem = gpu.DeviceMemory(M * N * 2), gpu.DeviceMemory(M * N * 2)
        x_cu = _view(torch, mem.ptr, (M, N))
        x_cu.copy_(torch.randn(M, N, device="cuda").to(torch.bfloat16))
        ctx = SimpleNamespace(
            torch=torch,
            s=s,
            gpu=gpu,
            tk=tk,
            flush_t=flush_t,
            M=M,
            N=N,
            block=triton.next_power_of_2(N),
            inputs={
                "cumemalloc": x_cu,
                "torch": x_cu.clone(),
                "uniform": (torch.rand(M, N, device="cuda") * 8.0 - 4.0).to(torch.bfloat16),
            },
            y_pre=torch.empty((M, N), dtype=torch.bfloat16, device="cuda"),
            out_mem=out_mem,
            out_view=_view(torch, out_mem.ptr, (M, N)),
            keep={},
        )
        if args.rounds:
            first, rest = _rounds(ctx, args.runs)
            results += [summary_row(shape, "round_first", first)]
            results += [summary_row(shape, "round_rest", rest)]
        else:
            results += _interleaved(ctx, shape, variants, args.runs)
        out_mem.free()
        mem.free()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    env.update(torch=torch.__version__, triton=triton.__version__)
    name = "probe_rounds" if args.rounds else "probe_holds" if args.holds else "probe_gap"
    (out / f"{name}.json").write_text(json.dumps({"env": env, "rows": results}, indent=1))
    return 0


def _interleaved(ctx, shape: str, variants: dict, runs: int) -> list[dict]:
    """Every variant once per round, so that a drift of the card's speed over the run moves
    them all alike; three warm-up rounds."""
    samples = {name: [] for name in variants}
    failed = {}
    for r in range(runs + 3):
        for name, (proto, src, out, hold_us) in variants.items():
            if name in failed:
                continue
            try:
                us = _one_run(ctx, proto, src, out, hold_us, r)
            except Exception as e:  # noqa: BLE001 - one variant failing must not stop the rest
                failed[name] = f"{type(e).__name__}: {e}"
                print(f"{shape} {name}: {failed[name]}", flush=True)
                continue
            if r >= 3:
                samples[name].append(us)
    return [
        summary_row(shape, name, got)
        if got and name not in failed
        else {"shape": shape, "variant": name, "error": failed.get(name)}
        for name, got in samples.items()
    ]


def _softmax(ctx, x, out: str, key: str):
    """The suite's plain Triton softmax of x into a fresh, preallocated or alternating output."""
    y = ctx.y_pre if out == "prealloc" else ctx.torch.empty_like(x)
    ctx.tk.softmax_row[(ctx.M,)](
        x, y, ctx.N, BLOCK=ctx.block, num_warps=ctx.tk.num_warps(ctx.block)
    )
    if out == "alternate":
        ctx.keep[key] = y  # held until the next run's output is allocated
    return y


def _rounds(ctx, runs: int) -> tuple[list[float], list[float]]:
    """bench.direct's queueing: per round one GPU sleep, then six runs back to back."""
    torch, x = ctx.torch, ctx.inputs["torch"]
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(6)
    ]
    first, rest = [], []
    for r in range(runs // 3 + 2):
        torch.cuda._sleep(2_000_000)
        for start, end in ev:
            ctx.flush_t.sum(dtype=torch.int32)
            start.record()
            _softmax(ctx, x, "fresh", "rounds")
            end.record()
        torch.cuda.synchronize()
        if r >= 2:  # two warm-up rounds
            us = [a.elapsed_time(b) * 1e3 for a, b in ev]
            first.append(us[0])
            rest += us[1:]
    return first, rest


def _one_run(ctx, proto: str, src: str, out: str, hold_us: float, r: int) -> float:
    """One timed run of the Triton softmax under `proto`; its time in microseconds."""
    torch, s, x = ctx.torch, ctx.s, ctx.inputs[src]
    if proto.startswith("worker"):
        if proto == "worker_poison_copy":
            ctx.gpu.memset8(ctx.out_mem.ptr, 0xFF, ctx.M * ctx.N * 2, s.stream)
        if proto == "worker_busy":
            for _ in range(max(1, round(hold_us / FLUSH_US))):
                s.flush_l2("read", r)
        elif hold_us > 0:
            s.hold(hold_us)
        if proto == "worker_torch_flush":
            ctx.flush_t.sum(dtype=torch.int32)
        else:
            s.flush_l2("read", r)
        s.events.record_start(0, s.stream)
        y = _softmax(ctx, x, out, proto)
        s.events.record_end(0, s.stream)
        if proto == "worker_poison_copy":
            ctx.out_view.copy_(y)
        ctx.gpu.sync(s.stream, "probe")
        return s.events.elapsed_us(0)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    if proto == "direct_judge_flush":
        s.flush_l2("read", r)
    else:
        ctx.flush_t.sum(dtype=torch.int32)
    start.record()
    _softmax(ctx, x, out, proto)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
