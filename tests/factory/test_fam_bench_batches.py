"""lab/memfamilies/bench.py builds worker batches (format 1) that the GPU worker's own parser
accepts: every case lowers to its family, every seed emits and compiles, params and launch
(clusters included) are well formed. Run here so a GPU session spends no time on a bad batch."""

from __future__ import annotations

import pytest

from lab.memfamilies import bench


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_every_bench_case_builds_a_batch_the_worker_parses(case):
    from factory.compile import compile_ptx
    from gpuworker.batch import parse_batch

    batch, fam, labels = bench.build_batch(bench.CASES[case], seeds=3)
    assert fam in ("colreduce", "segreduce", "allreduce", "scan", "argreduce", "pool", "segnorm")
    b = parse_batch(batch)
    assert len(b.candidates) == len(labels) >= 1
    assert b.family == fam and set(b.baselines) >= {"torch_eager", "torch_compile"}
    for c in b.candidates:
        r = compile_ptx(c.ptx, "sm_90")
        assert r.ok, r.log[:1000]


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_every_bench_case_reads_at_least_256_mib(case):
    import math

    from factory.spec import load_manifest
    from factory.spec.expr import DTYPE_BYTES

    w = load_manifest(bench.CASES[case])
    dims = dict(w.shapes[0])
    read = sum(
        math.prod(dims[d] if isinstance(d, str) else d for d in t.shape) * DTYPE_BYTES[t.dtype]
        for t in w.inputs
    )
    assert read >= 256 * 2**20, read
