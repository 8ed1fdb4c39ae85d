"""The helper processes that draw inputs and compute float64 references: they start with BLAS at
one thread and their share of the cores as reference threads, the judging process's environment
is left as it was, and their references are the ones computed inline."""

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context, shared_memory
from unittest import mock

import numpy as np
import pytest

import factory.spec as spec
from gpuworker import runner
from gpuworker.batch import parse_batch

ATTENTION = """
name = "attn_helpers"
target = "sm_90"
[inputs.q]
shape = ["B", "H", "S", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.k]
shape = ["B", "H", "S", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[inputs.v]
shape = ["B", "H", "S", 16]
dtype = "bf16"
range = [-1.0, 1.0]
[outputs.o]
expr = "attention(q, k, v, score='30 * tanh(s / 30)', mask='j <= i')"
dtype = "bf16"
shape = ["B", "H", "S", 16]
[[shapes]]
B = 1
H = 3
S = 300
"""

NAMES = (*runner.BLAS_THREAD_VARS, runner.REFERENCE_THREADS_VAR)


def test_helpers_start_with_one_blas_thread_and_their_reference_threads(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")  # the judging process's own setting
    ctx = get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        with runner.helper_environment(3):
            inside = {name: os.environ.get(name) for name in NAMES}
            futures = {name: pool.submit(os.getenv, name) for name in NAMES}
        seen = {name: f.result() for name, f in futures.items()}
    want = dict.fromkeys(runner.BLAS_THREAD_VARS, "1") | {runner.REFERENCE_THREADS_VAR: "3"}
    assert seen == want and inside == want
    after = {name: os.environ.get(name) for name in NAMES}
    assert after == dict.fromkeys(NAMES) | {"OPENBLAS_NUM_THREADS": "7"}


def test_the_environment_is_put_back_when_the_block_raises(monkeypatch):
    monkeypatch.setenv(runner.REFERENCE_THREADS_VAR, "5")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with pytest.raises(RuntimeError), runner.helper_environment(2):
        raise RuntimeError("a helper could not start")
    assert os.environ[runner.REFERENCE_THREADS_VAR] == "5"
    assert "MKL_NUM_THREADS" not in os.environ


@pytest.mark.parametrize(
    "cores, workers, heavy, want",
    [(16, 6, 4, 4), (16, 7, 5, 3), (16, 8, 8, 2), (16, 6, 0, 16), (2, 6, 4, 1), (3, 1, 1, 3)],
)
def test_the_cores_are_shared_by_the_helpers_of_the_benchmarked_sets(cores, workers, heavy, want):
    with mock.patch.object(runner, "_cores", return_value=cores):
        assert runner.helper_threads(workers, heavy) == want


def read_ref(loc, shape):
    if "file" in loc:
        return np.fromfile(loc["file"], dtype=np.float64).reshape(shape)
    shm = shared_memory.SharedMemory(name=loc["shm"])
    try:
        return np.ndarray(shape, dtype=np.float64, buffer=shm.buf).copy()
    finally:
        shm.close()


def prepared_refs(batch, w, cpus):
    shared = runner._SharedArrays()
    try:
        with mock.patch.object(runner.os, "cpu_count", return_value=cpus):
            shapes, _, _ = runner._prepare_data(w, batch, 77, 1024, shared, None)
        return [
            [read_ref(loc, s["outputs"]["o"]["shape"]) for loc in s["outputs"]["o"]["ref_shm"]]
            for s in shapes
        ]
    finally:
        shared.close()


def test_references_from_helper_processes_match_the_inline_ones_and_a_fresh_evaluation():
    batch = parse_batch(
        {
            "format": 1,
            "batch_id": "helpers",
            "family": "attention",
            "manifest": ATTENTION,
            "shapes": [{"B": 1, "H": 3, "S": 300}],
            "heldout_shapes": [{"B": 1, "H": 3, "S": 77}],
            "candidates": [],
        }
    )
    w = spec.load_manifest(batch.manifest)
    inline = prepared_refs(batch, w, cpus=2)  # one worker: computed in this process
    helpers = prepared_refs(batch, w, cpus=5)  # three helper processes, BLAS at one thread
    assert [len(sets) for sets in helpers] == [len(sets) for sets in inline] == [2, 1]
    for ours, theirs in zip(helpers, inline, strict=True):
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # and the first set is the workload's reference of the inputs its seed draws
    dims = {"B": 1, "H": 3, "S": 300}
    want = spec.reference(w, spec.random_inputs(w, dims, 77), dims)["o"]
    np.testing.assert_allclose(helpers[0][0], want, rtol=1e-12, atol=1e-12)
