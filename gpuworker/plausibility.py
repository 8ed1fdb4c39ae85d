"""Flags for results a human must look at before anyone believes them.

A speedup beyond the physical limit is a bug, not a result: anything faster than the measured
device-to-device copy (bytes read + written, the same count we use for kernels) or more than
1.5x faster than the best expert baseline at the same shape is flagged for review. Flags never
fail a candidate by themselves; they stop it from being taken at face value.

One exception, itself measured in the same batch: HBM moves reads faster than writes, so an
operator that reads more than it writes (SiLU-mul reads two bytes per byte written,
cross-entropy nearly only reads) can outrun a copy. The worker also times a byte mover with
each benchmarked shape's own inputs and outputs (judge_mix: every input byte read once, as many
bytes written as the outputs, nothing computed). A rate above the copy ceiling but within the
mover's at that shape is that mix, not a timing error; a rate above both is flagged. (A mover
slower than the copy explains nothing, and the flag does not name it.)
"""

from __future__ import annotations

SUSPICIOUS_SPEEDUP = 1.5
# A few percent of measurement noise on a kernel that truly runs at the copy ceiling is not worth
# a reviewer's time; anything clearly above it is.
COPY_CEILING_MARGIN = 1.02
# Baselines that count as "expert": the best a customer could pick without us.
EXPERT_BASELINES = (
    "torch_compile",
    "torch_compile_max_autotune",
    "triton",
    "liger",
    "customer",
    "torch_eager",
    "sdpa_flash",
    "sdpa_cudnn",
    "flex_attention",
)


def _key(dims: dict) -> tuple:
    return tuple(sorted(dims.items()))


def best_baseline_by_shape(baselines: list[dict]) -> dict[tuple, tuple[str, float]]:
    """Shape -> (baseline name, median_us) of the fastest passed expert baseline."""
    best: dict[tuple, tuple[str, float]] = {}
    for b in baselines:
        if b.get("status") != "passed" or b.get("name") not in EXPERT_BASELINES:
            continue
        for t in b.get("timing", []):
            k = _key(t["dims"])
            if k not in best or t["median_us"] < best[k][1]:
                best[k] = (b["name"], t["median_us"])
    return best


def movers_by_shape(shapes: list[dict]) -> dict[tuple, float]:
    """Shape -> the byte mover's TB/s, from the child's byte_mover reply (shapes it could not
    time, with an error instead, are left out)."""
    return {_key(m["dims"]): m["tbps"] for m in shapes if m.get("tbps")}


def mover_at(movers: dict | None, dims: dict) -> float | None:
    """The byte mover's TB/s at these dims (movers: movers_by_shape), or None."""
    return (movers or {}).get(_key(dims))


def within_mover(tbps: float, mover: float | None) -> bool:
    """Whether a rate is explained by the byte mover of the same bytes: within the margin."""
    return bool(mover) and tbps <= mover * COPY_CEILING_MARGIN


def repeatability_flags(verification: list[dict]) -> list[str]:
    """A baseline's shapes whose two verification runs differed although each was within the
    tolerance (shape_verdict with require_repeatable=False): it is timed, and this says so."""
    flags = []
    for v in verification:
        if v.get("passed") and not v.get("bitwise_equal", True):
            shape = "x".join(f"{k}={val}" for k, val in v["dims"].items())
            flags.append(
                f"not_bitwise_repeatable: two runs on the same inputs differed in "
                f"{v.get('bitwise_diff_bytes', '?')} bytes at {'held-out ' if v['heldout'] else ''}"
                f"{shape}, each within the tolerance"
            )
    return flags


def flags_for(
    timing: list[dict],
    copy_ceiling_tbps: float | None,
    best: dict,
    movers: dict | None = None,
) -> list[str]:
    """Human-readable flags for one entrant's timing records. `movers`: movers_by_shape."""
    flags = []
    for t in timing:
        shape = "x".join(f"{k}={v}" for k, v in t["dims"].items())
        mover = mover_at(movers, t["dims"])
        if (
            copy_ceiling_tbps
            and t.get("tbps")
            and t["tbps"] > copy_ceiling_tbps * COPY_CEILING_MARGIN
            and not within_mover(t["tbps"], mover)
        ):
            flags.append(
                f"above_copy_ceiling: {t['tbps']:.2f} TB/s > copy {copy_ceiling_tbps:.2f} TB/s "
                + (
                    f"and the byte mover's {mover:.2f} TB/s "
                    if mover and mover > copy_ceiling_tbps
                    else ""
                )
                + f"at {shape}"
            )
        ref = best.get(_key(t["dims"]))
        if ref and t["median_us"] > 0 and ref[1] / t["median_us"] > SUSPICIOUS_SPEEDUP:
            flags.append(
                f"suspiciously_fast_vs_{ref[0]}: {ref[1] / t['median_us']:.2f}x faster at {shape}"
            )
        if t.get("clock_sagged"):
            flags.append(f"sm_clock_sagged: {t.get('sm_clock_min_mhz')} MHz min at {shape}")
    return flags
