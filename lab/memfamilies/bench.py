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
import sys
import time
import uuid
from pathlib import Path

GIB = 1 << 30

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
}


def build_batch(text: str, seeds: int) -> tuple[dict, str, list[str]]:
    """(batch dict, family name, candidate labels) for one case."""
    from factory import families
    from factory.agents.types import launch_to_dict, param_to_dict
    from factory.spec import load_manifest

    w = load_manifest(text)
    fam, ir = families.family_for(w)
    dims = dict(w.shapes[0])
    schedules = fam.seeds(ir, dims)[:seeds] if fam.seeds else [fam.default_schedule(ir, dims)]
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
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": fam.name,
        "manifest": w.manifest,
        "baseline_source": None,
        "shapes": [dict(d) for d in w.shapes],
        "heldout_shapes": [dict(d) for d in w.heldout_shapes],
        "candidates": cands,
        "baselines": list(fam.baselines),
        "options": {"time_budget_s_per_candidate": 2.0},
    }
    return batch, fam.name, labels


def table(case: str, results: dict, labels: list[str]) -> list[str]:
    ceiling = results.get("copy_ceiling_tbps")
    out = [f"== {case} ({results.get('family')}): copy ceiling {ceiling} TB/s"]
    names = dict(zip([f"c{i}" for i in range(len(labels))], labels, strict=True))
    for rec in results.get("candidates", []) + results.get("baselines", []):
        key = rec.get("id") or rec.get("name", "?")
        who = names.get(key, key)
        if not rec["timing"]:
            out.append(f"  {who:70s} {rec['status']}: {rec.get('reason', '')[:80]}")
        for t in rec["timing"]:
            share = t["tbps"] / ceiling if ceiling else float("nan")
            out.append(
                f"  {who:70s} {t['median_us']:10.1f} us {t['tbps']:6.2f} TB/s "
                f"{100 * share:5.1f}% of copy  [{rec['status']}]"
            )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="case names (default: all)")
    ap.add_argument("--seeds", type=int, default=6, help="candidates a case (the family's seeds)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the raw results JSON")
    ap.add_argument("--list", action="store_true", help="build the batches, print, run nothing")
    args = ap.parse_args(argv)
    cases = args.case or list(CASES)
    lines = []
    for case in cases:
        try:
            batch, fam, labels = build_batch(CASES[case], args.seeds)
        except Exception as e:  # noqa: BLE001 - a family not built yet: say so, go on
            lines.append(f"== {case}: not built ({type(e).__name__}: {e})")
            continue
        if args.list:
            lines.append(f"== {case}: family {fam}, {len(labels)} candidates")
            lines += [f"  {lab}" for lab in labels]
            continue
        import gpuworker

        t0 = time.monotonic()
        results = gpuworker.run_batch(batch)
        lines += table(case, results, labels)
        lines.append(f"  ({time.monotonic() - t0:.0f} s)")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{case}.json").write_text(json.dumps(results, indent=1))
        print("\n".join(lines[-len(labels) - 8 :]), flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
