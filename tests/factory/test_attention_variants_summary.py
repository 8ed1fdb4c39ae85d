"""lab.attention.variants_summary: the issue-49 ratios from a time phase's JSON (our fastest
kernel over flex_attention, and its TFLOP/s over plain SDPA's best at the same shape)."""

import json

from lab.attention import variants_summary as V


def test_ratios_against_flex_and_plain_sdpa(tmp_path, capsys):
    shape = [4, 32, 32, 4096, 128]
    data = {
        "timings": [
            {
                "variant": "plain",
                "causal": True,
                "shape": shape,
                "rows": {
                    "ours a": {"median_us": 100.0, "tflops": 500.0},
                    "sdpa flash": {"median_us": 120.0, "tflops": 400.0},
                    "sdpa cudnn": {"median_us": 90.0, "tflops": 600.0},
                },
            },
            {
                "variant": "alibi",
                "causal": True,
                "shape": shape,
                "rows": {
                    "ours fast": {"median_us": 100.0, "tflops": 540.0},
                    "ours slow": {"median_us": 150.0, "tflops": 360.0},
                    "flex compiled": {"median_us": 300.0, "tflops": 180.0},
                },
            },
            {"variant": "window", "causal": False, "shape": shape, "rows": {}},
        ]
    }
    (r,) = V.rows(data)
    assert r["ours"] == "fast" and r["x_flex"] == 3.0 and abs(r["of_sdpa"] - 0.9) < 1e-12
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    assert V.main([str(p)]) == 0
    assert "3.00" in capsys.readouterr().out
