"""Two one-pass attention runs side by side (lab/attention/bench.py's attention_time.json), for a
round's README: per variant and case our best kernel before -> after (TFLOP/s, x over flex, of
plain SDPA), and what issue 49's 2.5x-over-flex line asks of a kernel on this card.

    python -m lab.attention.round_compare NEW_FOLDER OLD_FOLDER

"x flex" is flex's median time over ours; "of SDPA" our TFLOP/s over the faster SDPA back end's
on plain attention at the same shape and causal flag in the same run. Both rates count the
unmasked work as the bench does (4 D flops a kept (query, key) pair; the document's pairs from
its ids).

The 2.5x table: a kernel 2.5x faster than flex runs at 2.5 x flex's TFLOP/s on the same FLOP
count. It is set beside the dense bf16 peak (989) and the best plain attention rate any kernel
(ours, SDPA flash or cuDNN) reached at that shape and causal flag in either run. "tiles" is the
work of the 128 x 128 tiles a kernel visits (kv_tiles, and id_tiles for the document: the tile
skipping of the bench's kernels) over the unmasked work: the tensor cores must run at the
needed rate times that. Where the new run has no flex number for a case, the old run's is used
(marked "old").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from factory.families.attention import tiling
from lab.attention.bench import doc_ids
from lab.attention.results_table import PEAK_BF16, shape_label

SDPA = ("sdpa flash", "sdpa cudnn")
WINDOW = 1024


def load(folder: Path) -> dict:
    data = json.loads((Path(folder) / "attention_time.json").read_text())
    return {(t["variant"], t["causal"], tuple(t["shape"])): t for t in data["timings"]}


def best(rows: dict, prefix: str) -> tuple[str, float, float] | None:
    """(label, TFLOP/s, median us) of the fastest row whose label starts with `prefix`."""
    got = [(k, r["tflops"], r["median_us"]) for k, r in rows.items() if k.startswith(prefix)]
    return max(got, key=lambda x: x[1]) if got else None


def case_row(timings: dict, key) -> dict | None:
    t = timings.get(key)
    if t is None:
        return None
    variant, causal, shape = key
    ours = best(t["rows"], "ours ")
    if ours is None:
        return None
    flex = t["rows"].get("flex compiled")
    plain = timings.get(("plain", causal, shape))
    sdpa = max((plain["rows"][b]["tflops"] for b in SDPA if b in plain["rows"]), default=None)
    return {
        "sched": ours[0][5:],
        "tflops": ours[1],
        "x_flex": flex["median_us"] / ours[2] if flex else None,
        "flex_tflops": flex["tflops"] if flex else None,
        "of_sdpa": ours[1] / sdpa if sdpa else None,
        "flops": t["unmasked_flops"],
    }


def f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def band(variant: str, causal: bool) -> tuple[int | None, int | None]:
    lo = -(WINDOW - 1) if variant == "window" else None
    hi = 0 if causal else ((WINDOW - 1) if variant == "window" else None)
    return lo, hi


def tile_work(variant: str, causal: bool, shape, bm: int = 128, bn: int = 128) -> float:
    """Flops of the bm x bn tiles the bench's kernels visit (wgmma work, masked or not)."""
    bsz, h, _, s, d = shape
    lo, hi = band(variant, causal)
    docs = doc_ids(bsz, s) if variant == "document" else None
    tiles = 0
    for b in range(bsz if docs is not None else 1):
        for i0 in range(0, s, bm):
            first, end = tiling.kv_tiles(i0, bm, s, bn, lo, hi)
            if docs is not None:
                first, end = tiling.id_tiles(first, end, i0, bm, s, s, bn, docs[b])
            tiles += max(0, end - first)
    if docs is None:
        tiles *= bsz
    return 4.0 * d * h * tiles * bm * bn


def doc_flops(causal: bool, shape) -> float:
    bsz, h, _, s, d = shape
    total = 0.0
    for row in doc_ids(bsz, s):
        for n in np.unique(row, return_counts=True)[1]:
            total += n * (n + 1) / 2 if causal else n * n
    return 4.0 * d * h * total


def main(argv: list[str]) -> int:
    new, old = load(Path(argv[0])), load(Path(argv[1]))
    keys = [k for k in new if k[0] != "plain"] + [k for k in old if k[0] not in {"plain"}]
    keys = list(dict.fromkeys(keys))
    order = ("plain", "softcap", "alibi", "window", "document")
    keys.sort(key=lambda k: order.index(k[0]))  # stable: the runs' case order within each
    plain = [k for k in new if k[0] == "plain"]
    print("### plain: our best and the faster SDPA back end (old -> new)\n")
    print(
        "| shape | causal | ours old | ours new | best SDPA old | best SDPA new | "
        "ratio old | ratio new |"
    )
    print("|---|---|---|---|---|---|---|---|")
    best_plain = {}
    for k in plain:
        _, causal, shape = k
        rates = []
        row = []
        for t in (old.get(k), new.get(k)):
            o = best(t["rows"], "ours ") if t else None
            sd = max((t["rows"][b]["tflops"] for b in SDPA if b in t["rows"]), default=None)
            row.append((o, sd))
            rates += [r["tflops"] for r in t["rows"].values()] if t else []
        best_plain[(causal, tuple(shape))] = max(rates)
        (o0, s0), (o1, s1) = row
        print(
            f"| {shape_label(list(shape))} | {causal} | {o0[1]:.0f} ({o0[0][5:]}) | "
            f"{o1[1]:.0f} ({o1[0][5:]}) | {s0:.0f} | {s1:.0f} | {o0[1] / s0:.3f} | "
            f"{o1[1] / s1:.3f} |"
        )
    print("\n### variants: our best, old -> new\n")
    print(
        "| variant | shape | causal | TFLOP/s old -> new | x flex old -> new | "
        "of plain SDPA old -> new | >= 2.5x flex | >= 0.9x SDPA |"
    )
    print("|---|---|---|---|---|---|---|---|")
    vkeys = [k for k in keys if k[0] != "plain"]
    for k in vkeys:
        variant, causal, shape = k
        a, b = case_row(old, k), case_row(new, k)
        cur, tag = (b, "") if b else (a, " (old)")
        print(
            f"| {variant} | {shape_label(list(shape))} | {causal} | "
            f"{f(a and a['tflops'], '.0f')} -> {f(b and b['tflops'], '.0f')} | "
            f"{f(a and a['x_flex'], '.2f')} -> {f(b and b['x_flex'], '.2f')} | "
            f"{f(a and a['of_sdpa'], '.3f')} -> {f(b and b['of_sdpa'], '.3f')} | "
            f"{'-' if cur['x_flex'] is None else ('met' if cur['x_flex'] >= 2.5 else 'no')}{tag} | "
            f"{'met' if cur['of_sdpa'] >= 0.9 else 'no'}{tag} |"
        )
    print("\n### the same schedule, old -> new (TFLOP/s)\n")
    for variant in order:
        ks = [k for k in new if k[0] == variant and k in old]
        labs = sorted(
            {x for k in ks for x in new[k]["rows"] if x.startswith("ours ")}
            & {x for k in ks for x in old[k]["rows"] if x.startswith("ours ")}
        )
        if not labs:
            continue
        print(f"{variant}:\n\n| shape | causal | " + " | ".join(x[5:] for x in labs) + " |")
        print("|---|---|" + "---|" * len(labs))
        for k in ks:
            cells = []
            for x in labs:
                o, n = old[k]["rows"].get(x), new[k]["rows"].get(x)
                if o and n:
                    d = 100 * (n["tflops"] / o["tflops"] - 1)
                    cells.append(f"{o['tflops']:.0f} -> {n['tflops']:.0f} ({d:+.0f}%)")
                else:
                    cells.append("-")
            print(f"| {shape_label(list(k[2]))} | {k[1]} | " + " | ".join(cells) + " |")
        print()
    print("\n### the 2.5x-over-flex line: the rate it asks for\n")
    print(
        "| variant | shape | causal | flex TFLOP/s | needed (2.5x) | needed / 989 | "
        "best plain, any kernel | needed / best plain | tiles | needed on tiles |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in vkeys:
        variant, causal, shape = k
        b, a = case_row(new, k), case_row(old, k)
        src, row = ("", b) if b and b["flex_tflops"] else ("old", a)
        if row is None or row["flex_tflops"] is None:
            continue
        if variant == "document":
            mine = doc_flops(causal, shape)
            assert abs(mine / row["flops"] - 1) < 1e-9, (k, mine, row["flops"])
        need = 2.5 * row["flex_tflops"]
        bp = best_plain[(causal, tuple(shape))]
        ratio = tile_work(variant, causal, shape) / row["flops"]
        print(
            f"| {variant} | {shape_label(list(shape))} | {causal} | "
            f"{row['flex_tflops']:.0f}{' (' + src + ')' if src else ''} | {need:.0f} | "
            f"{need / PEAK_BF16:.2f} | {bp:.0f} | {need / bp:.2f} | {ratio:.3f} | "
            f"{need * ratio:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
