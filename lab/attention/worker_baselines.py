"""Issue 49's baselines through the GPU worker itself: for each attention example
(factory/examples/attention_*.toml) one format-1 batch, as the portal builds it (family
"attention", the family's default kernel as the one candidate, the baselines the family names:
torch_eager, sdpa_flash, sdpa_cudnn, flex_attention), run by gpuworker.run_batch at a small
shape. The worker checks every entrant against the float64 reference (the shape and the
manifest's held-out shapes) before it times it; this script only reports what came back.

    python3 -m lab.attention.worker_baselines --out $OUT [--budget-s 200] [--only softcap,gqa]

Writes $OUT/worker_baselines.json (every record as the worker returned it, PTX left out) and
prints a table last: per example, the candidate's and each baseline's status and median time,
or the reason it is unavailable or failed. Needs a GPU, torch and cuda-python; no Django.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "factory" / "examples"
# Small enough that the float64 reference and flex's compiles take seconds, large enough for
# several key tiles per query tile (the band's skipped, full and diagonal tiles all occur).
SHAPE = {"B": 1, "H": 8, "S": 1024}
GQA_SHAPE = {"B": 1, "H": 8, "HKV": 2, "S": 1024}


def batch_for(stem: str) -> tuple[dict, dict]:
    """(batch, shape): the example's batch at SHAPE with its default kernel."""
    from factory import families
    from factory.spec import load_manifest
    from gpuworker.batch import launch_to_json, params_to_json

    text = (EXAMPLES / f"{stem}.toml").read_text()
    w = load_manifest(text)
    fam, ir = families.family_for(w)
    shape = GQA_SHAPE if "HKV" in w.shapes[0] else SHAPE
    schedule = fam.default_schedule(ir, [shape])
    kernel = fam.emit(ir, schedule)
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": fam.name,
        "manifest": text,
        "baseline_source": None,
        "shapes": [shape],
        "heldout_shapes": [dict(d) for d in w.heldout_shapes],
        "candidates": [
            {
                "id": f"{stem}:{fam.label(schedule.to_dict())}",
                "ptx": kernel.ptx,
                "entry": kernel.entry,
                "params": params_to_json(kernel.params),
                "launch": launch_to_json(kernel.launch),
            }
        ],
        "baselines": list(fam.baselines),
        "options": {
            "time_budget_s_per_candidate": 1.0,
            "timeout_s_per_candidate": 60,
            "seed": None,
        },
    }
    return batch, shape


def _median(rec: dict) -> str:
    t = rec.get("timing") or []
    return f"{t[0]['median_us']:.1f} us" if t else ""


def _cell(rec: dict) -> str:
    if rec.get("status") == "passed":
        return f"passed {_median(rec)}"
    return f"{rec.get('status')}: {str(rec.get('reason', ''))[:70]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting examples after")
    ap.add_argument("--only", default="", help="comma-separated stems without attention_")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from gpuworker import run_batch

    stems = sorted(p.stem for p in EXAMPLES.glob("attention_*.toml"))
    if args.only:
        wanted = {f"attention_{s.strip()}" for s in args.only.split(",") if s.strip()}
        stems = [s for s in stems if s in wanted]
    t0 = time.monotonic()
    report: dict = {"shape": SHAPE, "gqa_shape": GQA_SHAPE, "examples": {}}
    for stem in stems:
        if time.monotonic() - t0 > args.budget_s:
            report["examples"][stem] = {"skipped": f"budget of {args.budget_s:.0f} s spent"}
            continue
        started = time.monotonic()
        try:
            batch, shape = batch_for(stem)
            res = run_batch(batch)
        except Exception as e:  # noqa: BLE001 - one example's failure is reported, not fatal
            report["examples"][stem] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print(f"{stem}: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        for c in res.get("candidates", []):
            c.pop("ptx", None)
        report["examples"][stem] = {
            "shape": shape,
            "wall_s": round(time.monotonic() - started, 1),
            "env": res.get("env"),
            "candidates": res.get("candidates"),
            "baselines": res.get("baselines"),
        }
        print(f"{stem}: done in {time.monotonic() - started:.0f} s", flush=True)
        (out / "worker_baselines.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "worker_baselines.json").write_text(json.dumps(report, indent=1, default=str))

    print()
    print(f"{'example':26} {'entrant':16} result")
    for stem, r in report["examples"].items():
        if "candidates" not in r:
            print(f"{stem:26} {'-':16} {r.get('error') or r.get('skipped')}")
            continue
        for c in r["candidates"]:
            print(f"{stem:26} {'kernel':16} {_cell(c)}")
        for b in r["baselines"]:
            print(f"{stem:26} {b['name']:16} {_cell(b)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
