"""From run1/tail.json: per operator, the one kernel (the same layout at 16384x4096 and
16384x8192) with the smallest geometric mean of its two medians, per set, beside a kernel per
row length (each shape's fastest of our sets) and torch.compile. Every entrant was verified
before and after timing.

    python3 one_kernel.py run1/tail.json
"""

import json
import math
import sys


def main(path):
    cases = json.load(open(path))["cases"]
    by_op: dict = {}
    for c in cases:
        n = c["dims"].get("N") or max(c["dims"].values())
        for r in c["records"]:
            if r.get("verified") and r.get("median_us"):
                key = (r.get("set") or r["impl"], r["tag"])
                by_op.setdefault(c["op"], {}).setdefault(key, {})[n] = r["median_us"]
    print("| op | set | one kernel for both | us at 4096 | us at 8192 | geomean |")
    print("|---|---|---|---|---|---|")
    for op, entrants in by_op.items():
        ours = {k: t for k, t in entrants.items() if k[0] != "baseline"}
        best_per_shape = {n: min(t[n] for t in ours.values() if n in t) for n in (4096, 8192)}
        rows = {}
        for (s, tag), t in entrants.items():
            if len(t) == 2:
                g = math.sqrt(t[4096] * t[8192])
                if s not in rows or g < rows[s][0]:
                    rows[s] = (g, tag, t)
        for s, (g, tag, t) in sorted(rows.items(), key=lambda x: x[1][0]):
            print(f"| {op} | {s} | {tag} | {t[4096]:.1f} | {t[8192]:.1f} | {g:.1f} |")
        g = math.sqrt(best_per_shape[4096] * best_per_shape[8192])
        print(
            f"| {op} | a kernel per row length | (fastest at each) | {best_per_shape[4096]:.1f} "
            f"| {best_per_shape[8192]:.1f} | {g:.1f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
