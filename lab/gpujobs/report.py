"""Markdown tables of the portal jobs' GPU results, made from the files alone (nothing typed).

    .venv/bin/python -m lab.gpujobs.report RESULTS_DIR [--imported DIR/imported.json]

Per job: what the judge verified (each entrant's verification records: shapes, held-out ones,
largest relative error, both runs bitwise equal, guard and input bytes changed; the timed runs
whose outputs were checked again), then per benchmarked shape every entrant's median with its
p20-p80, its throughput (TFLOP/s from the family's roofline for matmul and attention, TB/s of
bytes read and written once otherwise) and the speed ratio of each baseline to our best
(baseline time / ours: above 1 we are faster); unavailable or failed entrants with the reason.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCHES = ROOT / "lab" / "gpujobs" / "batches"
ORDER = ("matmul", "attention", "cumsum", "bias_grad")


def _dims(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def _flops(manifest: str, dims: dict) -> float | None:
    from factory import families
    from factory.spec import load_manifest

    w = load_manifest(manifest)
    fam, _ = families.family_for(w)
    if fam.name not in ("matmul", "attention"):
        return None
    return fam.roofline_of(w, dict(dims)).flops


def _verified(entry: dict) -> str:
    recs = entry.get("verification") or []
    if not recs:
        return "-"
    passed = sum(1 for r in recs if r.get("passed"))
    held = sum(1 for r in recs if r.get("heldout"))
    bitwise = sum(1 for r in recs if r.get("bitwise_equal"))
    guards = sum(int(r.get("guard_bytes_changed") or 0) for r in recs)
    inputs = sum(int(r.get("input_bytes_changed") or 0) for r in recs)
    worst = max((r.get("rel_err") or 0.0) for r in recs)
    timed = sum(int(t.get("timed_runs_checked") or 0) for t in entry.get("timing") or [])
    return (
        f"{passed}/{len(recs)} ({held} held-out), max rel. err {worst:.2e}, "
        f"{bitwise}/{len(recs)} bitwise repeatable, guard bytes changed {guards}, "
        f"input bytes changed {inputs}; {timed} timed runs checked"
    )


def job_section(key: str, results: dict, batch: dict, info: dict, imported: dict | None) -> str:
    env = results.get("env") or {}
    names = {c["id"]: c["entry"] for c in batch["candidates"]}
    out = [f"### {key}: {info['operator']} ({results.get('family')})", ""]
    out.append(
        f"Job `{info['job']}`, batch `{info['batch']}`; shapes "
        + ", ".join(_dims(d) for d in batch["shapes"])
        + "; held-out "
        + ", ".join(_dims(d) for d in batch["heldout_shapes"])
        + f". Seed {results.get('seed')}; copy ceiling {results.get('copy_ceiling_tbps')} TB/s; "
        f"ran {env.get('started_at')} to {env.get('finished_at')} on {env.get('gpu')}."
    )
    if imported:
        out.append(
            f"Imported: `{imported.get('import_output')}`; job {imported.get('status_before')} "
            f"-> {imported.get('status')} ({imported.get('stop_reason')}); best kernel "
            f"`{imported.get('best_entry')}` ({(imported.get('best_candidate') or '')[:8]}); "
            f"charts on the page: {', '.join(imported.get('charts') or [])}."
        )
    out += ["", "| entrant | status | verification (the judge's records) |", "|---|---|---|"]
    entrants = [
        (f"ours {names.get(c['id'], '?')} ({c['id'][:8]})", c) for c in results["candidates"]
    ]
    entrants += [(b["name"], b) for b in results["baselines"]]
    for name, e in entrants:
        status = e["status"]
        if status != "passed" and e.get("reason"):
            status += ": " + e["reason"].replace("|", "/").replace("\n", " ")[:160]
        out.append(f"| {name} | {status} | {_verified(e)} |")
    flags = [(n, f) for n, e in entrants for f in e.get("flags") or []]
    if flags:
        out += ["", "Flags: " + "; ".join(f"{n}: {f}" for n, f in flags)]
    for dims in batch["shapes"]:
        rows = []
        for name, e in entrants:
            if e["status"] != "passed":
                continue
            for t in e.get("timing") or []:
                if t["dims"] == dims:
                    rows.append((name, t))
        ours = [(n, t) for n, t in rows if n.startswith("ours")]
        if not ours:
            continue
        best_name, best = min(ours, key=lambda nt: nt[1]["median_us"])
        flops = _flops(batch["manifest"], dims)
        unit = "TFLOP/s" if flops else "TB/s"
        out += [
            "",
            f"**{_dims(dims)}** (best: {best_name})",
            "",
            f"| entrant | median us | p20-p80 us | {unit} | baseline / our best | SM MHz |",
            "|---|---|---|---|---|---|",
        ]
        for name, t in sorted(rows, key=lambda nt: nt[1]["median_us"]):
            m = t["median_us"]
            rate = flops / (m * 1e-6) / 1e12 if flops else t.get("tbps") or 0.0
            ratio = "" if name.startswith("ours") else f"{m / best['median_us']:.2f}x"
            out.append(
                f"| {name} | {m:.1f} | {t['p20_us']:.1f}-{t['p80_us']:.1f} | {rate:.2f} | "
                f"{ratio} | {t.get('sm_clock_min_mhz')}-{t.get('sm_clock_mhz')} |"
            )
    return "\n".join(out)


def report(results_dir: Path, imported_path: Path | None) -> str:
    index = json.loads((BATCHES / "jobs.json").read_text())
    imported = {}
    if imported_path and imported_path.exists():
        imported = {r["key"]: r for r in json.loads(imported_path.read_text())}
    parts = []
    for key in ORDER:
        path = results_dir / f"{key}.results.json"
        if key not in index:
            continue
        if not path.exists():
            parts.append(f"### {key}: {index[key]['operator']}\n\nNo results file.")
            continue
        results = json.loads(path.read_text())
        batch = json.loads((BATCHES / f"{key}.json").read_text())
        parts.append(job_section(key, results, batch, index[key], imported.get(key)))
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--imported", default=None)
    args = ap.parse_args(argv)
    print(report(Path(args.results_dir), Path(args.imported) if args.imported else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
