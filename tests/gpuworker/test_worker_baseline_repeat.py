"""Repeatability is required of our candidates, not of baselines: two verification runs of a
candidate on the same inputs that differ fail it (a race or an uninitialised read); a baseline
whose two runs differ but each meet the tolerance (torch's cumsum at 8 rows of 8M fp32 on the
H100, bench/results/2026-12-07-h100-memfamilies) passes, is timed, and carries a
not_bitwise_repeatable flag with the bytes that differed.

The runner half drives a stand-in child (no CUDA) whose verification reports two runs that
differ for the entrants in RACY."""

import os

import gpuworker_standin_child as standin
import pytest

from gpuworker import runner
from gpuworker.judge import shape_verdict
from gpuworker.plausibility import repeatability_flags
from gpuworker.worker import ChildWorker

TOL = {"y": {"rel_norm": 1e-5, "atol": 1e-6, "rtol": 1e-5}}
RACY = ("candidate:racy", "baseline:torch_eager")
DIFF_BYTES = 7176973


def child_result(bitwise=0, rel=1e-7):
    run = {**standin.RUN, "rel_err": rel, "passed": rel <= 1e-5}
    return {
        "shape": 0,
        "outputs": {"y": {"runs": [run, run], "bitwise_diff_bytes": bitwise}},
        "output_guard_bytes_changed": 0,
        "input_guard_bytes_changed": 0,
        "input_bytes_changed": 0,
    }


# -- the judge ----------------------------------------------------------------------------------
def test_a_candidate_whose_two_runs_differ_still_fails():
    v = shape_verdict(child_result(bitwise=40), {"M": 8, "N": 64}, False, TOL)
    assert not v["passed"] and "differ in 40 bytes" in v["reason"]
    assert v["bitwise_equal"] is False and v["bitwise_diff_bytes"] == 40


def test_a_baseline_whose_runs_differ_within_tolerance_passes_and_keeps_the_difference():
    v = shape_verdict(
        child_result(bitwise=40), {"M": 8, "N": 64}, True, TOL, require_repeatable=False
    )
    assert v["passed"] and v["reason"] == ""
    assert v["bitwise_equal"] is False and v["bitwise_diff_bytes"] == 40
    (flag,) = repeatability_flags([v])
    assert flag.startswith("not_bitwise_repeatable: ")
    assert "40 bytes at held-out M=8xN=64" in flag


def test_a_baseline_outside_the_tolerance_still_fails():
    v = shape_verdict(
        child_result(bitwise=40, rel=3e-3), {"M": 8, "N": 64}, False, TOL, require_repeatable=False
    )
    assert not v["passed"] and "relative error 0.003 > 1e-05" in v["reason"]
    assert "differ" not in v["reason"]
    assert repeatability_flags([v]) == []  # a failed shape is the failure, not a flag


def test_repeatable_shapes_raise_no_flag():
    v = shape_verdict(child_result(), {"M": 8, "N": 64}, False, TOL, require_repeatable=False)
    assert v["bitwise_equal"] and v["bitwise_diff_bytes"] == 0
    assert repeatability_flags([v]) == []


# -- the runner, through a stand-in child -------------------------------------------------------
def racy_child_main(conn, deadline, current):
    """standin.child_main's protocol, where RACY entrants' two verification runs differ."""
    import time

    deadline.value = time.monotonic() + 120
    conn.send({"ok": True, "hello": {"arch": "sm_90", "l2_bytes": 60 << 20, "pid": os.getpid()}})
    shapes = {}
    while True:
        deadline.value = float("inf")
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg.get("op")
        if op == "stop":
            return
        if op == "setup":
            shapes = {s["index"]: s for s in msg["shapes"]}
            conn.send({"ok": True, "shapes": len(shapes), "pid": os.getpid()})
        elif op in ("copy_ceiling", "byte_mover", "time"):
            conn.send(standin.healthy_reply(msg, shapes))
        elif op == "verify":
            reply = standin.healthy_reply(msg, shapes)
            if msg["entrant"]["key"] in RACY:
                for sh in reply["shapes"]:
                    for o in sh["outputs"].values():
                        o["bitwise_diff_bytes"] = DIFF_BYTES
            conn.send({**reply, "pid": os.getpid()})
        elif op == "pid":
            conn.send({"ok": True, "pid": os.getpid()})
        else:
            conn.send({"ok": False, "fatal": False, "error": f"unknown op {op}"})


@pytest.fixture
def racy_runner(monkeypatch):
    monkeypatch.setattr(
        runner, "ChildWorker", lambda **kw: ChildWorker(target=racy_child_main, **kw)
    )


def test_the_runner_times_a_baseline_that_is_not_repeatable_and_flags_it(racy_runner):
    batch = standin.softmax_batch(
        "repeat-1",
        [
            standin.fixture_candidate("racy", "honest_bf16"),
            standin.fixture_candidate("steady", "honest_bf16"),
        ],
        {"seed": 3, "timeout_s_per_candidate": 5, "warm_spare": False},
    )
    batch["baselines"] = ["torch_eager", "torch_compile"]
    res = runner.run_batch(batch)
    c = {r["id"]: r for r in res["candidates"]}
    b = {r["name"]: r for r in res["baselines"]}
    assert c["racy"]["status"] == "failed" and "differ in" in c["racy"]["reason"]
    assert c["racy"]["timing"] == []
    assert c["steady"]["status"] == "passed", c["steady"]["reason"]

    eager = b["torch_eager"]
    assert eager["status"] == "passed", eager["reason"]
    assert [t["dims"] for t in eager["timing"]] == [{"M": 4, "N": 64}]
    assert all(not v["bitwise_equal"] for v in eager["verification"])
    repeat = [f for f in eager["flags"] if f.startswith("not_bitwise_repeatable")]
    assert len(repeat) == len(eager["verification"]) > 1  # the benchmarked and held-out shapes
    assert repeat[0] == (
        f"not_bitwise_repeatable: two runs on the same inputs differed in {DIFF_BYTES} bytes "
        "at M=4xN=64, each within the tolerance"
    )
    assert all(" at held-out " in f for f in repeat[1:])
    compiled = b["torch_compile"]
    assert compiled["status"] == "passed" and not any(
        f.startswith("not_bitwise_repeatable") for f in compiled["flags"]
    )
