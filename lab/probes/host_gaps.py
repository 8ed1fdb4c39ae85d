"""Host gaps in a recorded suite run: per case, each entrant's median over all timed runs, over
the first input set of each round (queued right after the round's synchronize, so a Python
baseline's host dispatch can leave the GPU idle inside the timed interval) and over the other
sets (queued behind the previous set's checks), and the targets recomputed from the other sets.

    PYTHONPATH=. python3 -m lab.probes.host_gaps bench/results/<run> [--write]

For runs timed before the GPU worker queued every run behind a stream hold (judge_hold); with
--write it leaves `host_gaps.md` in the run's folder.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

import numpy as np

# An entrant whose later-set runs still spread this much (p80/p20) was host-bound there too.
STILL_GAPPED = 1.10


def _split(t: dict) -> tuple[float, float, float]:
    """(median of the first sets, median of the other sets, their p80/p20) of one timing."""
    s = np.asarray(t["samples_us"], dtype=float)
    k = int(t.get("input_sets") or 1)
    first = s[np.arange(len(s)) % k == 0]
    other = s[np.arange(len(s)) % k != 0] if k > 1 else s
    spread = float(np.percentile(other, 80) / np.percentile(other, 20))
    return float(np.median(first)), float(np.median(other)), spread


def analyse(run: str) -> tuple[list[dict], str]:
    rows = []
    for path in sorted(glob.glob(os.path.join(run, "raw_*.json"))):
        with open(path) as f:
            d = json.load(f)
        op = os.path.basename(path)[4:-5]
        ents = [(c["id"].split(":", 1)[1], c, True) for c in d.get("candidates", [])]
        ents += [(b["name"], b, False) for b in d.get("baselines", [])]
        cases: dict[str, list] = {}
        for name, e, ours in ents:
            if e.get("status") != "passed":
                continue
            for t in e.get("timing") or []:
                shape = "x".join(str(v) for v in t["dims"].values())
                first, other, spread = _split(t)
                cases.setdefault(shape, []).append(
                    {
                        "name": name,
                        "ours": ours,
                        "all": t["median_us"],
                        "first": first,
                        "other": other,
                        "spread": spread,
                    }  # fmt: skip
                )
        for shape, es in cases.items():
            mine = min((e for e in es if e["ours"]), key=lambda e: e["other"])
            bases = [e for e in es if not e["ours"]]
            best = min(bases, key=lambda e: e["other"])
            tc = next((e for e in bases if e["name"] == "torch_compile"), None)
            rows.append(
                {
                    "op": op,
                    "shape": shape,
                    "ours": mine,
                    "best": best,
                    "torch_compile": tc,
                    "gapped": [e["name"] for e in bases if e["spread"] > STILL_GAPPED],
                }
            )
    lines = [
        f"# Host gaps in {run}",
        "",
        "Medians in us: over all timed runs / over the first input set of each round / over the "
        "other sets. `still gapped`: baselines whose other-set runs spread over "
        f"{STILL_GAPPED:.2f}x (p80/p20), host-bound there too; their medians stay too slow.",
        "",
        "| op | shape | ours | ours us (all / first / other) | best baseline by other sets "
        "| its us (all / first / other) | speedup (other sets) | vs torch.compile (other sets) "
        "| still gapped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    speedups = []
    slower = []
    for r in rows:
        o, b, tc = r["ours"], r["best"], r["torch_compile"]
        sp = b["other"] / o["other"]
        vs_tc = tc["other"] / o["other"] if tc else None
        if vs_tc:
            speedups.append(vs_tc)
        if sp < 1:
            slower.append(f"{r['op']} {r['shape']} {100 * (1 - sp):.2f}% behind {b['name']}")
        lines.append(
            f"| {r['op']} | {r['shape']} | {o['name']} | {o['all']:.1f} / {o['first']:.1f} / "
            f"{o['other']:.1f} | {b['name']} | {b['all']:.1f} / {b['first']:.1f} / "
            f"{b['other']:.1f} | {sp:.3f}x | {f'{vs_tc:.3f}x' if vs_tc else '-'} | "
            f"{', '.join(r['gapped']) or '-'} |"
        )
    gm = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else float("nan")
    lines += [
        "",
        f"- never slower than the best baseline (other sets): {len(rows) - len(slower)} of "
        f"{len(rows)}" + (f"; behind: {'; '.join(slower)}" if slower else ""),
        f"- geometric mean over torch.compile (other sets, {len(speedups)} cases): {gm:.3f}x",
    ]
    return rows, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--write", action="store_true")
    a = p.parse_args(argv)
    _, md = analyse(a.run)
    print(md)
    if a.write:
        with open(os.path.join(a.run, "host_gaps.md"), "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
