"""Does where the output lies change a softmax's time? Triton's softmax and ours, each writing
into the same output buffers placed at several offsets, timed interleaved by bench.direct's
protocol (one torch sleep per round, a 256 MB read flush before every run, torch events).

Why: bench.direct times the plain Triton softmax 2.4-3.2 us faster than the worker and than
every protocol lab/probes/probe_gap.py rebuilt, in the same call on the same card, while our kernels
time the same everywhere (bench/results/2026-12-03-h200-gap/). Each harness gives a baseline an
output tensor of its own (a fresh torch allocation), and ours another, so the two never write
to the same memory. If the time depends on the output's placement, a comparison should give
every entrant the same buffers.

    PYTHONPATH=. python3 -m lab.probes.probe_place --out DIR

Every entrant's output is poisoned, written and checked against a float64 softmax of the whole
input before timing. Prints one line per (shape, placement, entrant); writes probe_place.json.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np

SHAPES = ((16384, 4096), (16384, 8192), (32768, 4096))
# Output offsets (bytes) into one pool allocated after the input; "fresh": torch.empty_like,
# as the baselines' own outputs are made.
OFFSETS = (0, 4096, 65536, 1 << 20, 2 << 20, (2 << 20) + 65536, 16 << 20, (32 << 20) + 4096)
PLAN = Path(__file__).resolve().parents[1] / "plans" / "suite-2026-12-03s.json"
# Our fastest softmax schedule per shape in suite run 16 (bench/results/2026-12-03-h200-suite13/)
WINNERS = {
    "16384x4096": "ct128r1v8c4om768_elno",
    "16384x8192": "ct256r1v8c4o_elef",
    "32768x4096": "ct128r1v8c4om768_elno",
}


def pool_bytes(nbytes: int) -> int:
    return nbytes + max(OFFSETS)


def summarise(samples: dict[str, list[float]]) -> dict[str, dict]:
    return {
        k: {
            "median_us": float(np.median(v)),
            "p20_us": float(np.percentile(v, 20)),
            "p80_us": float(np.percentile(v, 80)),
        }
        for k, v in samples.items()
    }


def our_schedule(m: int, n: int):
    """(emitted kernel, nvJitLink report, tag) of suite run 16's softmax winner at m x n."""
    from bench.suite import _catalogue, compile_cached
    from factory.emit import emit
    from factory.families.row.schedules import Schedule

    _, _, ir = _catalogue()["softmax"]
    planned = json.loads(PLAN.read_text())["softmax"][f"{m}x{n}"]
    (s,) = [s for s in map(Schedule.from_dict, planned) if s.tag() == WINNERS[f"{m}x{n}"]]
    em = emit(ir, s)
    return em, compile_cached(em.ptx), s.tag()


def make_entrants(bench, x, outs: dict) -> tuple[dict, str]:
    """{"triton <label>" / "ours <label>": (run, output)} for every output placement."""
    import triton

    from bench.direct import our_launcher
    from gpuworker import triton_kernels as tk

    m, n = x.shape
    em, rep, tag = our_schedule(m, n)
    block = triton.next_power_of_2(n)
    warps = tk.num_warps(block)

    def run_triton(y):
        tk.softmax_row[(m,)](x, y, n, BLOCK=block, num_warps=warps)

    entrants = {}
    for label, y in outs.items():
        entrants[f"triton {label}"] = (functools.partial(run_triton, y), y)
        run_ours = our_launcher(bench, em, rep.cubin, {"x": x, "y": y}, {"M": m, "N": n})
        entrants[f"ours {label}"] = (run_ours, y)
    return entrants, tag


def time_per_run(bench, entrants: dict, reps: int) -> dict[str, list[float]]:
    """Every entrant once per round, each run alone: sleep, flush, start, run, end, synchronise."""
    torch = bench.torch
    samples = {k: [] for k in entrants}
    for fn in entrants.values():  # warm-up, as time_rounds
        fn()
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(reps):
        for k, fn in entrants.items():
            torch.cuda._sleep(1_000_000)
            bench.flush_l2(r)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples[k].append(start.elapsed_time(end) * 1e3)
    return samples


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.probes.probe_place", description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument(
        "--session-first",
        action="store_true",
        help="create the GPU worker's Session (cuda.core's device and stream, the judge "
        "kernels, its buffers) before torch touches CUDA, as lab/probes/probe_gap.py does",
    )
    p.add_argument(
        "--per-run",
        action="store_true",
        help="time each run on its own, as the worker and lab/probes/probe_gap.py do (a GPU sleep, "
        "the flush, the events around the run, then a synchronise), instead of bench.direct's "
        "rounds (one sleep, then every entrant's flush and run queued back to back)",
    )
    args = p.parse_args(argv)
    from bench.direct import Bench

    if args.session_first:
        from gpuworker.child import Session
        from lab.probes.probe_gap import _Value

        session = Session(_Value(), _Value())  # noqa: F841 - held for the whole run
    bench = Bench()
    torch = bench.torch
    results = []
    for m, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(m + n)
        x = (torch.rand((m, n), device="cuda", generator=gen) * 16 - 8).to(torch.bfloat16)
        want = torch.softmax(x.double(), dim=-1)
        nbytes = x.numel() * 2
        pool = torch.empty(pool_bytes(nbytes), dtype=torch.uint8, device="cuda")
        outs = {"fresh": torch.empty_like(x)}
        for off in OFFSETS:
            outs[f"+{off}"] = pool[off : off + nbytes].view(torch.bfloat16).view(m, n)
        entrants, tag = make_entrants(bench, x, outs)
        checked = {}
        for key, (run, y) in entrants.items():
            y.fill_(float("nan"))
            run()
            err = float((y.double() - want).abs().max())
            checked[key] = err
            if not err <= 2e-3:
                raise SystemExit(f"{m}x{n} {key}: wrong output (max abs err {err:.2e})")
        runs = {k: v[0] for k, v in entrants.items()}
        timer = time_per_run if args.per_run else Bench.time_rounds
        stats = summarise(timer(bench, runs, args.reps))
        for key, st in stats.items():
            impl, label = key.split(" ", 1)
            y = outs[label]
            row = {
                "shape": f"{m}x{n}",
                "entrant": impl if impl == "triton" else f"ours {tag}",
                "output": label,
                "y_minus_x_bytes": y.data_ptr() - x.data_ptr(),
                "max_abs_err": checked[key],
            } | st
            results.append(row)
            print(
                f"{m}x{n:<6d} {row['entrant']:28s} out {label:>10s} "
                f"(y-x {row['y_minus_x_bytes']:>12d}) {st['median_us']:7.1f} us "
                f"[{st['p20_us']:.1f}-{st['p80_us']:.1f}]",
                flush=True,
            )
        del pool, outs, want
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "probe_place" + ("_session_first" if args.session_first else "")
    name += "_per_run" if args.per_run else ""
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
