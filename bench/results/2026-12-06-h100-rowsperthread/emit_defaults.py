"""The default for rows of 129-256 bf16 before (a warp a row) and after 9021f09 (8 threads of
up to four 16-byte chunks), with the seeds a job started from there at b432e4c and 16-thread
neighbours under register caps.

    PYTHONPATH=. python3 emit_defaults.py .tailptx/new new
    git worktree add /tmp/wtH 092e40f && cd /tmp/wtH && \
        PROBE_TAIL=CHECKOUT/bench/probe_tail.py PYTHONPATH=/tmp/wtH python3 \
        CHECKOUT/bench/results/2026-12-06-h100-rowsperthread/emit_defaults.py \
        CHECKOUT/.tailptx/old old

(the old set: the factory of 092e40f, this checkout's write_set, loaded from PROBE_TAIL by path)
"""

import importlib.util
import os
import sys
from dataclasses import replace
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "probe_tail", os.environ.get("PROBE_TAIL", "bench/probe_tail.py")
)
_pt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pt)
write_set = _pt.write_set

CASES = [
    (op, 131072, n)
    for n in (256, 200, 160)
    for op in ("layernorm", "rmsnorm", "softmax", "add_rmsnorm")
]


def old(ir, base, dims):
    return [base]


def new(ir, base, dims):
    from factory.seeds import candidate_schedules

    out = [base, replace(base, min_threads_per_sm=1280)] + candidate_schedules(ir, dims)
    for r, cap in ((8, 0), (4, 1280), (8, 1280), (8, 1536), (16, 1280)):
        out.append(
            replace(base, threads_per_row=16, chunks=2, rows_per_block=r, min_threads_per_sm=cap)
        )
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    write_set(Path(sys.argv[1]), CASES, {"old": old, "new": new}[sys.argv[2]], valid_only=False)
