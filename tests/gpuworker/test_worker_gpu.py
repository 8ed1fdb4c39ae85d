"""On the GPU: the worker's verdicts on honest and broken kernels, and the command line.
Skipped without a GPU (the shared conftest skips everything marked `gpu`)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpuworker_redteam import build_batch  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def results():
    from gpuworker import run_batch

    batch, _ = build_batch(
        timeout_s=3.0,
        budget_s=0.1,
        only=[
            "honest_block",
            "partial_rows",
            "oob_write",
            "input_mutation",
            "illegal_address",
            "infinite_loop",
            "honest_warp",
        ],
    )
    return run_batch(batch)


def by_id(results):
    return {c["id"]: c for c in results["candidates"]}


def test_honest_kernels_pass_with_timing_at_every_benchmarked_shape(results):
    for cid in ("honest_block", "honest_warp"):
        c = by_id(results)[cid]
        assert c["status"] == "passed", c["reason"]
        # 1 benchmarked shape; the batch's 3 held-out shapes and the manifest's own
        assert sum(not v["heldout"] for v in c["verification"]) == 1
        assert sum(v["heldout"] for v in c["verification"]) >= 3
        assert all(v["passed"] and v["bitwise_equal"] for v in c["verification"])
        (t,) = c["timing"]
        assert t["median_us"] > 0 and len(t["samples_us"]) >= 3
        assert t["ci_low_us"] <= t["median_us"] <= t["ci_high_us"]
        assert 0 < t["tbps"] < 10
        assert t["timed_runs_checked"] >= 3


def test_cheats_are_caught_with_the_reason(results):
    c = by_id(results)
    assert c["partial_rows"]["status"] == "failed" and "NaN/inf" in c["partial_rows"]["reason"]
    assert "out-of-bounds write" in c["oob_write"]["reason"]
    assert "input mutation" in c["input_mutation"]["reason"]


def test_a_fault_and_a_hang_are_recorded_and_the_batch_completes(results):
    c = by_id(results)
    assert c["illegal_address"]["status"] == "crashed"
    assert "CUDA_ERROR" in c["illegal_address"]["reason"]
    assert c["infinite_loop"]["status"] == "timeout"
    assert c["infinite_loop"]["verify_wall_s"] < 3.0 + 2.0  # no more than its limit, plus polling
    assert results["env"]["worker_restarts"] >= 2
    assert c["honest_warp"]["status"] == "passed"  # after the restarts


def test_the_results_file_has_the_contract_shape(results):
    assert results["format"] == 1
    assert results["env"]["gpu"] and results["env"]["sm"].startswith("sm_")
    assert 1.0 < results["copy_ceiling_tbps"] < 10.0
    # the default flush reads, and the ceiling is measured under the entrants' flush
    assert results["timing_protocol"] == {"l2_flush": "read", "timed_outputs": "shared"}
    assert results["copy_ceiling"]["l2_flush"] == "read"
    # judge_mix moved the one benchmarked shape's bytes: softmax reads x and writes y, alike
    [m] = results["byte_mover"]
    assert m["bytes_read"] == m["bytes_written"] > 0 and len(m["samples_us"]) == 10
    assert 0 < m["tbps"] < 10
    json.dumps(results)  # plain JSON all the way down


def test_the_command_line_runs_a_batch_file(tmp_path):
    batch, _ = build_batch(timeout_s=3.0, budget_s=0.05, only=["honest_block"])
    batch["options"]["l2_flush"] = "write"  # the other flush, end to end
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(batch))
    out = tmp_path / "results.json"
    p = subprocess.run(
        [sys.executable, "-m", "gpuworker", "run", str(path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["candidates"][0]["status"] == "passed"
    assert res["timing_protocol"] == {"l2_flush": "write", "timed_outputs": "shared"}
    assert res["copy_ceiling"]["l2_flush"] == "write"


def test_probe_names_the_gpu():
    p = subprocess.run(
        [sys.executable, "-m", "gpuworker", "probe"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 0
    assert json.loads(p.stdout)["gpu"]


@pytest.mark.parametrize("mode", ["shared", "guarded"])
def test_beside_a_torch_baseline_our_timed_runs_write_where_torch_allocates(mode):
    """With shared timed outputs (the default), our kernel's timed runs write into the blocks of
    torch's allocator that the baseline's outputs were just freed from, every such run still
    checked against the reference; with "guarded", into the worker's own buffers."""
    pytest.importorskip("torch")
    from gpuworker_catalogue_batch import catalogue_batch

    from gpuworker import run_batch

    shapes = [{"M": 2048, "N": 4096}]
    _, batch = catalogue_batch("rmsnorm", shapes, ["torch_eager"], 0.1, candidates=2)
    batch["options"]["timed_outputs"] = mode
    res = run_batch(batch)
    assert res["timing_protocol"]["timed_outputs"] == mode
    (base,) = res["baselines"]
    assert base["status"] == "passed", base["reason"]
    assert base["timing"][0]["timed_outputs"] == "torch allocator"
    for c in res["candidates"]:
        assert c["status"] == "passed", c["reason"]
        (t,) = c["timing"]
        assert t["timed_runs_checked"] >= 3 and t["median_us"] > 0
        if mode == "shared":
            assert t["timed_outputs"] == "torch allocator"
            assert t["same_outputs_as_baselines"] is True, t
        else:
            assert t["timed_outputs"] == "guarded buffer"
            assert t["same_outputs_as_baselines"] is None


def test_whole_program_setting_runs_a_ping_pong_attention_kernel_that_needs_setmaxnreg(
    monkeypatch,
):
    """PTXF_WHOLE_PROGRAM=1: a ping-pong soft-cap attention schedule that does not fit the
    launch register count (nvJitLink would spill it) is compiled by ptxas as a whole program,
    loaded, launched and verified against the float64 reference at every shape, through the
    worker's own path (run_batch)."""
    import uuid

    sys.path.insert(0, str(ROOT / "tests" / "factory"))
    from test_attention_helpers import workload

    from factory import families
    from factory.agents.types import launch_to_dict, param_to_dict
    from factory.families.attention import schedule as S
    from factory.families.attention.wholeprog import find_ptxas
    from gpuworker import run_batch

    if find_ptxas() is None:
        pytest.skip("no CUDA toolkit ptxas on this GPU host")
    monkeypatch.setenv("PTXF_WHOLE_PROGRAM", "1")
    w = workload("softcap", True, 128)
    fam, ir = families.family_for(w)
    shapes = [dict(d) for d in w.shapes]
    heldout = [dict(d) for d in w.heldout_shapes]
    s = next(
        s for s in fam.space(ir, shapes + heldout) if s.pingpong and not S.fits_relocatable(ir, s)
    )
    em = fam.emit(ir, s, "sm_90a")
    batch = {
        "format": 1,
        "batch_id": str(uuid.uuid4()),
        "family": families.name_for(w),
        "manifest": w.manifest,
        "baseline_source": None,
        "shapes": shapes,
        "heldout_shapes": heldout,
        "candidates": [
            {
                "id": s.label(),
                "ptx": em.ptx,
                "entry": em.entry,
                "params": [param_to_dict(p) for p in em.params],
                "launch": launch_to_dict(em.launch),
            }
        ],
        "baselines": [],
        "options": {
            "time_budget_s_per_candidate": 0.2,
            "timeout_s_per_candidate": 60,
            "seed": None,
        },
    }
    res = run_batch(batch)
    (c,) = res["candidates"]
    assert c["compile"]["compiler"] == "ptxas-whole", c["compile"]
    assert c["compile"]["spill_store_bytes"] == 0 and c["compile"]["stack_bytes"] == 0
    assert "ignored" not in c["compile"]["log"], c["compile"]["log"][:2000]
    assert c["status"] == "passed", c["reason"]
    assert c["verification"] and all(v["passed"] for v in c["verification"])
    assert any(v["heldout"] for v in c["verification"])
    (t,) = c["timing"]
    assert t["median_us"] > 0 and t["timed_runs_checked"] >= 3
