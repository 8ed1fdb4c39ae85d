"""lab.probes.repeats: several suite runs side by side (pure Python, no GPU)."""

import json

import pytest

from lab.probes.repeats import compare, load_runs, main, table


def _row(impl, us, op="rmsnorm", shape="16384x4096", verified=True):
    return {
        "op": op,
        "shape": shape,
        "implementation": impl,
        "ours": impl.startswith("ours"),
        "verified": verified,
        "median_us": us,
    }


RUNS = [
    [_row("ours: a", 63.5), _row("torch_compile_max_autotune", 65.3), _row("triton", 65.6)],
    [_row("ours: b", 63.6), _row("torch_compile_max_autotune", 63.3), _row("triton", 65.1)],
    [
        _row("ours: a", 63.4),
        _row("torch_compile_max_autotune", 64.0),
        _row("triton", 60.0, verified=False),  # fast but wrong: never the best baseline
    ],
]


def test_each_run_is_judged_against_its_own_best_verified_baseline():
    (rec,) = compare(RUNS)
    assert [v["best"] for v in rec["verdicts"]] == ["torch_compile_max_autotune"] * 3
    assert rec["verdicts"][0]["ratio"] == pytest.approx(65.3 / 63.5)
    assert rec["verdicts"][1]["ratio"] == pytest.approx(63.3 / 63.6)
    assert rec["never_slower_runs"] == 2
    # Our schedule may differ by run: the entrant is "ours" either way.
    assert rec["medians_us"]["ours"] == [63.5, 63.6, 63.4]
    assert rec["medians_us"]["triton"] == [65.6, 65.1, None]
    assert rec["run_to_run_spread"]["torch_compile_max_autotune"] == pytest.approx(65.3 / 63.3 - 1)
    assert rec["run_to_run_spread"]["triton"] is None
    assert rec["pooled_best"] == "torch_compile_max_autotune"
    assert rec["pooled_ratio"] == pytest.approx(64.0 / 63.5)


def test_a_case_missing_from_a_run_is_left_out():
    runs = [RUNS[0] + [_row("ours: c", 10.0, op="softmax")], RUNS[1]]
    assert [r["op"] for r in compare(runs)] == ["rmsnorm"]


def test_the_table_and_the_command_write_what_was_compared(tmp_path):
    dirs = []
    for k, rows in enumerate(RUNS):
        d = tmp_path / f"run{k}"
        d.mkdir()
        (d / "rows.json").write_text(json.dumps(rows))
        dirs.append(str(d))
    lines = table(compare(load_runs(dirs)), ["run 1", "run 2", "run 3"])
    assert "| rmsnorm | 16384x4096 | ours | 63.5 | 63.6 | 63.4 | 0.3% |" in lines
    assert any(line.endswith("| 2 of 3 | 1.008x vs torch_compile_max_autotune |") for line in lines)
    out = tmp_path / "repeats.md"
    assert main([*dirs, "--out", str(out)]) == 0
    assert "2 of 3" in out.read_text()
    assert json.loads((tmp_path / "repeats.json").read_text())["records"][0]["op"] == "rmsnorm"
    with pytest.raises(SystemExit, match="no rows.json"):
        load_runs([str(tmp_path)])
