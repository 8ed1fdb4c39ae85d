"""A slice of the schedule space around the default layout, emitted into DIR (a probe_tail
--sets folder) for timing side by side:

    python3 -m lab.probes.emit_slice DIR --cases layernorm:1048576x100,rmsnorm:1048576x100
        [--caps 0,2048] [--warp-rows 4,8] [--neighbours] [--controls]

Per case: every layout of the space that differs from the default only in threads per row, rows
per block, chunks, tail and a register cap among --caps (threads per SM; 0 uncapped), with the
default's split_paths, that compiles without spills; with --warp-rows, also a warp per row of
one chunk at those rows a block (the layout a job took at rows under a warp before a330e1e, as a
control, outside the space); with --neighbours, also every point of the space that differs from
the default in one field (hints, register caps, early columns, ...); with --controls, where the
default holds short rows in registers, also the default with the "vectors" tail (an element tail
in registers, as every short row had before the "stream" tail) and looping over rows in a
persistent grid of 2 or 4 blocks per SM, with and without the next row prefetched and the per-
column vectors held across rows (early_cols), uncapped. Writes DIR/manifest.json and DIR/cases.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory.families.row.schedules import default_schedule, is_valid, space  # noqa: E402
from lab.probes.probe_tail import parse_cases, write_set  # noqa: E402

FREE = ("threads_per_row", "rows_per_block", "chunks", "tail", "min_threads_per_sm")


def controls(base) -> list:
    """--controls: the layouts beside a short row's default that the space does not hold."""
    if base.mode != "cached" or base.threads_per_row >= 32:
        return []
    out = [replace(base, tail="vectors")] if base.tail == "stream" else []
    for k in (2, 4):
        for prefetch in (False, True):
            for early in (False, True):
                out.append(
                    replace(
                        base, persistent_blocks_per_sm=k, prefetch_rows=prefetch, early_cols=early
                    )
                )
    return out


def slice_of(
    ir, dims: dict[str, int], caps=(0, 2048), warp_rows=(), neighbours=False, control=False
) -> list:
    base = default_schedule(ir, dims)
    fixed = {k: v for k, v in asdict(base).items() if k not in FREE}
    sp = space(ir, [dims])
    picks = [
        s
        for s in sp
        if all(getattr(s, k) == v for k, v in fixed.items()) and s.min_threads_per_sm in caps
    ]
    if neighbours:  # the points of the space that differ from the default in one field
        b = asdict(base)
        picks += [s for s in sp if sum(v != b[k] for k, v in asdict(s).items()) == 1]
    warp = replace(base, threads_per_row=32, chunks=1)
    picks += [replace(warp, rows_per_block=r) for r in warp_rows]
    if control:
        picks += [s for s in controls(base) if is_valid(ir, s, dims)[0]]
    return list(dict.fromkeys(picks))


def main(out: Path, cases, caps=(0, 2048), warp_rows=(), neighbours=False, control=False):
    def picks(ir, base, dims):
        return slice_of(ir, dims, caps, warp_rows, neighbours, control)

    # (the warp-a-row controls of --warp-rows are outside the space: not only valid layouts)
    write_set(out, cases, picks, valid_only=False)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--cases", required=True, help="op:MxN,...")
    p.add_argument("--caps", default="0,2048", help="register caps (threads per SM; 0: none)")
    p.add_argument("--warp-rows", default="", help="also a warp per row at these rows a block")
    p.add_argument(
        "--neighbours", action="store_true", help="also the default's one-field neighbours"
    )
    p.add_argument("--controls", action="store_true", help="also the short-row controls")
    a = p.parse_args()
    ints = lambda t: tuple(int(x) for x in t.split(",") if x)  # noqa: E731
    main(a.out, parse_cases(a.cases), ints(a.caps), ints(a.warp_rows), a.neighbours, a.controls)
