"""Issue 50 on the GPU: the memory-bound families' candidates (colreduce, segreduce,
allreduce, scan, argreduce, pool, segnorm) run through the real worker (gpuworker.run_batch)
beside the torch baselines, at sizes of at least 256 MiB of input and at held-out odd sizes,
one batch per case; prints a table
of each entrant's median time, TB/s and share of the same run's copy ceiling, and writes the
raw results under --out.

Not run yet: written in a session without a GPU (2026-12-07). Run it on a GPU host:

    .venv/bin/python -m lab.memfamilies.bench --out bench/results/<date>-memfamilies
    .venv/bin/python -m lab.memfamilies.bench --case bias_grad_bf16 --seeds 8 --list

Cases are built from manifests here (the issue's shapes); each batch holds a family's seed
schedules (default first) and the baselines the family names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

GIB = 1 << 30

# Few long rows (issue 50): 1, 8 and 64 rows of 1M, 1 and 8 rows of 16M elements.
FEW_ROWS = "".join(
    f"[[shapes]]\nM = {m}\nN = {n}\n"
    for m, n in ((1, 1 << 20), (8, 1 << 20), (64, 1 << 20), (1, 1 << 24), (8, 1 << 24))
)

# name -> (manifest text). Sizes: at least 256 MiB of input; held-out shapes derived (odd).
CASES: dict[str, str] = {
    "bias_grad_bf16": """
name = "bias-grad-bf16"
[inputs.dy]
shape = ["T", "C"]
dtype = "bf16"
[outputs.db]
expr = "sum(dy, axis=0)"
dtype = "fp32"
[[shapes]]
T = 32768
C = 4096
""",
    "bias_grad_fp32": """
name = "bias-grad-fp32"
[inputs.dy]
shape = ["T", "C"]
dtype = "fp32"
[outputs.db]
expr = "sum(dy, axis=0)"
dtype = "fp32"
[[shapes]]
T = 16384
C = 4096
""",
    "bn_stats_nhwc_fp32": """
name = "bn-stats-nhwc"
[inputs.x]
shape = ["N", "H", "W", "C"]
dtype = "fp32"
[outputs.mu]
expr = "mean(x, axis=(0, 1, 2))"
dtype = "fp32"
[outputs.msq]
expr = "mean(x * x, axis=(0, 1, 2))"
dtype = "fp32"
[[shapes]]
N = 64
H = 32
W = 32
C = 1024
""",
    "bn_stats_nchw_bf16": """
name = "bn-stats-nchw"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "bf16"
[outputs.mu]
expr = "mean(x, axis=(0, 2, 3))"
dtype = "fp32"
[outputs.msq]
expr = "mean(x * x, axis=(0, 2, 3))"
dtype = "fp32"
[[shapes]]
N = 128
C = 256
H = 64
W = 64
""",
    "cumsum_long_rows_fp32": """
name = "cumsum-long-rows-fp32"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[outputs.y]
expr = "cumsum(x, axis=-1)"
dtype = "fp32"
[[shapes]]
M = 8
N = 8388608
""",
    "cumsum_tokens_bf16": """
name = "cumsum-tokens-bf16"
[inputs.x]
shape = ["B", "S", "D"]
dtype = "bf16"
[outputs.y]
expr = "cumsum(x, axis=1)"
dtype = "bf16"
[[shapes]]
B = 16
S = 8192
D = 1024
""",
    "maxpool_nchw_bf16": """
name = "maxpool-nchw-bf16"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "bf16"
[outputs.y]
expr = "maxpool(x, window=(3, 3), stride=2, padding=1)"
dtype = "bf16"
[[shapes]]
N = 168
C = 64
H = 112
W = 112
""",
    "instancenorm_bf16": """
name = "instancenorm-bf16"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "bf16"
[constants]
eps = 1e-5
[let]
mu = "mean(x, axis=(2, 3), keepdims=True)"
var = "mean((x - mu) ** 2, axis=(2, 3), keepdims=True)"
[outputs.y]
expr = "(x - mu) * rsqrt(var + eps)"
dtype = "bf16"
[[shapes]]
N = 128
C = 256
H = 64
W = 64
""",
    "seq_max_bf16": """
name = "seq-max-bf16"
[inputs.x]
shape = ["B", "S", "D"]
dtype = "bf16"
[outputs.y]
expr = "max(x, axis=1)"
dtype = "bf16"
[[shapes]]
B = 16
S = 8192
D = 1024
""",
    "mse_loss_bf16": """
name = "mse-loss-bf16"
[inputs.x]
shape = ["B", "D"]
dtype = "bf16"
[inputs.t]
shape = ["B", "D"]
dtype = "bf16"
[outputs.loss]
expr = "mean((x - t) ** 2, axis=None)"
dtype = "fp32"
[[shapes]]
B = 8192
D = 8192
""",
    "sumsq_fp32": """
name = "sumsq-fp32"
[inputs.g]
shape = ["R", "C"]
dtype = "fp32"
[outputs.s]
expr = "sum(g * g, axis=(0, 1))"
dtype = "fp32"
[[shapes]]
R = 16384
C = 4096
""",
    "cumsum_rows_fp32": """
name = "cumsum-rows-fp32"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[outputs.y]
expr = "cumsum(x, axis=-1)"
dtype = "fp32"
[[shapes]]
M = 65536
N = 1024
""",
    "argmax_vocab_bf16": """
name = "argmax-vocab-bf16"
[inputs.x]
shape = ["M", "V"]
dtype = "bf16"
[outputs.i]
expr = "argmax(x, axis=-1)"
dtype = "int64"
[[shapes]]
M = 2048
V = 65536
""",
    "softmax_few_rows_bf16": """
name = "softmax-few-rows-bf16"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
range = [-8.0, 8.0]
[let]
m = "max(x, axis=-1, keepdims=True)"
e = "exp(x - m)"
[outputs.y]
expr = "e / sum(e, axis=-1, keepdims=True)"
dtype = "bf16"
"""
    + FEW_ROWS,
    "layernorm_few_rows_fp32": """
name = "layernorm-few-rows-fp32"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[inputs.w]
shape = ["N"]
dtype = "fp32"
range = [0.5, 1.5]
[inputs.b]
shape = ["N"]
dtype = "fp32"
range = [-0.5, 0.5]
[constants]
eps = 1e-5
[let]
d = "x - mean(x, axis=-1, keepdims=True)"
var = "mean(d * d, axis=-1, keepdims=True)"
[outputs.y]
expr = "d * rsqrt(var + eps) * w + b"
dtype = "fp32"
"""
    + FEW_ROWS,
    "rmsnorm_few_rows_bf16": """
name = "rmsnorm-few-rows-bf16"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
[inputs.w]
shape = ["N"]
dtype = "bf16"
range = [0.5, 1.5]
[constants]
eps = 1e-6
[outputs.y]
expr = "x * rsqrt(mean(x * x, axis=-1, keepdims=True) + eps) * w"
dtype = "bf16"
"""
    + FEW_ROWS,
    "bias_gelu_few_rows_bf16": """
name = "bias-gelu-few-rows-bf16"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
[inputs.bias]
shape = ["N"]
dtype = "bf16"
[let]
h = "x + bias"
[outputs.y]
expr = "0.5 * h * (1.0 + tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)))"
dtype = "bf16"
"""
    + FEW_ROWS,
    "flat_scale_fp32": """
name = "flat-scale-fp32"
[inputs.x]
shape = ["M", "N"]
dtype = "fp32"
[outputs.y]
expr = "x * 1.5"
dtype = "fp32"
[[shapes]]
M = 256
N = 393216
[[shapes]]
M = 8191
N = 8193
""",
    "flat_silu_mul_bf16": """
name = "flat-silu-mul-bf16"
[inputs.a]
shape = ["M", "N"]
dtype = "bf16"
[inputs.b]
shape = ["M", "N"]
dtype = "bf16"
[outputs.y]
expr = "a * sigmoid(a) * b"
dtype = "bf16"
[[shapes]]
M = 16384
N = 8192
[[shapes]]
M = 1
N = 100000007
""",
    "flat_add_bf16_short_rows": """
name = "flat-add-bf16-short-rows"
[inputs.x]
shape = ["M", "N"]
dtype = "bf16"
[inputs.r]
shape = ["M", "N"]
dtype = "bf16"
[outputs.y]
expr = "x + r"
dtype = "bf16"
[[shapes]]
M = 4194304
N = 33
""",
    # pool (issue 50's fp32 and 1-D pooling, group norm over a rank-5 view): never run yet
    "maxpool_nchw_fp32": """
name = "maxpool-nchw-fp32"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "fp32"
[outputs.y]
expr = "maxpool(x, window=(3, 3), stride=2, padding=1)"
dtype = "fp32"
[[shapes]]
N = 84
C = 64
H = 112
W = 112
""",
    "avgpool1d_fp32": """
name = "avgpool1d-fp32"
[inputs.x]
shape = ["B", "C", "L"]
dtype = "fp32"
[outputs.y]
expr = "avgpool(x, window=4)"
dtype = "fp32"
[[shapes]]
B = 16
C = 256
L = 16384
""",
    "instancenorm_fp32": """
name = "instancenorm-fp32"
[inputs.x]
shape = ["N", "C", "H", "W"]
dtype = "fp32"
[constants]
eps = 1e-5
[let]
mu = "mean(x, axis=(2, 3), keepdims=True)"
var = "mean((x - mu) ** 2, axis=(2, 3), keepdims=True)"
[outputs.y]
expr = "(x - mu) * rsqrt(var + eps)"
dtype = "fp32"
[[shapes]]
N = 64
C = 256
H = 64
W = 64
""",
    "groupnorm_bf16": """
name = "groupnorm-bf16"
[inputs.x]
shape = ["N", "G", "Cg", "H", "W"]
dtype = "bf16"
[constants]
eps = 1e-5
[let]
mu = "mean(x, axis=(2, 3, 4), keepdims=True)"
var = "mean((x - mu) ** 2, axis=(2, 3, 4), keepdims=True)"
[outputs.y]
expr = "(x - mu) * rsqrt(var + eps)"
dtype = "bf16"
[[shapes]]
N = 256
G = 32
Cg = 16
H = 32
W = 32
""",
}


# The order cases run in when the time budget cannot hold them all: issue 50's few-long-row and
# flat cases first (never measured yet), then the families measured by the first GPU run.
PRIORITY = (
    "softmax_few_rows_bf16",
    "flat_scale_fp32",
    "layernorm_few_rows_fp32",
    "flat_silu_mul_bf16",
    "rmsnorm_few_rows_bf16",
    "bias_gelu_few_rows_bf16",
    "flat_add_bf16_short_rows",
)
# max-autotune compiles and tunes every shape: only for cases of at most this many shapes
AUTOTUNE_MAX_SHAPES = 2


def seed_schedules(fam, ir, w, seeds: int) -> list:
    """Up to `seeds` schedules that serve every timed shape of the case (the family's `fits`):
    each shape's default first, then each shape's other seeds, in turn. Where none serves them
    all, the first shape's seeds (the worker then reports the shapes a kernel fails)."""
    every = [dict(d) for d in w.shapes]
    per_shape = []
    for dims in w.shapes:
        dims = dict(dims)
        per_shape.append(fam.seeds(ir, dims) if fam.seeds else [fam.default_schedule(ir, dims)])
    out = []
    for rank in range(max(len(p) for p in per_shape)):
        for p in per_shape:
            if rank < len(p) and p[rank] not in out and len(out) < seeds:
                s = p[rank]
                if fam.fits is None or fam.fits(ir, s, every):
                    out.append(s)
    return out or per_shape[0][:seeds]


def build_batch(
    text: str, seeds: int, baselines: list[str] | None = None, budget_s: float = 2.0
) -> tuple[dict, str, list[str]]:
    """(batch dict, family name, candidate labels) for one case."""
    from factory import families
    from factory.agents.types import launch_to_dict, param_to_dict
    from factory.spec import load_manifest

    w = load_manifest(text)
    fam, ir = families.family_for(w)
    schedules = seed_schedules(fam, ir, w, seeds)
    cands, labels = [], []
    for i, s in enumerate(schedules):
        em = fam.emit(ir, s, "sm_90")
        cid = f"c{i}"
        cands.append({
            "id": cid,
            "ptx": em.ptx,
            "entry": em.entry,
            "params": [param_to_dict(p) for p in em.params],
            "launch": launch_to_dict(em.launch),
        })  # fmt: skip
        labels.append(f"{cid} {fam.label(s.to_dict())}")
    names = list(fam.baselines)
    if baselines is not None:
        names = [n for n in names if n in baselines]
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": fam.name,
        "manifest": w.manifest,
        "baseline_source": None,
        "shapes": [dict(d) for d in w.shapes],
        "heldout_shapes": [dict(d) for d in w.heldout_shapes],
        "candidates": cands,
        "baselines": names,
        "options": {"time_budget_s_per_candidate": budget_s},
    }
    return batch, fam.name, labels


def _dims_key(dims: dict) -> str:
    return "x".join(str(v) for v in dims.values())


def table(case: str, results: dict, labels: list[str]) -> list[str]:
    ceiling = results.get("copy_ceiling_tbps")
    out = [f"== {case} ({results.get('family')}): copy ceiling {ceiling} TB/s"]
    names = dict(zip([f"c{i}" for i in range(len(labels))], labels, strict=True))
    for rec in results.get("candidates", []) + results.get("baselines", []):
        key = rec.get("id") or rec.get("name", "?")
        who = names.get(key, key)[:60]
        if not rec["timing"]:
            out.append(f"  {who:60s} {rec['status']}: {rec.get('reason', '')[:80]}")
        for t in rec["timing"]:
            share = t["tbps"] / ceiling if ceiling else float("nan")
            out.append(
                f"  {who:60s} {_dims_key(t['dims']):>14s} {t['median_us']:10.1f} us "
                f"{t['tbps']:6.2f} TB/s {100 * share:5.1f}% of copy  [{rec['status']}]"
            )
    return out


def summary_rows(case: str, results: dict) -> list[dict]:
    """One row a timed shape: the best verified candidate, torch.compile and the best baseline
    (medians, us), and the copy ceiling's time for the shape's bytes."""
    ceiling = results.get("copy_ceiling_tbps") or 0.0
    best: dict[str, dict] = {}
    for rec in results.get("candidates", []):
        if rec["status"] != "passed":
            continue
        for t in rec["timing"]:
            k = _dims_key(t["dims"])
            if k not in best or t["median_us"] < best[k]["median_us"]:
                best[k] = t
    rows = []
    for k, t in best.items():
        base = {
            b["name"]: bt["median_us"]
            for b in results.get("baselines", [])
            if b["status"] == "passed"
            for bt in b["timing"]
            if _dims_key(bt["dims"]) == k
        }
        rows.append({
            "case": case,
            "dims": t["dims"],
            "ours_us": t["median_us"],
            "ours_spread_us": [t["p20_us"], t["p80_us"]],
            "share_of_copy": t["tbps"] / ceiling if ceiling else None,
            "torch_compile_us": base.get("torch_compile"),
            "best_baseline": min(base.items(), key=lambda kv: kv[1]) if base else None,
            "copy_us": t["bytes"] / (ceiling * 1e6) if ceiling else None,
        })  # fmt: skip
    return rows


def geomeans(rows: list[dict]) -> list[str]:
    """The geomean speedup over torch.compile, beside the most the copy ceiling allows there."""
    import math

    pairs = [r for r in rows if r["torch_compile_us"] and r["copy_us"]]
    if not pairs:
        return ["geomean over torch.compile: no case has both timings"]

    def geomean(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    ours = geomean([r["torch_compile_us"] / r["ours_us"] for r in pairs])
    bound = geomean([r["torch_compile_us"] / r["copy_us"] for r in pairs])
    out = [f"{'case':26s} {'dims':>14s} {'ours us':>9s} {'%copy':>6s} {'vs compile':>10s} "
           f"{'bound':>6s}  best baseline"]  # fmt: skip
    for r in rows:
        tc = r["torch_compile_us"]
        bb = r["best_baseline"]
        out.append(
            f"{r['case'][:26]:26s} {_dims_key(r['dims']):>14s} {r['ours_us']:9.1f} "
            f"{100 * (r['share_of_copy'] or 0):5.1f}% "
            f"{(tc / r['ours_us'] if tc else float('nan')):9.2f}x "
            f"{(tc / r['copy_us'] if tc and r['copy_us'] else float('nan')):5.2f}x  "
            f"{bb[0] + f' {bb[1]:.1f} us' if bb else '-'}"
        )
    out.append(
        f"geomean over torch.compile: {ours:.3f}x across {len(pairs)} shapes "
        f"(the copy ceiling allows {bound:.3f}x)"
    )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="case names (default: all, by PRIORITY)")
    ap.add_argument("--seeds", type=int, default=3, help="candidates a case (the family's seeds)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the raw results JSON")
    ap.add_argument("--list", action="store_true", help="build the batches, print, run nothing")
    ap.add_argument(
        "--budget-s", type=float, default=240.0,
        help="wall time for the whole run: a case starts only if the cases so far say it fits",
    )  # fmt: skip
    ap.add_argument(
        "--autotune-until", type=float, default=0.35,
        help="max-autotune runs while this share of the budget is not yet spent",
    )  # fmt: skip
    ap.add_argument("--time-per-candidate-s", type=float, default=0.6)
    args = ap.parse_args(argv)
    cases = args.case or [*PRIORITY, *(c for c in CASES if c not in PRIORITY)]
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    lines, rows, skipped = [], [], []
    started = time.monotonic()
    spent: list[float] = []
    for case in cases:
        elapsed = time.monotonic() - started
        expect = 1.3 * max(spent) if spent else 0.0
        if not args.list and elapsed + expect > args.budget_s:
            skipped.append(case)
            continue
        names = ["torch_eager", "torch_compile", "triton", "liger"]  # as the family has them
        few_shapes = CASES[case].count("[[shapes]]") <= AUTOTUNE_MAX_SHAPES
        if elapsed < args.autotune_until * args.budget_s and few_shapes:
            names.append("torch_compile_max_autotune")
        try:
            batch, fam, labels = build_batch(
                CASES[case], args.seeds, names, args.time_per_candidate_s
            )
        except Exception as e:  # noqa: BLE001 - a family not built yet: say so, go on
            lines.append(f"== {case}: not built ({type(e).__name__}: {e})")
            continue
        if args.list:
            lines.append(f"== {case}: family {fam}, {len(labels)} candidates, {batch['baselines']}")
            lines += [f"  {lab}" for lab in labels]
            continue
        import gpuworker

        t0 = time.monotonic()
        results = gpuworker.run_batch(batch)
        spent.append(time.monotonic() - t0)
        lines += table(case, results, labels)
        lines.append(f"  ({spent[-1]:.0f} s)")
        rows += summary_rows(case, results)
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{case}.json").write_text(json.dumps(results, indent=1))
        print("\n".join(lines[-len(labels) - 12 :]), flush=True)
    print("\n".join(lines))
    if skipped:
        print(f"skipped for the time budget ({args.budget_s:.0f} s): {', '.join(skipped)}")
    if not args.list:
        summary = geomeans(rows)
        print("\n".join(summary))
        if out:
            (out / "summary.json").write_text(
                json.dumps({"rows": rows, "skipped": skipped, "lines": summary}, indent=1)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
