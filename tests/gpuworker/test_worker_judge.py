import hashlib

from gpuworker.batch import baseline_record, candidate_record
from gpuworker.judge import clock_sagged, shape_verdict, timed_checks_reason, timing_record

TOL = {"y": {"rel_norm": 1e-5, "atol": 1e-6, "rtol": 1e-5}}


def run(rel=1e-7, nonfinite=0, bad=0, max_abs=1e-8):
    return {
        "rel_err": rel,
        "max_abs_err": max_abs,
        "nonfinite": nonfinite,
        "bad_elements": bad,
        "first_bad_index": 5 if (nonfinite or bad) else -1,
        "passed": not (nonfinite or bad) and rel <= 1e-5,
    }


def result(runs=None, bitwise=0, out_guard=0, in_guard=0, in_changed=0):
    return {
        "shape": 0,
        "outputs": {"y": {"runs": runs or [run(), run()], "bitwise_diff_bytes": bitwise}},
        "output_guard_bytes_changed": out_guard,
        "input_guard_bytes_changed": in_guard,
        "input_bytes_changed": in_changed,
    }


def verdict(**kw):
    return shape_verdict(result(**kw), {"M": 4, "N": 8}, False, TOL)


def test_a_clean_shape_passes_with_the_contract_fields():
    v = verdict()
    assert v["passed"] and v["reason"] == ""
    assert {"dims", "heldout", "passed", "rel_err", "max_abs_err", "reason"} <= set(v)


def test_unwritten_elements_fail_as_nan():
    v = verdict(runs=[run(nonfinite=12), run(nonfinite=12)])
    assert not v["passed"]
    assert "12 elements NaN/inf" in v["reason"]
    assert v["reason"].count("NaN/inf") == 1  # the same failure twice is reported once


def test_accuracy_failures_name_the_error_and_the_tolerance():
    v = verdict(runs=[run(rel=3e-3, bad=100), run(rel=3e-3, bad=100)])
    assert "relative error 0.003 > 1e-05" in v["reason"]


def test_elementwise_failures_are_reported_when_the_norm_passes():
    v = verdict(runs=[run(bad=1, max_abs=0.5), run(bad=1, max_abs=0.5)])
    assert "1 elements outside atol+rtol*|ref|" in v["reason"]


def test_guard_and_input_changes_come_first():
    v = verdict(out_guard=256, in_changed=4)
    assert v["reason"].startswith("out-of-bounds write: 256 bytes")
    assert "input mutation: 4 input bytes changed" in v["reason"]


def test_two_runs_that_differ_are_a_race():
    v = verdict(bitwise=40)
    assert not v["passed"] and "differ in 40 bytes" in v["reason"]
    assert v["bitwise_equal"] is False


def test_timed_runs_that_went_wrong_disqualify():
    checks = {
        "runs_checked": 40,
        "runs_failed": 20,
        "worst_rel_err": 1.0,
        "max_abs_err": 1.0,
        "nonfinite": 10,
        "bad_elements": 0,
        "first_failure": {"timed_run": 1, "nonfinite": 10, "rel_err": 1.0},
    }
    reason = timed_checks_reason(checks, 0)
    assert reason.startswith("20 of 40 timed runs gave wrong output (first: timed run 1")
    ok = dict(checks, runs_failed=0, first_failure=None)
    assert timed_checks_reason(ok, 0) == ""
    assert "input mutation during timed runs" in timed_checks_reason(ok, 8)


def test_timing_records_carry_the_contract_fields_and_raw_samples():
    t = timing_record(
        {"M": 4},
        [10.0, 11.0, 12.0],
        2_000_000,
        [1980, 1975],
        4,
        {"runs_checked": 3, "worst_rel_err": 1e-7},
    )
    for key in (
        "dims",
        "median_us",
        "p20_us",
        "p80_us",
        "ci_low_us",
        "ci_high_us",
        "samples_us",
        "bytes",
        "tbps",
        "sm_clock_mhz",
    ):
        assert key in t
    assert t["median_us"] == 11.0 and t["samples_us"] == [10.0, 11.0, 12.0]
    assert t["tbps"] == 2_000_000 / 11e-6 / 1e12
    assert t["clock_sagged"] is False


def test_a_clock_that_dropped_below_ninety_percent_sagged():
    assert clock_sagged([1980, 1500]) and not clock_sagged([1980, 1900]) and not clock_sagged([])


def test_every_record_starts_with_the_contract_keys():
    c = candidate_record("c", "// ptx")
    assert set(c) == {
        "id",
        "ptx_sha256",
        "status",
        "reason",
        "compile",
        "verification",
        "timing",
        "flags",
    }
    assert c["ptx_sha256"] == hashlib.sha256(b"// ptx").hexdigest()  # the PTX it was given
    b = baseline_record("triton", "3.6.0", {"kernel": "k"})
    assert {"name", "version", "config", "status", "reason", "verification", "timing"} <= set(b)
