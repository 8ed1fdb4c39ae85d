"""A cost model fitted on evidence: ranks candidates before they cost GPU time.

Prediction target: log(median_us / roofline_us), where roofline_us is the time the operator's
least work takes at the device's ceilings (bytes at the copy bandwidth, FLOPs at the tensor-core
peak, whichever is longer; a prior: every candidate is a multiple of it, so the model only has
to learn the multiple). Features, from the schedule dict and the shape, chosen so that what is
learnt at one shape carries to another:
- the family's own features (factory.families: `Family.features`), quantities the hardware sees
  of a schedule at a shape (waves, occupancy, loop trips, work in flight per SM, ...);
- every schedule field's value one-hot (catches what no formula names: hints, flags).
A ridge regression on standardised features (numpy only). Accuracy is the Spearman rank
correlation between predicted and measured times on held-out evidence; `prune` keeps the
predicted-fastest share of a population and says how much GPU time that saves.

`dim_order` gives the workload's own order of its dims (a store that reorders keys, PostgreSQL
jsonb, loses it); the family's features read the shape through it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from factory.device import DEFAULT as DEVICE

HBM_BYTES_PER_US = DEVICE.copy_bytes_per_us
LAUNCH_FLOOR_US = DEVICE.launch_floor_us


def roofline_us(bytes_moved: float | None, flops: float | None = None) -> float:
    """The time to move `bytes_moved` once at the copy ceiling or to do `flops` at the
    tensor-core peak, whichever is longer, plus a launch floor (microseconds). Anything not a
    finite positive number counts as nothing."""
    b = _finite(bytes_moved)
    f = _finite(flops)
    return LAUNCH_FLOOR_US + max(b / HBM_BYTES_PER_US, f / DEVICE.peak_bf16_flops_per_us)


def _finite(v) -> float:
    try:
        x = float(v or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def record_flops(record: dict) -> float | None:
    return record.get("flops") or None


def record_bytes(record: dict) -> float | None:
    """Bytes the operator moves, recovered from a record's bandwidth and time (or `bytes`)."""
    if record.get("bytes"):
        return float(record["bytes"])
    if record.get("tbps") and record.get("median_us"):
        return float(record["tbps"]) * 1e12 * float(record["median_us"]) * 1e-6
    return None


def _encode(value) -> str:
    """A schedule value as a one-hot key: plain scalars cheaply (the common case, thousands of
    times per fit), anything else as sorted JSON."""
    if value is None or isinstance(value, bool | int | float | str):
        return f"{type(value).__name__}:{value}"
    return json.dumps(value, sort_keys=True, default=str)


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


LAMBDAS = (0.3, 1.0, 3.0, 10.0, 30.0)


def _loo_error(xs: np.ndarray, y: np.ndarray, lam: float) -> float:
    """Mean squared leave-one-out error of ridge regression, in closed form (residual over one
    minus leverage): small evidence sets want little shrinkage, large ones more."""
    # The hat matrix's diagonal without the n x n matrix: O(n p^2) for n records.
    inv = np.linalg.inv(xs.T @ xs + lam * np.eye(xs.shape[1]))
    leverage = np.einsum("ij,jk,ik->i", xs, inv, xs)
    residual = y - xs @ (inv @ (xs.T @ y))
    return float(np.mean((residual / np.maximum(1.0 - leverage, 1e-6)) ** 2))


def _scaled(prior_us: float, log_ratio: float) -> float:
    """The roofline prior times the predicted ratio, its log clamped to [-5, 20]."""
    return prior_us * math.exp(max(min(log_ratio, 20.0), -5.0))


@dataclass
class CostModel:
    """Ridge regression over schedule and shape features. Unfitted (or fitted on too little
    evidence) it predicts the roofline prior alone, which ranks all schedules of one shape
    equal."""

    ridge_lambda: float | None = None  # None: chosen by leave-one-out error from LAMBDAS
    family: str = "row"  # whose features (factory.families) describe a schedule
    min_records: int = 6
    dim_order: list[str] = field(default_factory=list)
    onehot: list[tuple[str, str]] = field(default_factory=list)
    mean: np.ndarray | None = None
    scale: np.ndarray | None = None
    weights: np.ndarray | None = None
    bias: float = 0.0
    n_train: int = 0
    chosen_lambda: float | None = None

    @property
    def fitted(self) -> bool:
        return self.weights is not None

    def _vocab(self, records: list[dict]) -> None:
        values: dict[str, set] = {}
        for r in records:
            for k, v in (r.get("schedule") or {}).items():
                values.setdefault(k, set()).add(_encode(v))
        self.onehot = sorted((k, v) for k, vs in values.items() for v in vs)

    def _family(self):
        from factory import families

        return families.get(self.family)

    def _family_features(self, schedule: dict, dims: dict) -> list[float]:
        return list(self._family().features(schedule, dims, self.dim_order))

    def _features(self, schedule: dict | None, dims: dict) -> np.ndarray:
        s = schedule or {}
        encoded: dict[str, str] = {}  # each field's value as JSON, once per record
        hot = []
        for k, v in self.onehot:
            if k not in encoded:
                encoded[k] = _encode(s.get(k))
            hot.append(1.0 if encoded[k] == v else 0.0)
        return np.array(self._family_features(s, dims) + hot, dtype=float)

    def fit(self, records: list[dict]) -> CostModel:
        """Fit on passed records with a time; returns self. Too few records leave it unfitted."""
        # Only finite positive times: log(median / roofline) of anything else is a math
        # domain error that would stop every later job of the family from proposing.
        rows = [r for r in records if r.get("status") == "passed" and _finite(r.get("median_us"))]
        self.n_train = len(rows)
        if len(rows) < self.min_records:
            self.weights = None
            return self
        self._vocab(rows)
        x = np.stack([self._features(r.get("schedule"), r.get("dims") or {}) for r in rows])
        y = np.array(
            [
                math.log(float(r["median_us"]) / roofline_us(record_bytes(r), record_flops(r)))
                for r in rows
            ]
        )
        self.mean = x.mean(axis=0)
        self.scale = x.std(axis=0)
        self.scale[self.scale == 0] = 1.0
        xs = (x - self.mean) / self.scale
        self.bias = float(y.mean())
        lambdas = LAMBDAS if self.ridge_lambda is None else (self.ridge_lambda,)
        best = min(lambdas, key=lambda lam: _loo_error(xs, y - self.bias, lam))
        self.chosen_lambda = best
        a = xs.T @ xs + best * np.eye(xs.shape[1])
        self.weights = np.linalg.solve(a, xs.T @ (y - self.bias))
        return self

    def predict_us(
        self, schedule: dict | None, dims: dict, bytes_moved: float | None, flops: float = 0.0
    ) -> float:
        """Predicted median time in microseconds."""
        prior = roofline_us(bytes_moved, flops)
        if not self.fitted:
            return prior
        xs = (self._features(schedule, dims) - self.mean) / self.scale
        log_ratio = self.bias + float(xs @ self.weights)
        return _scaled(prior, log_ratio)

    def predict_many(
        self, schedules: list[dict], dims: dict, bytes_moved: float | None, flops: float = 0.0
    ) -> list[float]:
        """predict_us for many schedules at one shape, equal up to rounding: the model is linear,
        so each one-hot value's share is looked up, and the layout's share is computed once per
        layout (a space of 63K schedules holds about 2K). Ranking a space took 1.6 s one by
        one."""
        prior = roofline_us(bytes_moved, flops)
        if not self.fitted:
            return [prior] * len(schedules)
        coef = self.weights / self.scale
        base = self.bias - float(self.mean @ coef)
        n_layout = len(coef) - len(self.onehot)
        hot: dict[str, dict[str, float]] = {}
        for (k, v), c in zip(self.onehot, coef[n_layout:], strict=True):
            hot.setdefault(k, {})[v] = float(c)
        fam = self._family()
        fields = fam.feature_fields
        shares: dict[tuple, float] = {}
        out = []
        for s in schedules:
            key = tuple(s.get(f) for f in fields) if fields else None
            share = shares.get(key) if fields else None
            if share is None:
                x = np.array(list(fam.features(s, dims, self.dim_order)), dtype=float)
                share = float(x @ coef[:n_layout])
                if fields:
                    shares[key] = share
            log_ratio = base + share
            for k, values in hot.items():
                log_ratio += values.get(_encode(s.get(k)), 0.0)
            out.append(_scaled(prior, log_ratio))
        return out

    def predict_records(self, records: list[dict]) -> list[float]:
        return [
            self.predict_us(
                r.get("schedule"), r.get("dims") or {}, record_bytes(r), record_flops(r) or 0.0
            )
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
