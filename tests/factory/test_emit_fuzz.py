"""Random valid schedules of random catalogue operators at awkward row lengths, run through the
CPU PTX interpreter against the float64 reference. The listed cases in test_emit_sim.py cover
each option on its own; this covers options together. A longer run of the same draw (4 of its
first 180 cases failed: masked softmax with online max/sum) found the rounding bug fixed in
5fa0560, whose own regression cases are in test_emit_sim.py; after the fix 4374 draws passed
(2026-12-03). Here a fixed sample of 48, so that a failure reproduces, 24 more with
split_paths (1000 such draws passed on 2026-12-04), and 16 rows held in registers at lengths
their layout does not suit (longer: the long-row path; under half: idle chunks), as a job of
several row lengths runs them (400 such draws passed on 2026-12-05), and 16 with several rows
a thread."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from factory import families
from factory.families.row.ir import lower
from factory.families.row.schedules import (
    COL_HINTS,
    LOAD_HINTS,
    STORE_HINTS,
    TAILS,
    Schedule,
    _modes_for,
    fast_math_allowed,
    has_col_inputs,
    has_early_outputs,
    is_valid,
    packed_pairs,
)
from factory.spec import load_catalogue
from tests.factory.test_emit_sim import check


def _row_catalogue():
    """The catalogue operators the row IR lowers (the row family's, and the flat and split-row
    families' that refine its shape), in the catalogue's order; the draws below pick among them."""
    return {
        name: w
        for name, w in load_catalogue().items()
        if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
    }


LENGTHS = (1, 7, 33, 64, 100, 129, 256, 264, 300, 512, 513, 700)


def random_case(rng: random.Random, capacity: bool = True):
    """(name, schedule, dims), or None when the draw is not a valid schedule there (with
    `capacity` False, valid in all but the register capacity)."""
    cat = _row_catalogue()
    name = rng.choice(sorted(cat))
    ir = lower(cat[name])
    mode, online = rng.choice(_modes_for(ir))
    kw = dict(
        threads_per_row=rng.choice([32, 64]),
        rows_per_block=rng.choice([1, 2]),
        vec_elems=rng.choice(sorted({16 // ir.min_elem_bytes(), 32 // ir.min_elem_bytes()})),
        chunks=rng.choice([1, 2, 4]),
        mode=mode,
        online=online,
        load_hint=rng.choice(LOAD_HINTS),
        store_hint=rng.choice(STORE_HINTS),
        fast_math=rng.choice([True, False]) if fast_math_allowed(ir) else False,
        keep_intermediates=rng.choice([True, False]) if ir.online else True,
        late_stores=rng.choice([False, True]) if has_early_outputs(ir) else False,
        moments=rng.choice([False, True]) if ir.moments else False,
        early_cols=rng.choice([False, True]) if has_col_inputs(ir) else False,
        col_groups=rng.choice([1, 2, 4]) if has_col_inputs(ir) else 1,
        col_hint=rng.choice(COL_HINTS) if has_col_inputs(ir) else "nc",
        min_threads_per_sm=rng.choice([0, 0, 1024]),
        acc_split=rng.choice([1, 1, 2, 4]),
        early_gather=rng.choice([False, True]) if ir.gathers else False,
        packed_max=rng.choice([False, True]) if online and packed_pairs(ir) else False,
        tail=rng.choice(TAILS),
    )
    if rng.random() < 0.2:
        kw |= dict(persistent_blocks_per_sm=1, prefetch_rows=rng.choice([False, True]))
    s = Schedule(**kw)
    dims = {ir.row_dim: rng.choice(LENGTHS), **{d: rng.choice([1, 2, 3]) for d in ir.batch_dims}}
    return (name, s, dims) if is_valid(ir, s, dims, capacity=capacity)[0] else None


def _sample(n: int, seed: int = 20261203):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        case = random_case(rng)
        if case is not None:
            out.append((*case, rng.randrange(1 << 16)))
    return out


def _redrawn(n: int, seed: int, change):
    """Draws as above, each changed by change(rng, schedule), kept where the change is valid."""
    rng = random.Random(seed)
    cat = _row_catalogue()
    out = []
    while len(out) < n:
        case = random_case(rng)
        if case is None:
            continue
        name, s, dims = case
        s = change(rng, s)
        if is_valid(lower(cat[name]), s, dims)[0]:
            out.append((name, s, dims, rng.randrange(1 << 16)))
    return out


def _sample_split(n: int, seed: int = 20261204):
    """Draws whose rows are held in registers, each with one copy of the row's code per path
    (split_paths), where that is valid."""
    return _redrawn(n, seed, lambda rng, s: replace(s, split_paths=True))


def _sample_beyond(n: int, seed: int = 20261205):
    """Draws of rows held in registers at a row length their layout does not suit (longer than
    it holds: the long-row path; or under half of it: idle chunks), valid there in all else: what
    a job whose shapes have different row lengths times at its other shapes (fits_job)."""
    rng = random.Random(seed)
    cat = _row_catalogue()
    out = []
    while len(out) < n:
        case = random_case(rng, capacity=False)
        if case is None:
            continue
        name, s, dims = case
        if s.mode == "cached" and not s.flat and not is_valid(lower(cat[name]), s, dims)[0]:
            out.append((name, s, dims, rng.randrange(1 << 16)))
    return out


def _sample_rows(n: int, seed: int = 20261206):
    """Draws with several rows a thread (2 or 4, one row group a block), joined or one copy of
    the row's code per path, where that is valid: 1-3 rows, so most of a block's rows are past
    the end (620 such draws passed on 2026-12-06)."""

    def change(rng, s):
        return replace(
            s,
            rows_per_thread=rng.choice([2, 4]),
            persistent_blocks_per_sm=0,
            prefetch_rows=False,
            split_paths=rng.choice([False, True]),
        )

    return _redrawn(n, seed, change)


@pytest.mark.parametrize(
    ("name", "schedule", "dims", "seed"),
    _sample(48) + _sample_split(24) + _sample_beyond(16) + _sample_rows(16),
    ids=lambda v: v.tag() if isinstance(v, Schedule) else None,
)
def test_a_random_valid_schedule_computes_the_reference(name, schedule, dims, seed):
    grid = 2 if schedule.persistent_blocks_per_sm else None
    check(name, schedule, dims, seed=seed, grid=grid)
