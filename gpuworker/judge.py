"""Turning what the child measured into verdicts. Pure functions, no CUDA: the judging process
decides, from the child's counts, whether each shape passed and why not.

The order of reasons is the order a reviewer wants them: memory safety first (writes outside the
output, inputs changed), then unwritten or non-finite elements, then accuracy, then races.
"""

from __future__ import annotations

from gpuworker.stats import summarize, tbps


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def shape_verdict(
    result: dict, dims: dict, heldout: bool, tolerances: dict, require_repeatable: bool = True
) -> dict:
    """One verification record (CONTRACTS.md) from the child's per-shape result.
    `tolerances` maps output name -> {"rel_norm", "atol", "rtol"}. `require_repeatable`: two
    runs on the same inputs that differ fail the shape (our candidates: a race or an
    uninitialised read); False for a baseline, which is judged by the tolerance of each run
    alone, the difference kept in `bitwise_equal` and `bitwise_diff_bytes`."""
    reasons = []
    if result["output_guard_bytes_changed"]:
        reasons.append(
            f"out-of-bounds write: {result['output_guard_bytes_changed']} bytes of the guard "
            "regions around the outputs changed"
        )
    if result["input_bytes_changed"]:
        reasons.append(f"input mutation: {result['input_bytes_changed']} input bytes changed")
    if result["input_guard_bytes_changed"]:
        reasons.append(
            f"out-of-bounds write: {result['input_guard_bytes_changed']} bytes of the guard "
            "regions around the inputs changed"
        )
    rel_err = 0.0
    max_abs = 0.0
    for name, o in result["outputs"].items():
        tol = tolerances[name]
        for i, run in enumerate(o["runs"]):
            rel_err = max(rel_err, run["rel_err"])
            max_abs = max(max_abs, run["max_abs_err"])
            which = f"{name} (run {i + 1})"
            if run["nonfinite"]:
                reasons.append(
                    f"{which}: {run['nonfinite']} elements NaN/inf where the reference is finite "
                    f"(unwritten or invalid; first at flat index {run['first_bad_index']})"
                )
            elif run["rel_err"] > tol["rel_norm"]:
                reasons.append(
                    f"{which}: relative error {_fmt(run['rel_err'])} > {_fmt(tol['rel_norm'])}"
                )
            elif run["bad_elements"]:
                reasons.append(
                    f"{which}: {run['bad_elements']} elements outside atol+rtol*|ref| "
                    f"(max abs error {_fmt(run['max_abs_err'])}, first at flat index "
                    f"{run['first_bad_index']})"
                )
        if o["bitwise_diff_bytes"] and require_repeatable:
            reasons.append(
                f"{name}: two runs on the same inputs differ in {o['bitwise_diff_bytes']} bytes "
                "(a race or uninitialised read)"
            )
    # keep each reason once (both runs usually fail the same way)
    seen, unique = set(), []
    for r in reasons:
        key = r.replace("(run 2)", "(run 1)")
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return {
        "dims": dict(dims),
        "heldout": heldout,
        "passed": not unique,
        "rel_err": rel_err,
        "max_abs_err": max_abs,
        "reason": "; ".join(unique),
        "bitwise_equal": all(not o["bitwise_diff_bytes"] for o in result["outputs"].values()),
        "bitwise_diff_bytes": sum(o["bitwise_diff_bytes"] for o in result["outputs"].values()),
        "guard_bytes_changed": result["output_guard_bytes_changed"]
        + result["input_guard_bytes_changed"],
        "input_bytes_changed": result["input_bytes_changed"],
    }


def timed_checks_reason(checks: dict, input_bytes_changed: int) -> str:
    """Why the timed runs' outputs disqualify an entrant, or "" when they are all correct."""
    reasons = []
    if checks["runs_failed"]:
        f = checks["first_failure"] or {}
        reasons.append(
            f"{checks['runs_failed']} of {checks['runs_checked']} timed runs gave wrong output "
            f"(first: timed run {f.get('timed_run')}, {f.get('nonfinite', 0)} NaN/inf, "
            f"relative error {_fmt(f.get('rel_err', 0.0))})"
        )
    if input_bytes_changed:
        reasons.append(f"input mutation during timed runs: {input_bytes_changed} bytes changed")
    return "; ".join(reasons)


def clock_sagged(clocks_mhz: list[int], tolerance: float = 0.9) -> bool:
    """A run whose SM clock dropped below 90% of its highest reading is noise, not a result."""
    return bool(clocks_mhz) and min(clocks_mhz) < tolerance * max(clocks_mhz)


def timing_record(
    dims: dict,
    samples_us: list[float],
    bytes_moved: int,
    clocks_mhz: list[int],
    sets: int,
    checks: dict,
    hold_us: float | None = None,
    host_gap_runs: int = 0,
    timed_outputs: str | None = None,
    same_outputs_as_baselines: bool | None = None,
) -> dict:
    """One shape's timing of one entrant. `hold_us`: the stream hold its runs were queued
    behind; `host_gap_runs`: runs dropped because the host took most of it to enqueue them;
    `timed_outputs`: where its timed runs wrote ("torch allocator" or "guarded buffer");
    `same_outputs_as_baselines`: with shared outputs, whether every address it wrote was one a
    torch baseline wrote in the same timing (child.Session.op_time)."""
    s = summarize(samples_us)
    clock = int(sorted(clocks_mhz)[len(clocks_mhz) // 2]) if clocks_mhz else None
    return {
        "dims": dict(dims),
        **{k: s[k] for k in ("median_us", "p20_us", "p80_us", "ci_low_us", "ci_high_us")},
        "samples_us": [round(x, 4) for x in samples_us],
        "bytes": bytes_moved,
        "tbps": tbps(bytes_moved, s["median_us"]),
        "sm_clock_mhz": clock,
        "sm_clock_min_mhz": min(clocks_mhz) if clocks_mhz else None,
        "clock_sagged": clock_sagged(clocks_mhz),
        "input_sets": sets,
        "timed_runs_checked": checks.get("runs_checked", 0),
        "timed_worst_rel_err": checks.get("worst_rel_err", 0.0),
        "hold_us": hold_us,
        "host_gap_runs": host_gap_runs,
        "timed_outputs": timed_outputs,
        "same_outputs_as_baselines": same_outputs_as_baselines,
    }
