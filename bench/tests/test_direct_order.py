"""bench.direct's rounds on the CPU, with a stand-in for torch whose clock favours the last
place of a round (as the H200's did, bench/results/2026-12-04-h200-breadth run5): rotated
rounds give every entrant the same median; a fixed order hands the advantage to whoever is
timed last."""

import statistics
from types import SimpleNamespace

from bench.direct import Bench


class _Round:
    """A fake stream: each round's runs in order; the run in the round's last place takes
    4.4 us, any other 5.0 us."""

    def __init__(self):
        self.queued = []  # (start event, end event) per run of the current round

    def event(self, enable_timing=True):
        rnd = self

        class Event:
            def record(self):
                if not rnd.queued or rnd.queued[-1][1] is not None:
                    rnd.queued.append([self, None])
                else:
                    rnd.queued[-1][1] = self

            def elapsed_time(self, end):
                return self.ms

        return Event()

    def synchronize(self):
        for place, (start, _end) in enumerate(self.queued):
            start.ms = (4.4 if place == len(self.queued) - 1 else 5.0) / 1e3
        self.queued = []


def _bench(rotate: bool) -> Bench:
    rnd = _Round()
    cuda = SimpleNamespace(_sleep=lambda cycles: None, synchronize=rnd.synchronize, Event=rnd.event)
    b = Bench.__new__(Bench)  # no device: only what time_rounds reads
    b.torch, b.drain, b.rotate = SimpleNamespace(cuda=cuda), False, rotate
    b.flush_l2 = lambda r=0: None
    return b


def test_rotated_rounds_give_no_entrant_the_last_place_for_good():
    names = ["ours:a", "ours:b", "ours:c", "torch_compile", "triton"]
    entrants = {k: (lambda: None) for k in names}
    fixed = _bench(rotate=False).time_rounds(entrants, reps=10)
    med = {k: statistics.median(v) for k, v in fixed.items()}
    assert med["triton"] < min(med[k] for k in names[:-1])  # the last place's gain, every run
    rotated = _bench(rotate=True).time_rounds(entrants, reps=10)
    assert all(len(v) == 10 for v in rotated.values())
    assert {statistics.median(v) for v in rotated.values()} == {5.0}
    # each entrant took the last place equally often: twice in ten rounds of five
    assert all(sorted(v)[:2] == [4.4, 4.4] and sorted(v)[2] == 5.0 for v in rotated.values())
