"""One-off: the shifted layouts of the three norms at 16384x4999 that compile clean, emitted by
this checkout's emitter into DIR (a probe_tail --sets folder): 128 threads of 5 chunks, 256 of 3
and 512 of 2, one or two rows a block, the weight loaded early or late, uncapped and every cap
up to 1536 threads an SM; with `groups`, also each late-loading layout with its columns loaded
one chunk at a time (col_groups = chunks); with `elems`, the weight's chunks element by element
(the emitter before the 4-byte words).

    python3 bench/results/2026-12-05-h100-colwords/emit_sets.py DIR [groups] [elems]
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su  # noqa: E402
from factory.compile import compile_ptx, rejection_reason  # noqa: E402
from factory.emit import emit  # noqa: E402
from factory.schedules import default_schedule, fit_tail, shifted_twin  # noqa: E402

GROUPS = "groups" in sys.argv[2:]
if "elems" in sys.argv[2:]:  # the weight's shifted chunks element by element, as before
    import factory.emit.rowkernel as rk

    rk.COL_WORDS = False


def cands(ir, dims):
    base = default_schedule(ir, dims)
    out = []
    for t, c in ((128, 5), (256, 3), (512, 2)):
        for r in (1, 2):
            for early in (False, True):
                for g in (1, c) if GROUPS and not early else (1,):
                    for cap in (0, 768, 1024, 1280, 1536):
                        s = replace(
                            base,
                            threads_per_row=t,
                            chunks=c,
                            rows_per_block=r,
                            early_cols=early,
                            min_threads_per_sm=cap,
                        )
                        s = shifted_twin(ir, fit_tail(ir, s, [dims]), [dims])
                        if s is None:
                            continue
                        s = replace(s, col_groups=g)
                        rep = compile_ptx(emit(ir, s).ptx)
                        if not rejection_reason(rep, s.threads_per_block):
                            out.append(s)
    return out


su.candidate_schedules = cands
import bench.probe_tail as pt  # noqa: E402

pt.CASES[:] = [(op, 16384, 4999) for op in ("layernorm", "rmsnorm", "add_rmsnorm")]
pt.emit_to(Path(sys.argv[1]))
