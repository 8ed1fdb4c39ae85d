import numpy as np
import pytest

from gpuworker.stats import relative_spread, summarize, tbps


def test_summary_gives_median_quantiles_and_an_interval_around_the_median():
    rng = np.random.default_rng(0)
    samples = 100.0 + rng.normal(0, 1.0, size=200)
    s = summarize(samples)
    assert s["median_us"] == pytest.approx(np.median(samples))
    assert s["p20_us"] < s["median_us"] < s["p80_us"]
    assert s["ci_low_us"] <= s["median_us"] <= s["ci_high_us"]
    assert s["ci_high_us"] - s["ci_low_us"] < 1.0  # 200 samples pin the median well
    assert s["n"] == 200


def test_summary_is_reproducible_from_the_raw_samples():
    samples = [5.0, 6.0, 5.5, 7.0, 5.2, 5.1]
    assert summarize(samples) == summarize(list(samples))


def test_one_sample_gives_a_degenerate_interval():
    s = summarize([3.0])
    assert s["median_us"] == s["ci_low_us"] == s["ci_high_us"] == 3.0


def test_summary_refuses_empty_and_non_finite_samples():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_relative_spread_is_zero_for_identical_samples_and_large_for_noisy_ones():
    assert relative_spread([2.0] * 10) == 0.0
    assert relative_spread([1.0, 2.0, 3.0, 4.0, 5.0]) > 0.5
    assert relative_spread([1.0]) == float("inf")


def test_tbps_counts_bytes_over_microseconds():
    # 4.28e9 bytes in 1000 us = 4.28 TB/s
    assert tbps(4_280_000_000, 1000.0) == pytest.approx(4.28)
