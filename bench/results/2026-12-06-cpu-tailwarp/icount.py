"""Warp instructions issued per row, counted in the CPU interpreter of the tests
(tests/factory/test_emit_sim.py): for each layout, one full block of rows at 256 and 200 columns,
each warp counted at its busiest lane (predicated-off instructions count: they issue too),
divided by the rows; then LayerNorm's default at 200 columns by opcode (thread instructions
executed per row, predicated-off ones left out). PTX instructions, not SASS: ptxas may merge or
split them, and the f32/b32 moves cost nothing there.

    PYTHONPATH=. python3 bench/results/2026-12-06-cpu-tailwarp/icount.py
"""

import collections
import sys

sys.path.insert(0, "tests/factory")
sys.path.insert(0, ".")
from dataclasses import replace

import numpy as np
import test_emit_sim
from test_emit_sim import Kernel, Memory, run_blocks

from factory.emit import emit
from factory.ir import lower
from factory.schedules import default_schedule, fit_tail
from factory.spec import load_catalogue, random_inputs

cat = load_catalogue()


def per_row(name, s, n):
    w = cat[name]
    ir = lower(w)
    em = emit(ir, s)
    rows_per_block = s.rows_per_block * s.rows_per_thread
    m = rows_per_block
    dims = {"M": m, ir.row_dim: n}
    inputs = random_inputs(w, dims, 1)
    k = Kernel(em.ptx)
    mem = Memory()
    params = {}
    for (_ptype, pname), p in zip(k.params, em.params, strict=True):
        if p.kind == "tensor":
            arr = inputs.get(p.name)
            if arr is None:  # an output (bf16 rows)
                arr = np.zeros((m, n), dtype=np.uint16)
            params[pname] = mem.alloc(p.name, np.ascontiguousarray(arr).tobytes())
        else:
            params[pname] = int(dims[p.name])
    th = run_blocks(k, [0], 1, em.launch.block[0], params, mem)
    warps = [max(t.steps for t in th[i : i + 32]) for i in range(0, len(th), 32)]
    return sum(warps) / m


for name in ("layernorm", "rmsnorm"):
    ir = lower(cat[name])
    for n in (256, 200):
        d = {"M": 131072, "N": n}
        base = default_schedule(ir, d)

        def warp(ir=ir, base=base, d=d, **kw):  # a warp a row, one chunk a lane
            return fit_tail(ir, replace(base, threads_per_row=32, chunks=1, **kw), [d])

        cands = {
            "default": base,
            "ct16r8s2": fit_tail(
                ir,
                replace(base, threads_per_row=16, chunks=2, rows_per_block=8, rows_per_thread=2),
                [d],
            ),
            "ct32r1c1s4": warp(rows_per_block=1, rows_per_thread=4, split_paths=False),
            "ct32r1c1s4 split": warp(rows_per_block=1, rows_per_thread=4, split_paths=True),
            "ct32r4c1 (old default)": warp(rows_per_block=4, rows_per_thread=1, split_paths=False),
        }
        for lab, s in cands.items():
            print(
                f"{name} {n} {lab:24s} {s.tag():26s} warp-instr/row {per_row(name, s, n):7.1f}",
                flush=True,
            )

mix = collections.Counter()
run = test_emit_sim.Thread.execute


def counted(self, op, a):
    mix[op.split(".")[0]] += 1
    return run(self, op, a)


test_emit_sim.Thread.execute = counted
ir = lower(cat["layernorm"])
s = default_schedule(ir, {"M": 131072, "N": 200})
per_row("layernorm", s, 200)
rows = s.rows_per_block * s.rows_per_thread
print(f"layernorm 200 {s.tag()}: {sum(mix.values()) / rows:.0f} thread instructions a row")
for op, k in mix.most_common(12):
    print(f"  {op:8s} {k / rows:7.1f}")
