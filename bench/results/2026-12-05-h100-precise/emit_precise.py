"""One-off: the generator's starting layouts (factory.seeds) at odd row widths, as they are
(fast_math where the tolerance allows it) or each as its precise twin (fast_math=False: div.rn,
sqrt.rn and rcp.rn instead of the approximate forms), emitted into DIR (a probe_tail --sets
folder). On the CPU the precise twins of the norms' odd-width layouts compiled to fewer
registers (LayerNorm 16384x4999, the grouped shifted layout: 80 -> 64), since ptxas then keeps
the column pass's loads below the reduction; this times whether that is faster.

    python3 bench/results/2026-12-05-h100-precise/emit_precise.py DIR [precise]
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su  # noqa: E402
from factory.schedules import is_valid  # noqa: E402
from factory.seeds import candidate_schedules  # noqa: E402

PRECISE = "precise" in sys.argv[2:]


def cands(ir, dims):
    out = candidate_schedules(ir, dims)
    if PRECISE:
        twins = (replace(s, fast_math=False) for s in out if s.fast_math)
        out = [s for s in twins if is_valid(ir, s, dims)[0]]
    return out


su.candidate_schedules = cands
import bench.probe_tail as pt  # noqa: E402

pt.CASES[:] = [
    (op, m, n)
    for op in ("layernorm", "rmsnorm", "add_rmsnorm")
    for m, n in ((16384, 4999), (16384, 5000), (4096, 2999))
] + [("silu_mul", 16384, 4999)]
pt.emit_to(Path(sys.argv[1]))
