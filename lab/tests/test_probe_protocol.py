"""lab.probes.probe_protocol: which input sets each protocol runs an entrant on, per round (the
timings themselves are for the GPU: gpu_pending.sh protocol)."""

import pytest

from lab.probes import probe_protocol as pp


def test_each_protocol_adds_one_habit_of_the_worker():
    k = pp.SETS
    assert [pp.schedule_runs("interleaved", r, k) for r in range(3)] == [[0], [0], [0]]
    assert [pp.schedule_runs("rotated", r, k) for r in range(k + 1)] == [[0], [1], [2], [3], [0]]
    assert pp.schedule_runs("in_a_row", 5, k) == list(range(k))
    assert pp.schedule_runs("poisoned", 0, k) == list(range(k))
    assert pp.PROTOCOLS == ("interleaved", "rotated", "in_a_row", "poisoned")
    with pytest.raises(ValueError, match="unknown protocol"):
        pp.schedule_runs("sideways", 0, k)
