"""lab.attention.variants_summary: the issue-49 ratios from a time phase's JSON (our fastest
kernel over flex_attention, and its TFLOP/s over plain SDPA's best at the same shape)."""

import json

from lab.attention import variants_summary as V


def test_ratios_against_flex_and_plain_sdpa(tmp_path, capsys):
    shape = [4, 32, 32, 4096, 128]

    def timing(variant, causal, rows):
        """One timing entry at `shape`; rows maps a name to (median_us, tflops)."""
        return {
            "variant": variant,
            "causal": causal,
            "shape": shape,
            "rows": {n: {"median_us": us, "tflops": tf} for n, (us, tf) in rows.items()},
        }

    data = {
        "timings": [
            timing(
                "plain",
                True,
                {
                    "ours a": (100.0, 500.0),
                    "sdpa flash": (120.0, 400.0),
                    "sdpa cudnn": (90.0, 600.0),
                },
            ),
            timing(
                "alibi",
                True,
                {
                    "ours fast": (100.0, 540.0),
                    "ours slow": (150.0, 360.0),
                    "flex compiled": (300.0, 180.0),
                },
            ),
            timing("window", False, {}),
        ]
    }
    (r,) = V.rows(data)
    assert r["ours"] == "fast" and r["x_flex"] == 3.0 and abs(r["of_sdpa"] - 0.9) < 1e-12
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    assert V.main([str(p)]) == 0
    assert "3.00" in capsys.readouterr().out
