"""bench/suite.py's plan-free candidates, on the CPU: for every suite operator at its first suite
shape, a few valid layouts that compile without local memory, the default first, in a batch the
GPU worker accepts."""

import pytest

from bench import suite
from factory.compile import rejection_reason
from factory.emit import emit
from factory.schedules import default_schedule, is_valid
from gpuworker.batch import parse_batch

CATALOGUE = suite._catalogue()


@pytest.mark.parametrize("name", suite.OPS)
def test_the_suite_candidates_are_valid_and_screened(name):
    w, manifest, ir = CATALOGUE[name]
    dims = dict(w.shapes[0])
    picked = suite.candidate_schedules(ir, dims)
    assert 2 <= len(picked) <= suite.CANDIDATES_PER_SHAPE
    assert picked[0] == default_schedule(ir, dims)
    assert len(set(picked)) == len(picked)
    for s in picked:
        assert is_valid(ir, s, dims)[0], s.tag()
        rep = suite.compile_cached(emit(ir, s).ptx)
        assert rep.ok and rejection_reason(rep, s.threads_per_block) == "", s.tag()
    batch, schedules = suite.build_batch(
        name, manifest, ir, [dims], ["torch_eager"], 0.2, w.heldout_shapes
    )
    parsed = parse_batch(batch)
    assert len(parsed.candidates) == len(picked) == len(schedules)
    assert parsed.heldout_shapes[-1][ir.row_dim] == 40000  # the streaming fallback is judged
