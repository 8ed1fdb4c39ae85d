"""lab.probes.probe_place: the softmax output placement probe. Its kernels and buffers are set up
here as far as a CPU can; the timing is for the GPU (gpu_pending.sh place)."""

from __future__ import annotations

from factory.compile import rejection_reason
from lab.probes import probe_place


def test_ours_is_suite_run_16s_winner_at_each_shape_and_links_without_spills():
    for m, n in probe_place.SHAPES:
        em, rep, tag = probe_place.our_schedule(m, n)
        assert tag == probe_place.WINNERS[f"{m}x{n}"]
        assert rejection_reason(rep, em.launch.block[0]) == ""
        assert [p.name for p in em.params] == ["x", "y", "M", "N"]


def test_every_pooled_output_fits_and_stays_16_byte_aligned():
    nbytes = 16384 * 8192 * 2
    size = probe_place.pool_bytes(nbytes)
    assert len(set(probe_place.OFFSETS)) == len(probe_place.OFFSETS)
    for off in probe_place.OFFSETS:
        assert off % 16 == 0 and off + nbytes <= size


def test_summarise_gives_median_and_the_p20_p80_spread():
    st = probe_place.summarise({"a": [5.0, 1.0, 3.0, 2.0, 4.0]})["a"]
    assert st["median_us"] == 3.0
    assert st["p20_us"] < st["median_us"] < st["p80_us"]
