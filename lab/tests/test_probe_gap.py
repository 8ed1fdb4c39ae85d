"""lab.probes.probe_gap: the variants it times and the rows it writes. The timing itself is for the
GPU (lab/device/gpu_pending.sh gap; bench/results/2026-12-03-h200-gap/)."""

from __future__ import annotations

from lab.probes import probe_gap


def test_each_variant_names_a_protocol_an_input_and_an_output_it_knows():
    protocols = {
        "worker",
        "direct",
        "direct_judge_flush",
        "worker_torch_flush",
        "worker_poison_copy",
    }
    for name, (proto, src, out) in probe_gap.VARIANTS.items():
        assert proto in protocols, name
        assert src in ("cumemalloc", "torch", "uniform"), name
        assert out in ("fresh", "prealloc", "alternate"), name
    # the worker's own protocol and direct mode's are both there, unchanged
    assert probe_gap.VARIANTS["worker"] == ("worker", "cumemalloc", "fresh")
    assert probe_gap.VARIANTS["direct"] == ("direct", "torch", "fresh")
    # every hold variant keeps the worker's protocol and changes only the hold
    for proto, hold_us in probe_gap.HOLD_VARIANTS.values():
        assert proto in ("worker_hold", "worker_busy") and hold_us >= 0


def test_a_row_carries_the_median_the_spread_and_every_sample(capsys):
    row = probe_gap.summary_row("16384x8192", "worker", [126.0, 127.0, 125.0, 130.0, 126.5])
    assert row["median_us"] == 126.5
    assert 125.0 <= row["p20_us"] <= row["median_us"] <= row["p80_us"] <= 130.0
    assert row["samples_us"] == [126.0, 127.0, 125.0, 130.0, 126.5]
    assert "16384x8192 worker" in capsys.readouterr().out
