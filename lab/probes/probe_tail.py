"""Ragged rows: two emitters' kernels side by side at row lengths their layouts do not divide
(a GPU host for the timing; the emitting runs anywhere, no Django).

    # on any machine, once per emitter (PYTHONPATH picks the factory that emits):
    PYTHONPATH=CHECKOUT python3 lab/probes/probe_tail.py --emit-to DIR
    # on the GPU host:
    PYTHONPATH=. python3 -m lab.probes.probe_tail --out DIR --sets old=DIR1,new=DIR2 \\
        [--baselines torch_compile] [--reps 15] [--deadline-s 500]

Emit mode writes, for every case in CASES, the suite's screened candidates at that shape
(`bench.suite.candidate_schedules`, as the factory being imported screens them) and, where the
shape is a suite shape, the layouts of the last suite plan, each as a PTX file beside a
manifest (schedule, entry, parameters, launch geometry, and the nvJitLink resource report).

Run mode times, case by case in one process (bench.direct's Bench: one stream, the L2 flushed
before every run, interleaved rounds), every set's kernels and the baselines, each verified
first and again after timing (every output element finite, sampled rows against the float64
reference), and writes DIR/tail.json and a table: per case, each set's fastest verified
kernel, and per layout that both sets emitted (whatever its tail), the two
medians side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script (emit mode, with another checkout's factory)
    sys.path.append(str(Path(__file__).resolve().parents[2]))

PLAN = "bench/plans/suite-2026-12-04aa.json"
# (op, M, row length): rows of a multiple of 8 that no layout's chunks divide, row lengths
# that are not a multiple of 8, the two cross-entropy vocabularies of the suite and two more
# (50257 is odd), and two suite shapes as controls (whole chunks: the tail path never runs).
CASES = [
    ("rmsnorm", 16384, 5000),
    ("rmsnorm", 16384, 4999),
    ("add_rmsnorm", 16384, 5000),
    ("layernorm", 16384, 5000),
    ("softmax", 16384, 5000),
    ("silu_mul", 16384, 5000),
    ("gelu_tanh", 16384, 5000),
    ("cross_entropy", 4096, 50000),
    ("cross_entropy", 4096, 128256),
    ("add_rmsnorm", 16384, 4999),
    ("layernorm", 16384, 4999),
    ("softmax", 16384, 4999),
    ("silu_mul", 16384, 4999),
    ("gelu_tanh", 16384, 4999),
    ("cross_entropy", 4096, 50257),
    ("rmsnorm", 16384, 4096),
    ("softmax", 16384, 4096),
]


def _dims(ir, m: int, n: int) -> dict:
    return {ir.row_dim: n, **{d: m for d in ir.batch_dims}}


def emit_to(out: Path, tail: str | None = None) -> None:
    from bench.suite import candidate_schedules  # the candidates of that checkout too
    from factory.compile import compile_ptx
    from factory.emit import emit
    from factory.families.row.ir import lower
    from factory.families.row.schedules import Schedule, is_valid
    from factory.spec import load_catalogue

    root = Path(__file__).resolve().parents[2]
    plan = json.loads((root / PLAN).read_text())
    cat = load_catalogue()
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for op, m, n in CASES:
        ir = lower(cat[op])
        dims = _dims(ir, m, n)
        scheds = list(candidate_schedules(ir, dims))
        planned = plan.get(op, {}).get(f"{m}x{n}", [])
        scheds += [s for s in (Schedule.from_dict(d) for d in planned) if s not in scheds]
        if tail:  # the same layouts with another tail, where it is valid at this shape
            twins = (replace(s, tail=tail, flat=False) for s in scheds)
            scheds = list(dict.fromkeys(t for t in twins if is_valid(ir, t, dims)[0]))
        for s in scheds:
            em = emit(ir, s)
            manifest.append(write_kernel(out, op, m, n, dims, s, em, compile_ptx(em.ptx)))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} kernels written to {out}")


def write_kernel(out: Path, op: str, m: int, n: int, dims: dict, s, em, rep) -> dict:
    """Write one emitted kernel's PTX into `out`; its manifest record (what run mode reads)."""
    name = f"{op}-{m}x{n}-{s.tag()}.ptx"
    (out / name).write_text(em.ptx)
    return {
        "op": op,
        "dims": dims,
        "tag": s.tag(),
        "schedule": s.to_dict(),
        "file": name,
        "entry": em.entry,
        "params": [asdict(p) for p in em.params],
        "launch": asdict(em.launch),
        "registers": rep.registers,
        "spill_store_bytes": rep.spill_store_bytes,
    }


def write_set(out: Path, cases, variants, valid_only: bool = True) -> None:
    """A set of layouts for run mode: per (op, M, row length) of `cases`, each layout of
    `variants(ir, default, dims)` that emits and compiles without spills (and,
    with valid_only, that is_valid admits), written into `out` with manifest.json (each record
    also says whether the space's predicate admits it and whether it is the default) and the
    `cases` file; what was left out is printed with the reason."""
    from factory.compile import compile_ptx
    from factory.emit import emit
    from factory.families.row.ir import lower
    from factory.families.row.schedules import default_schedule, is_valid
    from factory.spec import load_catalogue

    out.mkdir(parents=True, exist_ok=True)
    cat = load_catalogue()
    manifest, names, why = [], [], {}
    for op, m, n in cases:
        ir = lower(cat[op])
        dims = _dims(ir, m, n)
        base = default_schedule(ir, dims)
        for s in variants(ir, base, dims):
            ok, reason = is_valid(ir, s, dims)
            key = f"{op} {n} {s.tag()}"
            if valid_only and not ok:
                why[key] = reason
                continue
            try:
                em = emit(ir, s)
            except Exception as e:  # the emitter's own limits
                why[key] = str(e)
                continue
            rep = compile_ptx(em.ptx)
            if not rep.ok or rep.spill_store_bytes:
                why[key] = f"spills {rep.spill_store_bytes}" if rep.ok else "fails"
                continue
            rec = write_kernel(out, op, m, n, dims, s, em, rep)
            manifest.append(rec | {"valid": ok, "default": s == base})
        names.append(f"{op}:{m}x{n}")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "cases").write_text(",".join(names))
    print(f"{len(manifest)} kernels written to {out}")
    for k, v in why.items():
        print("  not emitted:", k, "-", v)


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    """'op:MxN,...' as (op, rows, row length) triples."""
    out = []
    for part in filter(None, text.split(",")):
        op, shape = part.split(":")
        m, n = shape.lower().split("x")
        out.append((op, int(m), int(n)))
    return out


def _emitted(rec: dict, ptx: str):
    from factory.emit import Emitted
    from factory.spec.types import KernelParam, Launch

    la = dict(rec["launch"])
    la["grid"] = tuple(la["grid"])
    la["block"] = tuple(la["block"])
    la["cluster"] = tuple(la["cluster"]) if la.get("cluster") else None
    params = tuple(KernelParam(**p) for p in rec["params"])
    return Emitted(ptx=ptx, entry=rec["entry"], params=params, launch=Launch(**la))


def run(args) -> int:
    from bench.direct import (
        Bench,
        case_buffers,
        environment,
        judge,
        our_launcher,
        torch_entrant,
    )
    from bench.suite import compile_cached
    from factory.compile import rejection_reason
    from factory.families.row.ir import lower
    from factory.families.row.schedules import Schedule
    from factory.spec import load_catalogue

    t0 = time.time()
    sets = dict(x.split("=", 1) for x in args.sets.split(","))
    books = {k: json.loads((Path(d) / "manifest.json").read_text()) for k, d in sets.items()}
    cat = load_catalogue()
    bench = Bench()
    bench.rotate = args.order == "rotate"
    ceiling = bench.copy_ceiling_tbps()
    env = environment() | {"copy_ceiling_tbps": ceiling, "order": args.order}
    print(f"copy ceiling {ceiling:.3f} TB/s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for op, m, n in CASES:
        if time.time() - t0 > args.deadline_s:
            print(f"deadline: {op} {m}x{n} and later cases not run", flush=True)
            break
        w = cat[op]
        ir = lower(w)
        dims = _dims(ir, m, n)
        torch = bench.torch
        inputs, outputs, nbytes = case_buffers(bench, w, dims)
        entrants, records = {}, []
        for set_name, book in books.items():
            for rec in book:
                if rec["op"] != op or rec["dims"] != dims:
                    continue
                ptx = (Path(sets[set_name]) / rec["file"]).read_text()
                em = _emitted(rec, ptx)
                s = Schedule.from_dict(rec["schedule"])
                rep = compile_cached(ptx)
                r = {
                    "impl": "ours",
                    "set": set_name,
                    "tag": rec["tag"],
                    "registers": rep.registers,
                    "spill_store_bytes": rep.spill_store_bytes,
                }
                why = rejection_reason(rep, s.threads_per_block)
                records.append(r)
                if why:
                    r |= {"status": "rejected", "reason": why}
                    continue
                fn = our_launcher(bench, em, rep.cubin, inputs | outputs, dims)
                entrants[f"{set_name}:{rec['tag']}"] = (fn, r, outputs)
        for name in args.baselines.split(",") if args.baselines else []:
            from gpuworker.baselines import Unavailable

            r = {"impl": name, "set": "baseline", "tag": name}
            records.append(r)
            try:
                call, info, box = torch_entrant(name, w, inputs)
            except Unavailable as e:
                r |= {"status": "unavailable", "reason": str(e)}
                continue
            r |= info
            entrants[name] = (call, r, box)
        judge(bench, w, ir, dims, inputs, outputs, entrants, nbytes, args.reps)
        for r in records:
            if "median_us" in r:
                r["share_of_copy_ceiling"] = r["tbps"] / ceiling
        cases.append({"op": op, "dims": dims, "bytes": nbytes, "records": records})
        best = {}
        for r in records:
            if r.get("status") == "passed":
                k = r["set"] if r["impl"] == "ours" else r["impl"]
                if k not in best or r["median_us"] < best[k]["median_us"]:
                    best[k] = r
        line = "  ".join(f"{k} {v['median_us']:.1f} ({v['tag']})" for k, v in best.items())
        print(f"{op} {m}x{n}: {line}", flush=True)
        del inputs, outputs
        torch.cuda.empty_cache()
        # after every case, so that a call cut short keeps the cases it finished
        (out / "tail.json").write_text(json.dumps({"environment": env, "cases": cases}, indent=1))
    (out / "tail.md").write_text(table(cases, list(books), ceiling))
    print(table(cases, list(books), ceiling))
    return 0


def table(cases: list[dict], set_names: list[str], ceiling: float) -> str:
    """Per case, each set's fastest verified kernel and the baselines; then per layout both sets
    emitted (a tag's `u`, `z`, `y` or `j`, how it moves the tail, set aside), the medians side by
    side."""
    head = ["case"] + [f"{s}: fastest" for s in set_names] + ["baselines"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    pairs = []
    for c in cases:
        dims = "x".join(str(v) for v in reversed(list(c["dims"].values())))
        cells = [f"{c['op']} {dims}"]
        for s in set_names:
            rs = [r for r in c["records"] if r["set"] == s and r.get("status") == "passed"]
            if not rs:
                cells.append("none verified")
                continue
            b = min(rs, key=lambda r: r["median_us"])
            cells.append(f"{b['median_us']:.1f} us, {100 * b['tbps'] / ceiling:.1f}% ({b['tag']})")
        bl = [r for r in c["records"] if r["set"] == "baseline"]
        cells.append(
            ", ".join(
                f"{r['impl']} {r['median_us']:.1f}" if "median_us" in r else f"{r['impl']} -"
                for r in bl
            )
            or "-"
        )
        lines.append("| " + " | ".join(cells) + " |")
        by_tag: dict = {}
        for r in c["records"]:
            if r["impl"] == "ours":  # a layout, whatever its tail: one row
                layout = re.sub(r"[uzjy]+_", "_", r["tag"])
                by_tag.setdefault(layout, {})[r["set"]] = r
        for tag, d in by_tag.items():
            if all(s in d for s in set_names):
                pairs.append((f"{c['op']} {dims}", tag, [d[s] for s in set_names]))
    lines += [
        "",
        "| case | layout | " + " | ".join(set_names) + " |",
        "|---|---|" + "---|" * len(set_names),
    ]
    for case, tag, rs in pairs:
        cells = []
        for r in rs:
            if "median_us" in r:
                cells.append(f"{r['median_us']:.1f} ({r['registers']} regs)")
            else:
                cells.append(f"{r.get('status', '-')} ({r.get('registers', '-')} regs)")
        lines.append(f"| {case} | {tag} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--emit-to", metavar="DIR")
    p.add_argument("--out")
    p.add_argument("--sets", help="NAME=DIR,... of --emit-to folders")
    p.add_argument("--baselines", default="torch_compile")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--deadline-s", type=float, default=500.0)
    p.add_argument(
        "--order",
        choices=("rotate", "fixed"),
        default="rotate",
        help="each round starts one entrant later (rotate), or every round in one order",
    )
    p.add_argument(
        "--tail",
        help="emit mode: every candidate with this tail instead (e.g. shifted), where valid",
    )
    p.add_argument("--cases", help="op:MxN,... instead of CASES (emit and run alike)")
    args = p.parse_args(argv)
    if args.cases:
        CASES[:] = parse_cases(args.cases)
    if args.emit_to:
        emit_to(Path(args.emit_to), args.tail)
        return 0
    if not (args.out and args.sets):
        p.error("--out and --sets, or --emit-to")
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
