"""The red-team kernels (tests/fixtures/redteam) as one worker batch, and their verdicts: what the
GPU worker's tests use, and on a GPU host a table of every verdict.

    PYTHONPATH=. python3 tests/gpuworker/gpuworker_redteam.py --out DIR

One batch holds every fixture, so the hanging and faulting kernels also prove that the rest of the
batch completes. Writes DIR/redteam.json (the full results file) and DIR/redteam.md (the table:
fixture, the way it cheats, expected verdict, the verdict it got, caught yes/no).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "redteam"


def build_batch(timeout_s: float = 4.0, budget_s: float = 0.25, only: list[str] | None = None):
    index = json.loads((FIXTURES / "fixtures.json").read_text())
    candidates = []
    for f in index["fixtures"]:
        if only and f["name"] not in only:
            continue
        candidates.append(
            {
                "id": f["name"],
                "ptx": (FIXTURES / f"{f['name']}.ptx").read_text(),
                "entry": f["name"],
                "params": index["params"],
                "launch": f.get("launch", index["launch"]),
            }
        )
    batch = {
        "format": 1,
        "batch_id": f"redteam-{uuid.uuid4()}",
        "manifest": (FIXTURES / index["manifest"]).read_text(),
        "baseline_source": None,
        "shapes": index["shapes"],
        "heldout_shapes": index["heldout_shapes"],
        "candidates": candidates,
        "baselines": [],
        "options": {"time_budget_s_per_candidate": budget_s, "timeout_s_per_candidate": timeout_s},
    }
    return batch, index


def verdicts(results: dict, index: dict) -> list[dict]:
    by_id = {c["id"]: c for c in results["candidates"]}
    rows = []
    for f in index["fixtures"]:
        c = by_id.get(f["name"])
        if c is None:
            continue
        caught = c["status"] == f["expect_status"] and f["expect_reason"] in c["reason"]
        rows.append(
            {
                "fixture": f["name"],
                "way": f["way"],
                "expected": f["expect_status"]
                + (f" ({f['expect_reason']})" if f["expect_reason"] else ""),
                "got_status": c["status"],
                "got_reason": c["reason"],
                "caught": caught,
                "median_us": min((t["median_us"] for t in c["timing"]), default=None),
            }
        )
    return rows


def table(rows: list[dict], results: dict, wall_s: float) -> str:
    lines = [
        "# Red team: cheating and broken kernels through the GPU worker",
        "",
        f"GPU: {results['env'].get('gpu')} ({results['env'].get('sm')}), driver "
        f"{results['env'].get('driver')}, cuda-core {results['env'].get('cuda_core')}; "
        f"batch of {len(rows)} kernels in {wall_s:.1f} s wall, "
        f"{results['env'].get('worker_restarts')} worker restarts; "
        f"copy ceiling {results.get('copy_ceiling_tbps') or 0:.2f} TB/s.",
        "",
        "| fixture | way | expected | got | reason (first 160 chars) | verdict right |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        reason = r["got_reason"][:160].replace("|", "/")
        ok = "yes" if r["caught"] else "**NO**"
        cells = [r["fixture"], r["way"], r["expected"], r["got_status"], reason, ok]
        lines.append("| " + " | ".join(cells) + " |")
    right = sum(r["caught"] for r in rows)
    lines += ["", f"{right} of {len(rows)} verdicts as expected."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--timeout", type=float, default=4.0)
    p.add_argument("--only", nargs="*")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from gpuworker import run_batch

    batch, index = build_batch(args.timeout, only=args.only)
    t0 = time.monotonic()
    results = run_batch(
        batch,
        log=lambda m: print(f"[{time.monotonic() - t0:6.1f}] {m}", file=sys.stderr, flush=True),
    )
    wall = time.monotonic() - t0
    rows = verdicts(results, index)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "redteam.json").write_text(
        json.dumps({"rows": rows, "wall_s": wall, "results": results}, indent=1)
    )
    md = table(rows, results, wall)
    (out / "redteam.md").write_text(md)
    print(md)
    return 0 if all(r["caught"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
