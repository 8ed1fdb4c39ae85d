"""The generator's starting layouts for a shape: a handful of schedules worth timing first,
best guess first, each compiled and screened on the CPU (no spills, no stack, registers x threads
within the register file). They are what the benchmark suite times as "ours", and what a job's
first generation starts from when no similar past job left evidence.

Every rule here comes from a sweep on the GPU; bench/results/ROW-FAMILY-NOTES.md (Seeds, and the
fields named beside each rule) says which, with its numbers and folders.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from factory.families.row.schedules import (
    MIN_THREADS_PER_ROW,
    Schedule,
    default_rows_per_block,
    default_schedule,
    fewest_chunks,
    fit_tail,
    has_col_inputs,
    is_valid,
    shifted_twin,
    split_twin,
)

CANDIDATES_PER_SHAPE = 6


@functools.lru_cache(maxsize=256)
def _compiled(ptx: str):
    """compile_ptx, once per PTX text while it stays among the last 256 (a screen compiles each
    layout, then its capped variants; an agent worker lives for many jobs, so bounded)."""
    from factory.compile import compile_ptx

    return compile_ptx(ptx)


def _ptx_of(ir):
    """emit(ir, s).ptx, each schedule emitted once per screen (it asks about a layout up to three
    times: compiled ahead, its register count, whether it passes)."""
    from factory.emit import emit

    memo: dict[Schedule, str] = {}

    def ptx(s: Schedule) -> str:
        if s not in memo:
            memo[s] = emit(ir, s).ptx
        return memo[s]

    return ptx


def _compile_ahead(ptx_of, schedules) -> None:
    """Compile the layouts the screen will ask about next, side by side (nvJitLink releases the
    GIL while it links), so that its one-at-a-time decisions find them in `_compiled`; the
    emission itself stays serial."""
    ptxs = [ptx_of(s) for s in dict.fromkeys(schedules)]
    if len(ptxs) < 2:
        return
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(ptxs))) as pool:
        list(pool.map(_compiled, ptxs))


def candidate_schedules(ir, dims, limit: int = CANDIDATES_PER_SHAPE) -> list[Schedule]:
    """A handful of layouts worth timing at `dims`, best guess first, screened on the CPU
    (compiled: no spills, no stack, registers x threads within the register file): `limit`
    layouts, each with its shifted twin where rows are misaligned (a twin is not counted)."""
    from factory.compile import rejection_reason

    ptx_of = _ptx_of(ir)
    base = default_schedule(ir, dims)
    n = dims[ir.row_dim]
    v = base.vec_elems
    out = []
    if base.mode == "cached":
        # The row in registers at the default width, at twice the threads (half the chunks) and
        # at half; each also with registers capped for the most resident threads that compile
        # without local memory; for a softmax-like row, the online max/sum too. (Every suite
        # winner is among these; prefetching persistent grids are left to plans.)
        t0 = base.threads_per_row
        shapes = [(t0, base.chunks)]
        if base.flat:  # tiles, whatever N is: the layouts that win at the suite's 4096 columns
            shapes = [(128, 4), (256, 2), (t0, base.chunks)]
        else:
            # A row the default's chunks do not fill: first the layout that wastes the fewest
            # elements, e.g. 128 threads of 5 chunks for 5000, 64 of 5 for 2560 (the fastest at
            # every odd width swept).
            tight = sorted(
                (t * v * fewest_chunks(n, t, v) - n, t, fewest_chunks(n, t, v))
                for t in (32, 64, 128, 256, 512)
                if fewest_chunks(n, t, v) <= 8
            )
            if tight and tight[0][0] < t0 * v * base.chunks - n:
                shapes.insert(0, tight[0][1:])
        # twice and half the threads, each with the fewest chunks that cover the row
        for t in (t0 * 2, t0 // 2):
            c = fewest_chunks(n, t, v) if t else 0
            if base.flat:
                c = base.chunks * t0 // t if t else 0
            shapes += [(t, c)] if 1 <= c <= (16 if base.flat else 8) else []
        # (rows under a warp: fewer threads take a row, with blocks of 128 threads)
        low = MIN_THREADS_PER_ROW if t0 < 32 else 32
        shapes = [(t, c) for t, c in shapes if low <= t <= 1024 and (t * v * c >= n or base.flat)]
        firsts = [
            fit_tail(
                ir,
                replace(
                    base, threads_per_row=t, chunks=c, rows_per_block=default_rows_per_block(t)
                ),
                [dims],
            )
            for t, c in shapes
        ]
        split0 = split_twin(ir, firsts[0], [dims]) if firsts else None
        _compile_ahead(ptx_of, firsts + ([split0] if split0 is not None else []))
        for (t, c), s0 in zip(shapes, firsts, strict=True):
            out.append(s0)  # its tail fitted before its register cap is found
            if t == 32:  # a warp's row alone in its block too (at rows of 768 and 1000 the
                out.append(replace(s0, rows_per_block=1))  # faster than four to a block)
            if t <= 32 and c <= 2:
                # Two rows a row group at once where a thread holds at most two chunks of each
                # (more would double a large register count): 16 threads a row in blocks of
                # 128, a warp a row in blocks of two warps (rows_per_thread).
                r = s0.rows_per_block if t < 32 else 2
                out.append(replace(s0, rows_per_thread=2, rows_per_block=r))
            elif t < 32:  # blocks of 256 threads beside those of 128
                out.append(replace(s0, rows_per_block=256 // t))
            occ = _occupancy_variant(ptx_of, s0)
            if occ is not None:
                out.append(occ)
            split = split0 if (t, c) == shapes[0] else None
            if split is not None:
                # The first layout's code split by path, capped where that compiles clean
                # (split_paths).
                out.append(_occupancy_variant(ptx_of, split) or split)
        if out and has_col_inputs(ir) and not base.flat:
            # A norm's weight loaded with the row, not after the reduction: one memory latency
            # less per row, which is most of the time of a few rows (a decode batch).
            out.insert(min(2, len(out)), replace(out[0], early_cols=True))
        if ir.online and any(o.role == "row" for o in ir.outputs):
            on = replace(base, online=True)
            out += [on] + [x for x in [_occupancy_variant(ptx_of, on)] if x is not None]
    online = [
        replace(base, mode="stream", online=True, threads_per_row=t, chunks=c, rows_per_block=1)
        for t, c in ((128, 4), (256, 4), (512, 2), (1024, 2))
    ]
    if ir.online and not any(o.role == "row" for o in ir.outputs):
        # A per-row result from max/sum-of-exp (cross-entropy): one streaming pass reads the row
        # once either way, and keeps few registers, so more rows are in flight per SM.
        out = online + out
    elif ir.online:
        out += online
    if base.mode != "cached":
        out = [base] + out
    out = [fit_tail(ir, s, [dims]) for s in out]
    capped = {replace(s, min_threads_per_sm=0) for s in out if s.min_threads_per_sm}
    twins = [shifted_twin(ir, s, [dims]) for s in out]
    _compile_ahead(ptx_of, [t for t in twins if t is not None])
    fitted = []
    for s, twin in zip(out, twins, strict=True):
        fitted.append(s)
        if twin is None:
            continue
        grouped = _one_chunk_at_a_time(ir, twin, dims)
        if grouped is not None:
            # A shifted row loads its columns in the pass that uses them, all chunks at once
            # unless grouped: one chunk at a time takes LayerNorm 16384x4999 at 128 threads of
            # 5 chunks from 128 registers to 80 (col_groups).
            fitted.append(grouped)
        fitted.append(twin)
        if not s.min_threads_per_sm and s not in capped:
            # The layout's own cap spilled, but its shifted twin (other code, other registers)
            # may fit one: LayerNorm 16384x4999 at 128 threads of 5 chunks spills 84 bytes
            # capped for 768 threads strided and none shifted.
            occ = _occupancy_variant(ptx_of, twin)
            if occ is not None:
                fitted.append(occ)
    _compile_ahead(ptx_of, [s for s in fitted if is_valid(ir, s, dims)[0]][: 3 * limit])
    picked, regs_of = [], {}
    layouts = set()  # a shifted twin is its layout again: `limit` counts layouts
    for s in fitted:
        if s in picked or not is_valid(ir, s, dims)[0]:
            continue
        rep = _compiled(ptx_of(s))
        if rejection_reason(rep, s.threads_per_block):
            continue
        uncapped = replace(s, min_threads_per_sm=0)
        if s.min_threads_per_sm and regs_of.get(uncapped) == rep.registers:
            continue  # the cap changed nothing: the same machine code as the uncapped one
        regs_of[s] = rep.registers
        picked.append(s)
        layouts.add(replace(s, tail="elements", col_groups=1))
        if len(layouts) >= limit:
            break
    return picked


def _one_chunk_at_a_time(ir, s: Schedule, dims) -> Schedule | None:
    """`s` with its per-column vectors loaded (and its outputs written) one chunk at a time,
    where it holds the row in registers and loads them in their pass; else None."""
    if s.mode != "cached" or s.chunks < 2 or s.col_groups != 1 or s.early_cols:
        return None
    g = replace(s, col_groups=s.chunks)
    return g if has_col_inputs(ir) and is_valid(ir, g, dims)[0] else None


def _occupancy_variant(ptx_of, s: Schedule, below: int = 2304) -> Schedule | None:
    """`s` with the registers capped for the most resident threads per SM (fewer than `below`)
    that compile without local memory, when that is more than `s` gets uncapped (more rows in
    flight per SM)."""
    from factory.compile import rejection_reason

    t = s.threads_per_block
    regs = max(_compiled(ptx_of(s)).registers, 1)
    resident = min(2048 // t, 65536 // (-(-regs // 8) * 8 * t)) * t
    caps = [
        replace(s, min_threads_per_sm=threads)
        for threads in range(2048, resident, -256)
        if threads % t == 0 and threads < below
    ]
    _compile_ahead(ptx_of, caps)
    for cand in caps:
        rep = _compiled(ptx_of(cand))
        if rep.ok and not rejection_reason(rep, t):
            return cand
    return None


def compile_reports(ptxs: list[str]) -> list:
    """The compile report (factory.compile.CompileReport) of each PTX text, compiled side by side;
    each text once while it stays among the last 256."""
    _compile_ahead(lambda ptx: ptx, ptxs)
    return [_compiled(ptx) for ptx in ptxs]


def recapped(ir, s: Schedule) -> Schedule | None:
    """A layout turned away for its registers, under another register cap: where its own cap
    spills, the highest cap that compiles clean (more rows in flight than uncapped), else
    uncapped where that compiles clean; where it has no cap and holds too few warps per SM (the
    reviewer's register pressure), the highest cap that compiles clean and keeps more threads
    resident. None otherwise. The tuner's mutants inherit their parent's cap, under which their
    own code may spill where their parent's compiled clean."""
    from factory.compile import rejection_reason

    ptx_of = _ptx_of(ir)
    base = replace(s, min_threads_per_sm=0)
    if rejection_reason(_compiled(ptx_of(base)), base.threads_per_block):
        return None
    # (a cap that spilled leaves fewer registers than any below it: only those are tried)
    occ = _occupancy_variant(ptx_of, base, below=s.min_threads_per_sm or 2304)
    return occ if occ is not None or not s.min_threads_per_sm else base
