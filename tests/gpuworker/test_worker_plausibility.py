from gpuworker.plausibility import best_baseline_by_shape, flags_for, movers_by_shape

DIMS = {"M": 16384, "N": 4096}


def timing(median_us, tbps, **extra):
    return {"dims": DIMS, "median_us": median_us, "tbps": tbps, **extra}


def baselines():
    return [
        {"name": "torch_eager", "status": "passed", "timing": [timing(300.0, 1.3)]},
        {"name": "triton", "status": "passed", "timing": [timing(100.0, 3.8)]},
        {"name": "torch_compile", "status": "failed", "timing": [timing(10.0, 40.0)]},
    ]


def test_the_best_passed_baseline_per_shape_is_the_bar():
    best = best_baseline_by_shape(baselines())
    assert best[tuple(sorted(DIMS.items()))] == ("triton", 100.0)  # the failed one is ignored


def test_a_result_above_the_copy_ceiling_is_flagged():
    flags = flags_for([timing(90.0, 4.9)], 4.28, {})
    assert len(flags) == 1 and flags[0].startswith("above_copy_ceiling")


def test_more_than_one_and_a_half_times_the_best_baseline_is_flagged():
    best = best_baseline_by_shape(baselines())
    flags = flags_for([timing(60.0, 4.0)], 4.28, best)
    assert any(f.startswith("suspiciously_fast_vs_triton") for f in flags)


def test_a_plausible_result_has_no_flags():
    best = best_baseline_by_shape(baselines())
    assert flags_for([timing(95.0, 4.0)], 4.28, best) == []


def test_a_sagging_clock_is_flagged():
    flags = flags_for([timing(95.0, 4.0, clock_sagged=True, sm_clock_min_mhz=1200)], 4.28, {})
    assert flags == ["sm_clock_sagged: 1200 MHz min at M=16384xN=4096"]


def _movers(tbps):
    return movers_by_shape(
        [
            {"dims": DIMS, "tbps": tbps, "bytes_read": 2, "bytes_written": 1},
            {"dims": {"M": 1, "N": 7}, "error": "5 inputs and 1 outputs: ..."},
        ]
    )


def test_above_the_copy_ceiling_but_within_the_byte_mover_of_the_same_bytes_is_the_mix():
    # SiLU-mul in suite run 15: 4.44 TB/s against a copy's 4.26; a + b of its bytes ran 4.42
    assert flags_for([timing(90.7, 4.44)], 4.26, {}, _movers(4.42)) == []
    assert _movers(4.42) == {tuple(sorted(DIMS.items())): 4.42}  # the errored shape left out


def test_above_both_the_copy_ceiling_and_the_byte_mover_is_flagged_naming_both():
    (flag,) = flags_for([timing(80.0, 5.0)], 4.26, {}, _movers(4.42))
    assert flag.startswith("above_copy_ceiling: 5.00 TB/s > copy 4.26 TB/s")
    assert "byte mover's 4.42 TB/s" in flag


def test_a_mover_slower_than_the_copy_is_not_named_as_a_limit():
    # suite run 16's first mover: 4.20 TB/s at SiLU-mul's bytes, below the copy's 4.29
    (flag,) = flags_for([timing(90.0, 4.41)], 4.29, {}, _movers(4.20))
    assert flag == "above_copy_ceiling: 4.41 TB/s > copy 4.29 TB/s at M=16384xN=4096"


def test_a_mover_measured_at_another_shape_explains_nothing():
    other = movers_by_shape([{"dims": {"M": 1, "N": 8}, "tbps": 9.0}])
    assert len(flags_for([timing(90.0, 4.9)], 4.28, {}, other)) == 1
