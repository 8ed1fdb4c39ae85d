"""One-off: the shifted layouts of the three norms at 16384x4999 that compile clean, emitted by
this checkout's emitter into DIR (a probe_tail --sets folder), with the column vector's whole
chunks moved as MODE ("window": two aligned 16-byte loads, picked out in registers; "words":
4-byte words put in place with prmt). The layouts: 128 threads of 5 chunks, 256 of 3 and 512 of
2, one or two rows a block, the weight loaded early, late, or late one chunk at a time, uncapped
and capped at 768-1536 threads an SM, each with fast and precise math.

    python3 bench/results/2026-12-05-h100-colwindow/emit_sets.py DIR MODE

"window" is the emitter with window.patch applied (it did not land). `cands` is also used by
../2026-12-05-h100-shiftpreds/emit_sets.py.
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import bench.suite as su  # noqa: E402
import factory.emit.rowkernel as rk  # noqa: E402
from factory.compile import compile_ptx, rejection_reason  # noqa: E402
from factory.emit import emit  # noqa: E402
from factory.schedules import default_schedule, fit_tail, shifted_twin  # noqa: E402



def cands(ir, dims):
    base = default_schedule(ir, dims)
    out = []
    for t, c in ((128, 5), (256, 3), (512, 2)):
        for r in (1, 2):
            for early, g in ((True, 1), (False, 1), (False, c)):
                for cap in (0, 768, 1024, 1280, 1536):
                    for fast in (True, False):
                        s = replace(
                            base,
                            threads_per_row=t,
                            chunks=c,
                            rows_per_block=r,
                            early_cols=early,
                            min_threads_per_sm=cap,
                            fast_math=fast,
                        )
                        s = shifted_twin(ir, fit_tail(ir, s, [dims]), [dims])
                        if s is None:
                            continue
                        s = replace(s, col_groups=g)
                        rep = compile_ptx(emit(ir, s).ptx)
                        if not rejection_reason(rep, s.threads_per_block):
                            out.append(s)
    return out


def emit_to(out: Path) -> None:
    su.candidate_schedules = cands
    import bench.probe_tail as pt

    pt.CASES[:] = [(op, 16384, 4999) for op in ("layernorm", "rmsnorm", "add_rmsnorm")]
    pt.emit_to(out)


if __name__ == "__main__":
    rk.COL_WORDS = sys.argv[2]
    emit_to(Path(sys.argv[1]))
