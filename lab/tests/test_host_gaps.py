"""lab/probes/host_gaps.py on a synthetic recorded run: a baseline whose first set of each round is
host-bound is judged by its other sets, and one host-bound in every set is named."""

import json

from lab.probes import host_gaps


def _timing(samples, sets=2):
    s = sorted(samples)
    return {
        "dims": {"M": 16384, "N": 4096},
        "median_us": (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
        "samples_us": samples,
        "input_sets": sets,
    }


def test_a_host_bound_first_set_is_set_aside_and_a_gapped_baseline_is_named(tmp_path):
    raw = {
        "candidates": [
            {"id": "rmsnorm:ours_a", "status": "passed", "timing": [_timing([63.0, 62.0] * 6)]},
            {"id": "rmsnorm:ours_b", "status": "failed", "timing": [_timing([1.0] * 12)]},
        ],
        "baselines": [
            # 250 us after the round's synchronize, 64 us otherwise
            {"name": "torch_compile", "status": "passed", "timing": [_timing([250.0, 64.0] * 6)]},
            # host-bound in both sets
            {
                "name": "triton",
                "status": "passed",
                "timing": [_timing([200.0, 70.0, 90.0, 180.0, 75.0, 160.0] * 2)],
            },
        ],
    }
    (tmp_path / "raw_rmsnorm.json").write_text(json.dumps(raw))
    rows, md = host_gaps.analyse(str(tmp_path))
    [r] = rows
    assert r["ours"]["name"] == "ours_a" and r["ours"]["other"] == 62.0  # the failed one is out
    assert r["best"]["name"] == "torch_compile" and r["best"]["other"] == 64.0
    assert r["best"]["first"] == 250.0 and r["best"]["all"] == 157.0
    assert r["gapped"] == ["triton"]
    assert "| 1.032x | 1.032x | triton |" in md
    assert "never slower than the best baseline (other sets): 1 of 1" in md
    assert host_gaps.main([str(tmp_path), "--write"]) == 0
    assert (tmp_path / "host_gaps.md").read_text() == md
