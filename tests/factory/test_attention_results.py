"""The first H100 attention results' README holds the tables that lab/attention/results_table.py
makes from the run's JSON files, unedited."""

import contextlib
import io
from pathlib import Path

from lab.attention import results_table

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "bench" / "results" / "2026-12-07-h100-attention"


def test_the_readme_tables_are_the_generated_ones():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert results_table.main(["x", str(RUN)]) == 0
    text = buf.getvalue()
    assert "220 of 220 checks passed" in text
    readme = (RUN / "README.md").read_text()
    for line in text.splitlines():
        if line.startswith("|"):
            assert line in readme, line


def test_flex_numbers_come_from_the_rerun_only():
    data = results_table.load(RUN)
    soft = results_table.variant_table(data, "softcap")[2:]
    alibi = results_table.variant_table(data, "alibi")[2:]
    assert all("invalid (run1)" not in r for r in soft)
    assert all("invalid (run1)" in r for r in alibi)


def test_one_pass_tables_divide_by_flex_and_by_the_best_plain_sdpa(tmp_path):
    import json

    def row(tf):
        return {"tflops": tf, "median_us": 1.0}

    shape = [4, 32, 32, 4096, 128]
    timings = [
        {
            "variant": "plain",
            "causal": True,
            "shape": shape,
            "rows": {
                "ours a": row(600.0),
                "ours b": row(500.0),
                "sdpa flash": row(300.0),
                "sdpa cudnn": row(400.0),
            },
        },
        {
            "variant": "alibi",
            "causal": True,
            "shape": shape,
            "rows": {"ours a": row(360.0), "flex compiled": row(120.0)},
        },
    ]
    env = {"gpu": "H100", "sms": 132, "torch": "2.11", "cuda": "13.0"}
    (tmp_path / "attention_time.json").write_text(
        json.dumps({"env": env, "timings": timings, "errors": ["time budget: x"]})
    )
    check = {
        "checks": [
            {
                "variant": "plain",
                "causal": True,
                "shape": [1, 2, 2, 256, 128],
                "ok": True,
                "schedule": "fa",
                "o": {"rel_norm": 1e-3},
                "lse": {"rel_norm": 1e-7},
            }
        ]
    }
    (tmp_path / "attention_check.json").write_text(json.dumps(check))
    data = results_table.load_one(tmp_path)
    plain = results_table.one_pass_table(data, "plain")[2]
    assert "600 (a)" in plain and "| 1.50x |" in plain  # 600 / max(300, 400)
    alibi = results_table.one_pass_table(data, "alibi")[2]
    assert "| 3.00x | 0.90x |" in alibi  # 360 / 120 flex, 360 / 400 plain cuDNN
    sched = results_table.schedule_table(data, "plain")
    assert sched[0] == "| shape | causal | a | b |" and "| 600 | 500 |" in sched[2]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert results_table.main(["x", str(tmp_path)]) == 0
    assert "1 of 1 checks passed" in buf.getvalue() and "time budget: x" in buf.getvalue()


def test_the_second_runs_readme_tables_are_the_generated_ones():
    run2 = ROOT / "bench" / "results" / "2026-12-07-h100-attention-2"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert results_table.main(["x", str(run2)]) == 0
    text = buf.getvalue()
    assert "248 of 248 checks passed" in text
    readme = (run2 / "README.md").read_text()
    lines = [x for x in text.splitlines() if x.startswith("|")]
    assert len(lines) > 80
    for line in lines:
        assert line in readme, line
