"""Which part of the worker's timing protocol keeps torch.compile ahead of ours at a near tie,
where bench.direct's protocol has ours level or ahead? (a GPU host, no Django)

    PYTHONPATH=. python3 -m lab.probes.probe_protocol --out DIR [--op rmsnorm] [--shape 1] \\
        [--impl torch_compile] [--tags ct512r1v8c2m2048h_plno,ct256r1v8c4m768_plno] [--rounds 40]

One process, bench.direct's Bench (one stream, every run after a 256 MB read flush, a round
queued behind a GPU sleep so host launch time stays off the timer). The baseline and our
schedules (from plan x, by tag) are verified at each of K input sets first, then timed under
four protocols, adding the worker's habits one at a time:

- `interleaved`: each entrant once per round on input set 0 (bench.direct's protocol);
- `rotated`: each entrant once per round, on input set r % K (the worker's sets live at K
  addresses);
- `in_a_row`: each entrant K runs in a row per round, one per input set (the worker times an
  entrant's K slots back to back before the next entrant);
- `poisoned`: as `in_a_row`, with our output buffer filled with NaN before every run of every
  entrant (the worker poisons its outputs before each timed run).

Writes DIR/protocol.json and prints, per protocol, each entrant's median and ours over the
baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

PLAN = "lab/plans/suite-2026-12-03x.json"
SETS = 4
PROTOCOLS = ("interleaved", "rotated", "in_a_row", "poisoned")


def schedule_runs(protocol: str, r: int, k_sets: int) -> list[int]:
    """The input sets an entrant runs on, in order, in round r of `protocol`."""
    if protocol == "interleaved":
        return [0]
    if protocol == "rotated":
        return [r % k_sets]
    if protocol in ("in_a_row", "poisoned"):
        return list(range(k_sets))
    raise ValueError(f"unknown protocol {protocol!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--op", default="rmsnorm")
    p.add_argument("--shape", type=int, default=1)
    p.add_argument("--impl", default="torch_compile")
    p.add_argument("--tags", default="ct512r1v8c2m2048h_plno,ct256r1v8c4m768_plno")
    p.add_argument("--rounds", type=int, default=40)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)

    from bench.direct import (
        Bench,
        check_rows,
        compiled_schedule,
        environment,
        make_inputs,
        make_outputs,
        our_launcher,
    )
    from bench.suite import _catalogue
    from factory.families.row.schedules import Schedule
    from gpuworker.baselines import make_torch_baseline

    bench = Bench()
    torch = bench.torch
    w, _, ir = _catalogue()[a.op]
    dims = dict(w.shapes[a.shape])
    sets = [make_inputs(bench, w, dims, seed=100 + k) for k in range(SETS)]
    outputs = make_outputs(bench, w, dims)

    fn, version, _ = make_torch_baseline(a.impl, w)
    box = {}

    def run_baseline(k):
        box["out"] = fn(sets[k])

    runs = {a.impl: run_baseline}
    with open(PLAN) as f:
        planned = json.load(f)[a.op][f"{dims[ir.batch_dims[0]]}x{dims[ir.row_dim]}"]
    by_tag = {s.tag(): s for s in map(Schedule.from_dict, planned)}
    for tag in a.tags.split(","):
        em, rep, _ = compiled_schedule(ir, by_tag[tag])
        cubin = rep.cubin
        launchers = [our_launcher(bench, em, cubin, sets[k] | outputs, dims) for k in range(SETS)]
        runs[tag] = lambda k, launchers=launchers: launchers[k]()

    verified = {}
    for name, run in runs.items():  # every entrant at every input set, into poisoned outputs
        ok = True
        for k in range(SETS):
            for t in outputs.values():
                t.fill_(float("nan"))
            run(k)
            torch.cuda.synchronize()
            outs = box["out"] if name == a.impl else outputs
            ok &= check_rows(bench, w, ir, sets[k], outs, dims)["passed"]
        verified[name] = bool(ok)
    live = [n for n in runs if verified[n]]
    for n in runs:
        if not verified[n]:
            print(f"{n}: failed verification, not timed", flush=True)

    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))]
    results = {}
    for protocol in PROTOCOLS:
        samples = {n: [] for n in live}
        for r in range(-2, a.rounds):  # two rounds of warm-up
            ks = schedule_runs(protocol, max(r, 0), SETS)
            need = len(live) * len(ks)
            while len(ev) < need:
                ev.append(
                    (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                )
            torch.cuda._sleep(2_000_000)
            i = 0
            for n in live:
                for k in ks:
                    if protocol == "poisoned":
                        for t in outputs.values():
                            t.fill_(float("nan"))
                    bench.flush_l2(r)
                    ev[i][0].record()
                    runs[n](k)
                    ev[i][1].record()
                    i += 1
            torch.cuda.synchronize()
            if r < 0:
                continue
            i = 0
            for n in live:
                for _k in ks:
                    samples[n].append(ev[i][0].elapsed_time(ev[i][1]) * 1e3)
                    i += 1
        results[protocol] = {
            n: {
                "median_us": float(np.median(v)),
                "p20_us": float(np.percentile(v, 20)),
                "p80_us": float(np.percentile(v, 80)),
                "samples_us": [round(x, 3) for x in v],
            }
            for n, v in samples.items()
        }
    # the outputs of the last timed runs are still right
    after = {}
    for n in live:
        for t in outputs.values():
            t.fill_(float("nan"))
        runs[n](0)
        torch.cuda.synchronize()
        after[n] = check_rows(bench, w, ir, sets[0], box["out"] if n == a.impl else outputs, dims)[
            "passed"
        ]
    with open(os.path.join(a.out, "protocol.json"), "w") as f:
        json.dump(
            {
                "op": a.op,
                "dims": dims,
                "baseline": a.impl,
                "baseline_version": version,
                "sets": SETS,
                "verified": verified,
                "verified_after": after,
                "env": environment(),
                "protocols": results,
            },
            f,
            indent=1,
        )
    print(f"{a.op} {dims}: median us per protocol; ours / {a.impl} (>1: ours faster)")
    print("| protocol | " + " | ".join(live) + " |")
    print("|---" * (len(live) + 1) + "|")
    for protocol, res in results.items():
        base = res[a.impl]["median_us"] if a.impl in res else None
        cells = []
        for n in live:
            m = res[n]["median_us"]
            cells.append(f"{m:.2f}" + (f" ({base / m:.4f}x)" if base and n != a.impl else ""))
        print(f"| {protocol} | " + " | ".join(cells) + " |")
    print(f"verified after timing: {after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
