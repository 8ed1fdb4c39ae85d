"""The timer check (lab/probes/timer_check.py) times one of our generated kernels per suite operator
next to the baselines: the batch it gives the worker, and (on a GPU) the launch it hands to
triton's do_bench."""

import sys
from pathlib import Path

import pytest

from factory.compile import compile_ptx
from factory.spec import catalogue_manifest, eval_dim_expr, load_catalogue
from gpuworker.batch import parse_batch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from lab.probes import timer_check  # noqa: E402


def suite_ops():
    cat = load_catalogue()
    return [(n, cat[n]) for n in timer_check.SUITE_OPS if n in cat]


def test_every_suite_operator_is_in_the_catalogue():
    assert [n for n, _ in suite_ops()] == list(timer_check.SUITE_OPS)


@pytest.mark.parametrize("name", timer_check.SUITE_OPS)
def test_the_timer_batch_holds_one_of_our_generated_kernels_and_parses(name):
    w = load_catalogue()[name]
    dims = dict(w.shapes[0])
    batch = timer_check.timer_batch(name, w, dims, catalogue_manifest(name))
    b = parse_batch(batch)
    ours = [c for c in b.candidates if c.id.startswith("ours:")]
    assert len(ours) == 1
    (c,) = ours
    assert c.entry.startswith(name)  # the emitter names its entries after the operator
    assert f".entry {c.entry}(" in c.ptx
    # the binding names only the workload's tensors and dims
    tensors = {t.name for t in w.inputs} | {o.name for o in w.outputs}
    assert {p.name for p in c.params if p.kind == "tensor"} == tensors
    assert {p.name for p in c.params if p.kind == "dim"} <= set(dims)
    # the launch evaluates at the timed shape
    grid = [int(eval_dim_expr(g, dims)) for g in c.launch.grid]
    assert all(g > 0 for g in grid) and grid[0] >= 1
    assert compile_ptx(c.ptx, "sm_90").ok
    # next to the baselines it is compared with, under do_bench's flush
    assert b.baselines == ("torch_eager", "triton")
    assert b.options.l2_flush == "write"
    # the raw dict's candidate is what the timer process launches itself: same PTX and entry
    (raw,) = [r for r in batch["candidates"] if r["id"] == c.id]
    assert raw["ptx"] == c.ptx and raw["entry"] == c.entry


def test_the_report_names_our_kernels_rows_and_keeps_their_notes(tmp_path):
    row = {"op": "rmsnorm", "dims": {"M": 4, "N": 8}, "what": "ours:ct128r1v8c4_nlno",
           "ours_us": 20.0, "do_bench_us": 19.0, "ratio": 20.0 / 19.0, "ours_p20_us": 19.8,
           "ours_p80_us": 20.2, "note": "y differs from torch eager (rel 1.0e-01)"}  # fmt: skip
    timer_check._write_timer(tmp_path, [row], [])
    md = (tmp_path / "timer.md").read_text()
    assert (
        "| rmsnorm | 4x8 | ours:ct128r1v8c4_nlno | 20.0 (19.8-20.2) | 19.0 | 1.053 | **no** |"
        " y differs from torch eager" in md
    )


@pytest.mark.gpu
def test_on_the_gpu_our_kernel_launches_on_the_stream_do_bench_times():
    import torch

    w = load_catalogue()["softmax"]
    dims = {"M": 256, "N": 4096}
    cand = timer_check.ours_candidate(w, dims)
    inputs = timer_check._torch_inputs(w, dims, 5)
    stream, ext = timer_check._shared_stream()
    fn, outputs = timer_check._candidate_fn(cand, w, dims, inputs, stream)
    assert timer_check._eager_check(w, fn, inputs, outputs, ext) == ""
    with torch.cuda.stream(ext):
        assert torch.cuda.current_stream().cuda_stream == int(stream.handle)
        us = timer_check.do_bench_us(fn)
    assert 0 < us < 10_000


# -- the timer check compares with do_bench under do_bench's own (writing) flush ---------------
def test_the_timer_check_runs_the_worker_with_a_write_flush_for_every_suite_operator():
    from factory.spec import catalogue_manifest, load_catalogue
    from lab.probes import timer_check

    cat = load_catalogue()
    names = [n for n in timer_check.SUITE_OPS if n in cat]
    assert names
    for name in names:
        dims = dict(cat[name].shapes[0])
        batch = timer_check.timer_batch(name, cat[name], dims, catalogue_manifest(name))
        assert parse_batch(batch).options.l2_flush == "write"


def test_the_timer_report_says_which_flush_the_worker_used(tmp_path):
    from lab.probes import timer_check

    row = {"op": "softmax", "dims": {"M": 4, "N": 8}, "what": "triton", "ours_us": 10.0,
           "do_bench_us": 10.2, "ratio": 10.0 / 10.2, "ours_p20_us": 9.9, "ours_p80_us": 10.1,
           "note": ""}  # fmt: skip
    timer_check._write_timer(tmp_path, [row], [])
    md = (tmp_path / "timer.md").read_text()
    assert 'l2_flush = "write"' in md and "cache.zero_()" in md
    assert "| softmax | 4x8 | triton | 10.0 (9.9-10.1) | 10.2 | 0.980 | yes |" in md
