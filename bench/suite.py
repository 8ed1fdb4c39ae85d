"""The benchmark suite: generated kernels against every baseline, on the GPU, in one run.

    PYTHONPATH=. python3 -m bench.suite --out bench/results [--max-autotune] [--direct]

(placeholder while the batch path is written: --direct times our kernels with bench.direct)
"""

from __future__ import annotations

import ast
import json
import os
import sys
from dataclasses import replace

from factory.schedules import Schedule, default_schedule

SUITE_SHAPES = {
    "softmax": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "layernorm": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "rmsnorm": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "add_rmsnorm": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "silu_mul": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "gelu_tanh": [{"M": 16384, "N": 4096}, {"M": 16384, "N": 8192}, {"M": 32768, "N": 4096}],
    "cross_entropy": [{"M": 4096, "N": 32000}, {"M": 4096, "N": 128256}],
}


def eval_launch(expr, dims) -> int:
    """Evaluate the emitter's launch strings: ints, dim names, + - * //, ceildiv, min, max."""
    if isinstance(expr, int):
        return expr

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            return int(dims[n.id])
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.FloorDiv):
                return a // b
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(n.op)]
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            args = [ev(a) for a in n.args]
            if n.func.id == "ceildiv":
                return -(-args[0] // args[1])
            return {"min": min, "max": max}[n.func.id](args)
        raise ValueError(f"unexpected launch expression {expr!r}")

    return ev(ast.parse(str(expr), mode="eval"))


def candidate_schedules(ir, dims) -> list[Schedule]:
    """A handful of layouts worth timing at `dims` (deduplicated, valid)."""
    from factory.schedules import is_valid

    base = default_schedule(ir, dims)
    n = dims[ir.row_dim]
    v = base.vec_elems
    out = [base]
    if base.mode == "cached":
        for t in (64, 128, 256, 512, 1024):
            for c in (1, 2, 4, 8):
                if t * v * c >= n > t * v * c // 2:
                    out.append(replace(base, threads_per_row=t, chunks=c, rows_per_block=1))
        out.append(replace(base, persistent_blocks_per_sm=2))
        out.append(replace(base, store_hint="none", load_hint="nc"))
    else:
        out += [
            replace(base, threads_per_row=512, chunks=4),
            replace(base, threads_per_row=1024, chunks=2),
            replace(base, threads_per_row=1024, chunks=8),
        ]
    if ir.online and n <= 65536:
        out.append(replace(base, mode="stream", online=True, threads_per_row=1024, chunks=4))
    seen, uniq = set(), []
    for s in out:
        if s not in seen and all(is_valid(ir, s, d)[0] for d in [dims]):
            seen.add(s)
            uniq.append(s)
    return uniq


def _hand_examples():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "factory"))
    import test_ir_examples as ex

    return ex


def main_direct(out_dir: str) -> int:
    from bench.direct import Device, run_ir

    ex = _hand_examples()
    dev = Device()
    ceiling = dev.copy_ceiling_tbps()
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)
    results = {"copy_ceiling_tbps": ceiling, "runs": []}

    def ref_fn(o, f64, rows):
        sub = {
            k: (v[rows] if v.ndim and v.shape[0] > max(rows) and k != "w" and k != "b" else v)
            for k, v in f64.items()
        }
        r = ex.eval64(o.node, sub)
        return r.reshape(len(rows), -1) if o.role == "row" else r.reshape(len(rows))

    for name in ("softmax", "layernorm", "add_rmsnorm", "silu_mul", "gelu_tanh", "cross_entropy"):
        ir = ex.EXAMPLES[name]()
        for dims in SUITE_SHAPES[name][:2]:
            recs = run_ir(dev, ir, candidate_schedules(ir, dims), dims, ref_fn)
            for r in recs:
                r["op"] = name
                print(
                    f"{name:14s} {dims['M']}x{dims['N']:<7d} {r['tag']:28s} "
                    f"{r.get('status'):8s} {r.get('median_us', 0):9.1f} us "
                    f"{r.get('tbps', 0):5.2f} TB/s regs {r.get('registers')} "
                    f"chk {r.get('check')} {r.get('reason', '')}",
                    flush=True,
                )
            results["runs"] += recs
    with open(os.path.join(out_dir, "direct.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.suite")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--direct", action="store_true")
    p.add_argument("--max-autotune", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.direct:
        return main_direct(args.out)
    raise SystemExit("the batch path is not written yet")


if __name__ == "__main__":
    sys.exit(main())
