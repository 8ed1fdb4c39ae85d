"""Statistics of timing samples: median, quantiles and a bootstrap interval of the median.

All in microseconds. The bootstrap uses a fixed generator seed so a results file is reproducible
from its raw samples (the samples are kept in the record for exactly that).
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95


def summarize(samples_us: list[float] | np.ndarray) -> dict:
    """median/p20/p80 and a 95% bootstrap interval of the median. Raises ValueError when empty."""
    x = np.asarray(samples_us, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples must be finite")
    median = float(np.median(x))
    p20, p80 = (float(v) for v in np.quantile(x, [0.2, 0.8]))
    lo, hi = bootstrap_median_interval(x)
    return {
        "median_us": median,
        "p20_us": p20,
        "p80_us": p80,
        "ci_low_us": lo,
        "ci_high_us": hi,
        "n": int(x.size),
    }


def bootstrap_median_interval(x: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple:
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(12345)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[idx], axis=1)
    a = (1.0 - CONFIDENCE) / 2
    lo, hi = np.quantile(medians, [a, 1.0 - a])
    return float(lo), float(hi)


def relative_spread(samples_us) -> float:
    """(p80 - p20) / median: how settled a set of samples is (0 = all equal)."""
    x = np.asarray(samples_us, dtype=np.float64)
    if x.size < 2:
        return float("inf")
    p20, p50, p80 = np.quantile(x, [0.2, 0.5, 0.8])
    return float((p80 - p20) / p50) if p50 > 0 else float("inf")


def tbps(bytes_moved: int, time_us: float) -> float:
    """Terabytes per second (1e12 bytes/s) for `bytes_moved` in `time_us` microseconds."""
    if time_us <= 0:
        return float("inf")
    return bytes_moved / (time_us * 1e-6) / 1e12
