"""The suite's starting candidates (factory.families.row.seeds.candidate_schedules) on the CPU:
rows no layout divides, rows a layout fills exactly, norms with their weight loaded beside the
row, and rows under a warp."""

from dataclasses import replace

import pytest

from factory import families
from factory.compile import compile_ptx, rejection_reason
from factory.emit import emit
from factory.families.row.ir import lower
from factory.families.row.schedules import default_schedule, is_valid
from factory.families.row.seeds import candidate_schedules
from factory.spec import catalogue_manifest, load_catalogue

# the operators the row IR lowers: the row family's and those of its refinements (flat, rowsplit)
CATALOGUE = {
    name: (w, catalogue_manifest(name), lower(w))
    for name, w in load_catalogue().items()
    if families.name_for(w, default="none") in ("row", "flat", "rowsplit")
}


@pytest.mark.parametrize("name", ["rmsnorm", "silu_mul"])
def test_a_row_no_layout_divides_gets_the_tightest_layout_and_the_whole_vector_tail(name):
    w, manifest, ir = CATALOGUE[name]
    ragged = candidate_schedules(ir, {"M": 16384, "N": 5000})
    # 128 threads of 5 chunks of 8 hold 5120 elements: the fewest wasted
    assert any((s.threads_per_row, s.chunks) == (128, 5) for s in ragged)
    assert ragged and all(s.tail == "vectors" for s in ragged)
    # a row the default divides gets neither: the same candidates as before the tail existed
    whole = candidate_schedules(ir, dict(w.shapes[0]))
    assert not any(s.tail != "elements" or s.chunks == 5 for s in whole)


@pytest.mark.parametrize(
    "name, n, layout",
    [
        ("layernorm", 2560, (64, 5)),  # 2560 = 64 x 5 x 8: no tail, where 128 x 3 wastes 512
        ("layernorm", 768, (32, 3)),  # a warp of 3 chunks: 768 exactly
        ("rmsnorm", 3072, (64, 6)),  # the default 128 x 3 fills it too
    ],
)
def test_a_layout_that_fills_the_row_exactly_is_a_candidate(name, n, layout):
    # (before: only a tightest layout that still wasted places was added, so rows that a
    # layout fills exactly ran a quarter of their chunks idle, through the tail path)
    _, _, ir = CATALOGUE[name]
    picked = candidate_schedules(ir, {"M": 8192, "N": n})
    exact = [s for s in picked if (s.threads_per_row, s.chunks) == layout]
    assert exact and all(s.tail == "elements" for s in exact)


@pytest.mark.parametrize("name", ["rmsnorm", "add_rmsnorm", "layernorm"])
def test_a_norm_is_also_tried_with_its_weight_loaded_beside_the_row(name):
    _, _, ir = CATALOGUE[name]
    picked = candidate_schedules(ir, {"M": 64, "N": 4096})
    early = [s for s in picked if s.early_cols]
    assert len(early) == 1 and picked.index(early[0]) <= 2
    assert replace(early[0], early_cols=False) == picked[0]
    # an operator without a per-column vector gets none
    _, _, sm = CATALOGUE["softmax"]
    assert not any(s.early_cols for s in candidate_schedules(sm, {"M": 64, "N": 4096}))


@pytest.mark.parametrize(
    ("name", "n", "widths"),
    [("softmax", 64, {8, 4}), ("rmsnorm", 128, {16, 8}), ("layernorm", 100, {16, 8})],
)
def test_rows_under_a_warp_get_starting_layouts_of_fewer_threads(name, n, widths):
    # (the screen kept none at rows of 64-128 before: every layout had a warp or more a row)
    w, manifest, ir = CATALOGUE[name]
    dims = {ir.batch_dims[0]: 262144, ir.row_dim: n}
    picked = candidate_schedules(ir, dims)
    assert len(picked) >= 4 and picked[0] == default_schedule(ir, dims)
    assert {s.threads_per_row for s in picked} == widths
    # blocks of 128 threads; beside each starting shape, blocks of 256 where a thread holds more
    # than two chunks, else two rows a thread (bench/results/2026-12-06-h100-rowsperthread)
    assert {s.threads_per_block for s in picked} <= {128, 256}
    for s in picked:
        if s.rows_per_thread > 1 or s.threads_per_block == 256:
            one = replace(s, rows_per_thread=1, rows_per_block=128 // s.threads_per_row)
            assert one in picked and (s.chunks <= 2) == (s.rows_per_thread == 2), s.tag()
    # rows of 100 bf16 (200 bytes) also in 8-byte chunks, which start each one aligned
    narrow = {(s.threads_per_row, s.chunks, s.tail) for s in picked if s.vec_elems == 4}
    assert narrow == ({(16, 2, "stream"), (8, 4, "stream")} if n == 100 else set())
    for s in picked:
        assert s.threads_per_row < 32 and is_valid(ir, s, dims)[0], s.tag()
        rep = compile_ptx(emit(ir, s).ptx)
        assert rep.ok and rejection_reason(rep, s.threads_per_block) == "", s.tag()
