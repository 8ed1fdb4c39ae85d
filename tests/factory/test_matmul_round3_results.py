"""bench/results/2026-12-07-h100-matmul-3: the README's tables are the JSON files' numbers
(lab.matmul.round2_report with the folder's steps), every check passed, and the numbers the
family's estimate and tests cite are in the files."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lab.matmul import round2_report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(ROOT, "bench", "results", "2026-12-07-h100-matmul-3")
STEPS = ("unaligned/unaligned_check", "unaligned/unaligned_time", "cluster", "kprobe")


def _ratio(step: str, shape: str, name: str) -> float:
    with open(os.path.join(FOLDER, step, "gemm_bench.json")) as f:
        data = json.load(f)
    for t in data["timings"]:
        if "x".join(map(str, t["shape"])) == shape:
            return t["rows"][name]["vs_torch"]
    raise KeyError(shape)


def test_readme_tables_are_the_files_numbers():
    text = round2_report.report(FOLDER, STEPS, ())
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    with open(os.path.join(FOLDER, "README.md")) as f:
        readme = f.read()
    missing = [r for r in rows if r not in readme]
    assert not missing, missing[:3]
    assert "| unaligned/unaligned_check | 45 | 45 | - |" in rows
    assert "### unaligned/unaligned_check/" not in text  # a checks-only step: no table


def test_the_pitch_rule_and_the_cp_async_charge_are_in_the_files():
    kp = {k: _ratio("kprobe", f"3072x5120x{k}", "w256s4t128") for k in (2048, 2056, 2080, 2096)}
    assert min(kp[2048], kp[2080], kp[2096]) > 0.94 and kp[2056] < 0.62
    t = "unaligned/unaligned_time"
    assert (
        _ratio(t, "3072x5120x2048", "w256s4t128") / _ratio(t, "3072x5120x2048", "w256s4t128ca")
        > 1.14
    )
    for shape in ("3072x5120x2056", "3000x5000x2056", "4096x4096x4104"):
        r = _ratio(t, shape, "w256s4t128") / _ratio(t, shape, "w256s4t128ca")
        assert 1.05 <= r < 1.1, (shape, r)


def test_padk_probe_pads_to_a_32_byte_pitch_and_its_kernel_compiles():
    from lab.matmul import padk_probe

    assert [padk_probe.padded_k(k) for k in (2056, 4104, 2048, 1032, 8)] == [
        2064,
        4112,
        2048,
        1040,
        16,
    ]
    assert all((2 * padk_probe.padded_k(k)) % 32 == 0 for k in range(8, 4200, 8))
    shapes = padk_probe.parse(padk_probe.SHAPES)
    assert shapes and all(k % 16 for _, _, k in shapes)
    try:
        from cuda.bindings import nvjitlink  # noqa: F401
    except Exception:  # noqa: BLE001
        return
    assert padk_probe.dry_run() == 0
