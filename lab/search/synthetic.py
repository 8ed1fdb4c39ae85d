"""A synthetic sweep in the "matmul-sweep-1" format, for tests of the replay harness only: the
real space of the example workload, with times from the matmul family's analytic estimate times
seeded noise. Never a result: nothing here was measured."""

from __future__ import annotations

import random

from factory.families.matmul.features import estimate


def synthetic_sweep(
    shapes: list[dict],
    *,
    seed: int = 0,
    noise: float = 0.15,
    failing_every: int = 0,
    manifest: str = "factory/examples/linear_residual.toml",
) -> dict:
    """`manifest`: the workload whose space the table holds (the default's epilogue renders
    fast, which keeps the agents' replays in tests quick)."""
    from lab.search.sweep_matmul import space_schedules

    schedules = space_schedules(shapes, manifest)
    rng = random.Random(seed)
    measurements = []
    for d in shapes:
        for i, s in enumerate(schedules):
            us = estimate(s, d["M"], d["N"], d["K"])["us"] * (1.0 + noise * rng.random())
            failed = bool(failing_every) and i % failing_every == failing_every - 1
            measurements.append(
                {
                    "id": i,
                    "dims": dict(d),
                    "status": "failed" if failed else "passed",
                    "median_us": None if failed else us,
                    "check_s": 0.01,
                    "time_s": 12 * us * 1e-6,
                }
            )
    return {
        "format": "matmul-sweep-1",
        "synthetic": True,
        "manifest": manifest,
        "shapes": [dict(d) for d in shapes],
        "schedules": schedules,
        "compile": [{"ok": True, "compile_s": 0.15} for _ in schedules],
        "measurements": measurements,
        "complete": True,
    }
