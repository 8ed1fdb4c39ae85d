"""One GPU run for the split-row family's few long rows (issue 50): the pipelined ticket order
and four blocks an SM, against torch.compile, through the real worker (gpuworker.run_batch),
which verifies every kernel (7 shapes, held-out ones among them, twice, bitwise) before it
times it.

For each case (RMSNorm, softmax, LayerNorm, bias+GELU over 1-64 rows of 1M-16M elements, the
bench's manifests; RMSNorm first, the one slower than torch.compile) one batch: the family's
default at each timed shape (deduplicated, so each shape's default is timed at every shape),
each of those defaults with `keep` (the statistics reads evict-last in L2: does the second
read of a row come from L2 then?), for RMSNorm a variant (two blocks an SM instead of four),
and torch.compile. A case starts
only if the mean case so far still fits the budget (the caller's timeout ends one that does
not); raw results go to OUT/raw/<case>.json for lab/memfamilies/report.py.

    OUT=/tmp/x bash lab/memfamilies/rowsplit_run.sh           # on the GPU host, <= 95 s
    .venv/bin/python -m lab.memfamilies.rowsplit_run --list    # the batches, no GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from lab.memfamilies.bench import CASES, geomeans, summary_rows, table

ORDER = (
    "rmsnorm_few_rows_bf16",
    "softmax_few_rows_bf16",
    "layernorm_few_rows_fp32",
    "bias_gelu_few_rows_bf16",
)
MAX_CANDIDATES = 10
VARIANT = {"rmsnorm-few-rows-bf16": "blocks"}


def schedules(fam, ir, w) -> list:
    """Each timed shape's default (in shape order, once each: they differ in chunk, row
    group and lag, so each is timed at every shape), then each of them with `keep` (in the
    same order: the i-th kept candidate beside the i-th default; none with one pass), then
    one variant of the default at 64x1M that tells whether a default choice holds: for
    RMSNorm the other residency (two blocks an SM instead of four). (A softmax without the
    evict-first hints would be next; the time does not hold it.) An extra candidate costs
    about the 0.5 s of timing it is given: 5 and 3 candidates each took 30 s a case."""
    from factory.device import device_for

    sms = device_for("sm_90").sms
    every = [dict(d) for d in w.shapes]
    out = []
    for dims in every:
        s = fam.default_schedule(ir, dims)
        if s not in out:
            out.append(s)
    for s in list(out):
        k = s.__class__(**{**s.to_dict(), "keep": True})
        if hasattr(s, "keep") and k not in out and fam.fits(ir, k, every):
            out.append(k)
    wide = fam.default_schedule(ir, {"M": 64, "N": 1 << 20})
    change = VARIANT.get(w.name)
    if change == "blocks":
        v = wide.__class__(**{**wide.to_dict(), "blocks": 2 * sms})
    elif change == "stream":
        v = wide.__class__(**{**wide.to_dict(), "stream": False})
    else:
        v = None
    if v is not None and v not in out and fam.fits(ir, v, every):
        out.append(v)
    return out[:MAX_CANDIDATES]


def build(case: str, per_candidate_s: float) -> tuple[dict, list[str]]:
    from factory import families
    from factory.agents.types import launch_to_dict, param_to_dict
    from factory.spec import load_manifest

    w = load_manifest(CASES[case])
    fam, ir = families.family_for(w)
    cands, labels = [], []
    for i, s in enumerate(schedules(fam, ir, w)):
        em = fam.emit(ir, s, "sm_90")
        cands.append({
            "id": f"c{i}",
            "ptx": em.ptx,
            "entry": em.entry,
            "params": [param_to_dict(p) for p in em.params],
            "launch": launch_to_dict(em.launch),
        })  # fmt: skip
        labels.append(f"c{i} {s.tag()}")
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": fam.name,
        "manifest": w.manifest,
        "baseline_source": None,
        "shapes": [dict(d) for d in w.shapes],
        "heldout_shapes": [dict(d) for d in w.heldout_shapes],
        "candidates": cands,
        "baselines": ["torch_compile"],
        "options": {"time_budget_s_per_candidate": per_candidate_s},
    }
    return batch, labels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for raw/<case>.json")
    ap.add_argument("--case", action="append", help="cases (default: ORDER)")
    ap.add_argument("--budget-s", type=float, default=86.0)
    ap.add_argument("--time-per-candidate-s", type=float, default=0.5)
    ap.add_argument("--list", action="store_true", help="build the batches, run nothing")
    args = ap.parse_args(argv)
    started = time.monotonic()
    spent: list[float] = []
    lines, rows, skipped = [], [], []
    for case in args.case or ORDER:
        batch, labels = build(case, args.time_per_candidate_s)
        if args.list:
            lines.append(f"== {case}: {len(labels)} candidates, {batch['baselines']}")
            lines += [f"  {lab}" for lab in labels]
            continue
        elapsed = time.monotonic() - started
        if spent and elapsed + sum(spent) / len(spent) > args.budget_s:
            skipped.append(case)
            continue
        import gpuworker

        t0 = time.monotonic()
        try:
            results = gpuworker.run_batch(batch)
        except Exception as e:  # noqa: BLE001 - one case's failure is reported, the rest run
            spent.append(time.monotonic() - t0)
            lines.append(f"== {case}: the worker raised {type(e).__name__}: {e}")
            print(lines[-1], flush=True)
            continue
        spent.append(time.monotonic() - t0)
        lines += table(case, results, labels)
        lines.append(f"  ({spent[-1]:.0f} s)")
        rows += summary_rows(case, results)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{case}.json").write_text(json.dumps(results, indent=1))
        print("\n".join(lines[-len(labels) * 5 - 12 :]), flush=True)
    print("\n".join(lines))
    if skipped:
        print(f"skipped for the time budget ({args.budget_s:.0f} s): {', '.join(skipped)}")
    if not args.list:
        summary = geomeans(rows)
        print("\n".join(summary))
        if args.out:
            (args.out / "summary.json").write_text(
                json.dumps({"rows": rows, "skipped": skipped, "lines": summary}, indent=1)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
