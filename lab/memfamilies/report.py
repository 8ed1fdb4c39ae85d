"""Tables for a memfamilies GPU run, made from its raw worker results (raw/<case>.json as
lab.memfamilies.bench writes them), for the run's README:

    .venv/bin/python -m lab.memfamilies.report bench/results/<run>/raw \
        --before bench/results/<earlier run>/raw

Prints, per case: the checks counted from each entrant's verification list and timed runs;
then a row per timed shape: the candidate that is the family's default at that shape (found by
emitting the default schedule with today's code and matching its PTX hash against the run's
candidates; "-" where none matches, e.g. a run of older code) and the best candidate at that
shape (picked after timing, so an upper estimate of what one kernel reaches), their share of
the run's copy ceiling, the worker's byte mover of the same bytes (one pass, computing
nothing) as that share's bound, for two-pass row operators the bound with the row read twice,
torch.compile and the best baseline; with --before, the earlier run's best at the same shape.
Nothing here needs a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tomllib
from pathlib import Path

from lab.memfamilies.bench import CASES

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "int32": 4, "int64": 8}


def load_run(raw: Path) -> dict[str, dict]:
    """case name -> the worker's results, for every raw/<case>.json that holds candidates."""
    out = {}
    for f in sorted(raw.glob("*.json")):
        d = json.loads(f.read_text())
        if "candidates" in d:
            out[f.stem] = d
    return out


def dims_key(dims: dict) -> str:
    return "x".join(str(v) for v in dims.values())


def checks(results: dict) -> dict:
    """Counts of the verification records and checked timed runs, ours and the baselines'."""
    out = {}
    for side in ("candidates", "baselines"):
        recs = results.get(side, [])
        ver = [v for r in recs for v in r.get("verification", [])]
        out[side] = {
            "entrants": len(recs),
            "passed_entrants": sum(r["status"] == "passed" for r in recs),
            "checks": len(ver),
            "checks_passed": sum(v["passed"] for v in ver),
            "heldout_checks": sum(v["heldout"] for v in ver),
            "not_bitwise_equal": sum(not v.get("bitwise_equal", True) for v in ver),
            "timed_runs_checked": sum(
                t.get("timed_runs_checked", 0) for r in recs for t in r.get("timing", [])
            ),
            "unavailable": [r["name"] for r in recs if r["status"] == "unavailable"],
        }
    return out


def two_pass_bytes(case: str, dims: dict) -> int:
    """Bytes of the row input a two-pass row operator reads a second time (0 for one pass).
    A rowsplit case reduces along the row where its manifest says axis=-1; its row input is
    the one shaped [M, N]."""
    text = CASES.get(case, "")
    if "axis=-1" not in text:
        return 0
    spec = tomllib.loads(text)
    total = 0
    for inp in spec.get("inputs", {}).values():
        if inp["shape"] == ["M", "N"]:
            total += dims["M"] * dims["N"] * DTYPE_BYTES[inp["dtype"]]
    return total


def default_ids(case: str, results: dict) -> dict[str, str]:
    """dims key -> id of the run's candidate whose PTX is the family's default at those dims
    (as lab.memfamilies.bench emits it today); shapes with no such candidate are left out."""
    if case not in CASES:
        return {}
    from factory import families
    from factory.spec import load_manifest

    w = load_manifest(CASES[case])
    fam, ir = families.family_for(w)
    by_sha = {c["ptx_sha256"]: c["id"] for c in results["candidates"]}
    out = {}
    for t in results["candidates"][0]["timing"] if results["candidates"] else []:
        em = fam.emit(ir, fam.default_schedule(ir, dict(t["dims"])), "sm_90")
        cid = by_sha.get(hashlib.sha256(em.ptx.encode()).hexdigest())
        if cid:
            out[dims_key(t["dims"])] = cid
    return out


def shape_rows(case: str, results: dict, defaults: bool = True) -> list[dict]:
    """One row a timed shape (see the module's docstring)."""
    ceiling = results["copy_ceiling_tbps"]
    movers = {
        dims_key(m["dims"]): m["median_us"]
        for m in results.get("byte_mover") or []
        if isinstance(m, dict) and m.get("median_us")
    }
    cands = [c for c in results["candidates"] if c["status"] == "passed"]
    bases = [b for b in results["baselines"] if b["status"] == "passed"]
    rows = []
    shapes = [t["dims"] for t in cands[0]["timing"]] if cands else []
    default_of = default_ids(case, results) if defaults else {}
    for dims in shapes:
        k = dims_key(dims)

        def at(rec, k=k):
            return next((t for t in rec["timing"] if dims_key(t["dims"]) == k), None)

        timed = [(c["id"], at(c)) for c in cands if at(c)]
        best_id, best = min(timed, key=lambda p: p[1]["median_us"])
        default_id = default_of.get(k)
        default = dict(timed).get(default_id) if default_id else None
        base = {b["name"]: at(b)["median_us"] for b in bases if at(b)}
        copy_us = best["bytes"] / (ceiling * 1e6)
        mover = movers.get(k)
        extra = two_pass_bytes(case, dims)
        rows.append({
            "case": case,
            "dims": k,
            "default_id": default_id,
            "default_us": default["median_us"] if default else None,
            "best_id": best_id,
            "best_us": best["median_us"],
            "best_p20_p80": (best["p20_us"], best["p80_us"]),
            "copy_us": copy_us,
            "mover_us": mover,
            "two_pass_us": (mover + extra / (ceiling * 1e6)) if mover and extra else None,
            "compile_us": base.get("torch_compile"),
            "autotune_us": base.get("torch_compile_max_autotune"),
            "best_baseline": min(base.items(), key=lambda kv: kv[1]) if base else None,
        })  # fmt: skip
    return rows


def _pct(copy_us, us):
    return f"{100 * copy_us / us:5.1f}%" if us else "    -"


def _x(num, den):
    return f"{num / den:5.2f}x" if num and den else "    -"


def _us(us, cid) -> str:
    return f"{us:7.1f} ({cid})" if us else f"{'-':>12s}"


def _base(bb) -> str:
    if not bb:
        return "-"
    return f"{bb[0].replace('torch_compile_max_autotune', 'max_autotune')} {bb[1]:.1f}"


def table(rows: list[dict], before: dict[tuple, dict] | None = None) -> list[str]:
    head = (
        f"{'case':24s} {'dims':>12s} {'default us':>12s} {'best us':>12s} {'%copy':>6s} "
        f"{'mover%':>6s} {'2pass%':>6s} {'compile':>8s} {'vs cmp':>6s} {'dflt vs':>7s} "
        f"{'best baseline':>22s}"
    )
    if before is not None:
        head += f" | {'run1 us':>7s} {'%copy':>6s} {'vs cmp':>6s} {'run1 best baseline':>22s}"
    out = [head]
    for r in rows:
        bb = r["best_baseline"]
        line = (
            f"{r['case'][:24]:24s} {r['dims']:>12s} "
            f"{_us(r['default_us'], r['default_id'])} {_us(r['best_us'], r['best_id'])} "
            f"{_pct(r['copy_us'], r['best_us'])} {_pct(r['copy_us'], r['mover_us'])} "
            f"{_pct(r['copy_us'], r['two_pass_us'])} "
            f"{r['compile_us'] or float('nan'):8.1f} {_x(r['compile_us'], r['best_us'])} "
            f" {_x(r['compile_us'], r['default_us'])} "
            f"{_base(bb):>22s}"
        )
        if before is not None:
            b = before.get((r["case"], r["dims"]))
            line += (
                f" | {b['best_us']:7.1f} {_pct(b['copy_us'], b['best_us'])} "
                f"{_x(b['compile_us'], b['best_us'])} {_base(b['best_baseline']):>22s}"
                if b
                else " | not run"
            )
        out.append(line)
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path, help="the run's raw/ folder")
    ap.add_argument("--before", type=Path, help="an earlier run's raw/ folder to compare with")
    args = ap.parse_args(argv)
    run = load_run(args.raw)
    before = None
    if args.before:
        before = {
            (r["case"], r["dims"]): r
            for case, res in load_run(args.before).items()
            for r in shape_rows(case, res, defaults=False)
        }
    print("checks (verification records: passed/all, held-out among them; timed runs checked)")
    for case, res in run.items():
        c = checks(res)
        for side, s in c.items():
            print(
                f"  {case:26s} {side:10s} {s['passed_entrants']}/{s['entrants']} passed, "
                f"{s['checks_passed']}/{s['checks']} checks ({s['heldout_checks']} held-out, "
                f"{s['not_bitwise_equal']} not bitwise equal), "
                f"{s['timed_runs_checked']} timed runs checked"
                + (f"; unavailable: {', '.join(s['unavailable'])}" if s["unavailable"] else "")
            )
    rows = [r for case, res in run.items() for r in shape_rows(case, res)]
    print()
    print("\n".join(table(rows, before)))
    pairs = [r for r in rows if r["compile_us"]]
    print()
    for label, key in (("best a shape", "best_us"), ("the default a shape", "default_us")):
        have = [r for r in pairs if r[key]]
        g = geomean([r["compile_us"] / r[key] for r in have])
        print(f"geomean over torch.compile, {label}: {g:.3f}x across {len(have)} shapes")
    g_copy = geomean([r["compile_us"] / r["copy_us"] for r in pairs])
    g_mover = geomean([r["compile_us"] / r["mover_us"] for r in pairs if r["mover_us"]])
    g_two = geomean(
        [r["compile_us"] / (r["two_pass_us"] or r["mover_us"]) for r in pairs if r["mover_us"]]
    )
    print(
        f"bounds over torch.compile: copy ceiling {g_copy:.3f}x, one-pass mover {g_mover:.3f}x, "
        f"two-pass (row read twice where the operator needs it) {g_two:.3f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
