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
