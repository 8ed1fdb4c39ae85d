"""A cost model fitted on evidence: ranks candidates before they cost GPU time.

Prediction target: log(median_us / roofline_us), where roofline_us is the time to move the
operator's bytes once at HBM bandwidth (a prior: every candidate of a memory-bound operator is a
multiple of it, so the model only has to learn the multiple). Features, from the schedule dict and
the shape:
- each numeric schedule field as log2(1 + v), and every field's value one-hot (catches
  non-monotone effects, e.g. a block size that is best in the middle);
- log2 of every dim, and the products of numeric schedule features with log2 of the dims (which
  block size wins depends on the row length);
and a ridge regression on standardised features (numpy only). Accuracy is the Spearman rank
correlation between predicted and measured times on held-out evidence; `prune` keeps the
predicted-fastest share of a population and says how much GPU time that saves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

# H200 HBM3e: 4.8 TB/s on the datasheet; a device-to-device copy reaches ~4.3 TB/s.
HBM_BYTES_PER_US = 4.3e6
LAUNCH_FLOOR_US = 2.0


def roofline_us(bytes_moved: float | None) -> float:
    """The time to move `bytes_moved` once at measured HBM copy bandwidth, plus a launch floor."""
    return LAUNCH_FLOOR_US + (float(bytes_moved or 0.0) / HBM_BYTES_PER_US)


def record_bytes(record: dict) -> float | None:
    """Bytes the operator moves, recovered from a record's bandwidth and time (or `bytes`)."""
    if record.get("bytes"):
        return float(record["bytes"])
    if record.get("tbps") and record.get("median_us"):
        return float(record["tbps"]) * 1e12 * float(record["median_us"]) * 1e-6
    return None


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _rank(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = np.arange(len(values), dtype=float)
    # average ranks of ties
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        if j > i:
            ranks[order[i : j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a, b) -> float | None:
    """Spearman rank correlation of two sequences (None when fewer than 3 points or constant)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if len(a) < 3 or len(a) != len(b):
        return None
    ra, rb = _rank(a), _rank(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass
class CostModel:
    """Ridge regression over schedule and shape features. Unfitted (or fitted on too little
    evidence) it predicts the roofline prior alone, which ranks all schedules of one shape
    equal."""

    ridge_lambda: float = 1.0
    min_records: int = 6
    numeric_fields: list[str] = field(default_factory=list)
    onehot: list[tuple[str, str]] = field(default_factory=list)
    dims: list[str] = field(default_factory=list)
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None
    weights: np.ndarray | None = None
    bias: float = 0.0
    n_train: int = 0

    @property
    def fitted(self) -> bool:
        return self.weights is not None

    def _vocab(self, records: list[dict]) -> None:
        values: dict[str, set] = {}
        dims: set[str] = set()
        for r in records:
            for k, v in (r.get("schedule") or {}).items():
                values.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
            dims.update((r.get("dims") or {}).keys())
        self.numeric_fields = sorted(
            k for k, vs in values.items() if all(_is_number(json.loads(v)) for v in vs)
        )
        self.onehot = sorted((k, v) for k, vs in values.items() for v in vs)
        self.dims = sorted(dims)

    def _features(self, schedule: dict | None, dims: dict) -> np.ndarray:
        s = schedule or {}
        num = [
            math.log2(1.0 + abs(float(s[k]))) if _is_number(s.get(k)) else 0.0
            for k in self.numeric_fields
        ]
        hot = [
            1.0 if json.dumps(s.get(k), sort_keys=True, default=str) == v else 0.0
            for k, v in self.onehot
        ]
        logd = [math.log2(max(float(dims.get(d, 1)), 1.0)) for d in self.dims]
        cross = [a * b for a in num for b in logd]
        return np.array(num + hot + logd + cross, dtype=float)

    def fit(self, records: list[dict]) -> CostModel:
        """Fit on passed records with a time; returns self. Too few records leave it unfitted."""
        rows = [r for r in records if r.get("status") == "passed" and r.get("median_us")]
        self.n_train = len(rows)
        if len(rows) < self.min_records:
            self.weights = None
            return self
        self._vocab(rows)
        x = np.stack([self._features(r.get("schedule"), r.get("dims") or {}) for r in rows])
        y = np.array([math.log(float(r["median_us"]) / roofline_us(record_bytes(r))) for r in rows])
        self.mean = x.mean(axis=0)
        self.scale = x.std(axis=0)
        self.scale[self.scale == 0] = 1.0
        xs = (x - self.mean) / self.scale
        self.bias = float(y.mean())
        a = xs.T @ xs + self.ridge_lambda * np.eye(xs.shape[1])
        self.weights = np.linalg.solve(a, xs.T @ (y - self.bias))
        return self

    def predict_us(self, schedule: dict | None, dims: dict, bytes_moved: float | None) -> float:
        """Predicted median time in microseconds."""
        prior = roofline_us(bytes_moved)
        if not self.fitted:
            return prior
        xs = (self._features(schedule, dims) - self.mean) / self.scale
        log_ratio = self.bias + float(xs @ self.weights)
        return prior * math.exp(max(min(log_ratio, 20.0), -5.0))

    def predict_records(self, records: list[dict]) -> list[float]:
        return [
            self.predict_us(r.get("schedule"), r.get("dims") or {}, record_bytes(r))
            for r in records
        ]

    def score(self, records: list[dict]) -> float | None:
        """Spearman rank correlation between predicted and measured times on `records`
        (held-out evidence), within each shape (times at different shapes are not comparable
        rankings), averaged weighted by group size."""
        groups: dict[str, list[dict]] = {}
        for r in records:
            if r.get("status") == "passed" and r.get("median_us"):
                groups.setdefault(json.dumps(r.get("dims"), sort_keys=True), []).append(r)
        total, weight = 0.0, 0
        for rows in groups.values():
            rho = spearman(self.predict_records(rows), [r["median_us"] for r in rows])
            if rho is not None:
                total += rho * len(rows)
                weight += len(rows)
        return total / weight if weight else None


def held_out_spearman(records: list[dict], *, folds: int = 5, seed: int = 0) -> float | None:
    """Accuracy of the cost model on evidence it was not fitted on: k-fold over distinct
    schedules (a schedule's every measurement is in one fold), mean Spearman over folds."""
    rows = [r for r in records if r.get("status") == "passed" and r.get("median_us")]
    keys = sorted({json.dumps(r.get("schedule"), sort_keys=True, default=str) for r in rows})
    if len(keys) < folds * 2:
        folds = max(2, len(keys) // 3)
    if len(keys) < 6:
        return None
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(keys))
    fold_of = {keys[i]: int(j % folds) for j, i in enumerate(perm)}
    scores = []
    for f in range(folds):
        train = [
            r
            for r in rows
            if fold_of[json.dumps(r.get("schedule"), sort_keys=True, default=str)] != f
        ]
        test = [
            r
            for r in rows
            if fold_of[json.dumps(r.get("schedule"), sort_keys=True, default=str)] == f
        ]
        s = CostModel().fit(train).score(test)
        if s is not None:
            scores.append(s)
    return float(np.mean(scores)) if scores else None


@dataclass
class PruneReport:
    kept: int
    pruned: int
    gpu_seconds_saved: float
    note: str


def prune(
    items: list, predicted_us: list[float], *, keep: int, gpu_seconds_per_candidate: float = 2.0
) -> tuple[list, PruneReport]:
    """Keep the `keep` predicted-fastest items (stable order among equals). The GPU time saved is
    what the pruned candidates would have cost on the GPU (the per-candidate time budget, or a
    measured mean)."""
    order = sorted(range(len(items)), key=lambda i: (predicted_us[i], i))
    kept_idx = sorted(order[:keep])
    pruned = len(items) - len(kept_idx)
    report = PruneReport(
        kept=len(kept_idx),
        pruned=pruned,
        gpu_seconds_saved=pruned * gpu_seconds_per_candidate,
        note=f"cost model kept {len(kept_idx)} of {len(items)} candidates",
    )
    return [items[i] for i in kept_idx], report
