"""The one-field pairs of distil_lessons, counted by buckets and bisection (n log n, where the
evidence page of a 2,000-candidate job spent seconds comparing every two records), agree with
the plain comparison of every two records."""

import random
from collections import defaultdict

from factory import evidence


def _pairs_one_by_one(group, stats):
    """The definition: every two records whose schedules differ in exactly one field."""
    scheds = [(r.get("schedule") or {}, float(r["median_us"])) for r in group]
    for i, (sa, ta) in enumerate(scheds):
        for sb, tb in scheds[i + 1 :]:
            diff = [k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k)]
            if len(diff) != 1:
                continue
            f = diff[0]
            for sch, mine, other in ((sa, ta, tb), (sb, tb, ta)):
                if f not in sch:
                    continue
                s = stats[f].get(evidence.value_key(sch[f]))
                if s is not None:
                    s["pairs"] += 1
                    s["even"] += 1 if mine <= 1.02 * other else 0


def _group(rng, n):
    records = []
    for _ in range(n):
        schedule = {
            "threads": rng.choice([128, 256, 512]),
            "vec": rng.choice([1, 2, 4]),
            "store": rng.choice(["plain", "cs"]),
            "tile": rng.choice([[1, 2], [2, 2]]),
        }
        if rng.random() < 0.3:
            del schedule["store"]  # left at its default
        # times on a coarse grid: many ties and near-ties at the 2% edge
        records.append({"schedule": schedule, "median_us": 100 + rng.randrange(0, 40) * 0.5})
    return records


def _stats_for(group):
    stats = defaultdict(dict)
    for r in group:
        for name, value in r["schedule"].items():
            stats[name].setdefault(evidence.value_key(value), {"pairs": 0, "even": 0})
    return stats


def test_bucketed_pairs_match_the_pairwise_definition():
    rng = random.Random(5)
    for n in (0, 1, 2, 7, 60, 200):
        group = _group(rng, n)
        fast, slow = _stats_for(group), _stats_for(group)
        evidence._count_pairs(group, fast)
        _pairs_one_by_one(group, slow)
        assert fast == slow, n
        assert n < 60 or sum(v["pairs"] for f in fast.values() for v in f.values()) > 0
