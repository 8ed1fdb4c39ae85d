"""One-off: RMSNorm at decode shapes, layouts x load hints x weight timing."""
import sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su
from factory.schedules import default_schedule, fit_tail, is_valid

def cands(ir, dims, limit=99):
    n = dims[ir.row_dim]
    base = default_schedule(ir, dims)
    out = []
    for t in (128, 256, 512, 1024):
        c = -(-n // (t * 8))
        if c > 8:
            continue
        for lh in ("nc_l2last", "nc", "none"):
            for e in (False, True):
                s = fit_tail(ir, replace(base, threads_per_row=t, chunks=c, rows_per_block=1,
                                         load_hint=lh, early_cols=e), [dims])
                if is_valid(ir, s, dims)[0]:
                    out.append(s)
    return out

su.candidate_schedules = cands
import bench.probe_tail as pt
pt.CASES = [(c.split(":")[0], *map(int, c.split(":")[1].split("x"))) for c in sys.argv[2].split(",")]
pt.emit_to(Path(sys.argv[1]))
