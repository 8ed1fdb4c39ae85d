"""The offline backend: heuristic planner, writer and tuner, no network.

- The planner reads the job's history, the evidence of similar past jobs and the lessons, and
  decides how many candidates the writer and the tuner make and what to prefer or avoid.
- The writer takes untried points of the search spaces (generator schedules, edits of the
  customer's kernel): gen 0 seeds from the two best winners of similar past jobs, the cost
  model's picks at the new shape and reshapes of the two best (warm start) or, cold, from the
  family's screened starting layouts (its `seeds`), the default schedule and its
  neighbours, then a spread of the space (farthest-point sampling over fields);
  later it takes the cost model's predicted-fastest untried points, and explores a spread of
  the points it predicts near the fastest (see OfflineWriter._explore).
- The tuner mutates the best measured candidates one field at a time (neighbour values taken from
  the space, so every mutant is valid), reshapes them (more threads per row with fewer rows per
  block or fewer chunks, and the reverse) and recombines the two best field by field.
Every choice goes through `Context.draft`, so the result is a list of CandidateDrafts, and
through `Context.screened`: the reviewer judges each pick on its CPU compile before it takes a
slot, so GPU time goes to kernels that can run.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from collections import defaultdict

import numpy as np

from factory import evidence as ev
from factory.agents.context import Context, Item, default_item, seed_items
from factory.agents.types import CandidateDraft, Plan


def _sort_values(values):
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(nums) == len(values):
        return sorted(values)
    return sorted(values, key=lambda v: json.dumps(v, sort_keys=True, default=str))


def _field_values(items: list[Item]) -> dict[str, list]:
    """For each field of the items' dataclass, its distinct values in the space, sorted."""
    out: dict[str, set] = {}
    names: dict[type, list[str]] = {}
    for it in items:
        cls = type(it.value)
        if cls not in names:
            names[cls] = [f.name for f in dataclasses.fields(it.value)]
        for name in names[cls]:
            out.setdefault(name, set()).add(getattr(it.value, name))
    return {k: _sort_values(list(v)) for k, v in out.items()}


def _space_field_values(ctx: Context, kind: str) -> dict[str, list]:
    """_field_values of the context's items of `kind`: once per context and space (100k points
    took seconds, and the tuner asks for every parent it mutates)."""
    key = (kind, len(ctx.gen_items), len(ctx.edit_items))
    if key not in ctx._kind_values:
        ctx._kind_values[key] = _field_values([it for it in ctx.items if it.kind == kind])
    return ctx._kind_values[key]


def _rows_here(ctx: Context) -> list[tuple[dict, float]]:
    """The passed records the context's lessons were distilled from that ran at the job's own
    shapes, each as (schedule, time over the best of its job and shape)."""
    rel = ev.lesson_records(
        [*ctx.job_records, *ctx.past_records],
        family=ctx.family,
        gpu=ctx.gpu,
        dims=ctx.dims_list[0] if ctx.dims_list else None,
    )
    here = [r for r in rel if (r.get("dims") or {}) in ctx.dims_list]
    return [(r.get("schedule") or {}, ratio) for r, ratio in ev.relative_times(here)]


def avoid_lists(ctx: Context) -> dict[str, list]:
    """The schedule-field values to hold out of the job's next proposals (JSON-decoded, per
    field).

    A suspect is a value tried at least 3 times, never within 5% of its job's best, on average
    1.5x slower, and in no one-field pair that showed it level (`ev.Lessons.choices`). A slow
    record holds several choices, and its slowness may belong to any of them, so a suspect
    earns its place only from records that hold no value already on the list: the
    list is built greedily, the suspect slowest on average over its records without a listed
    value first, then the others' averages recomputed without its records, until no suspect
    is still tried 3 times and 1.5x slower over what is left. Suspects held by exactly the same
    remaining records cannot be told apart and are listed together."""
    if not ctx.lessons:
        return {}
    # Only records at the job's own shapes: a value slow at a neighbouring shape (split-K where
    # the output has tiles enough) may be the one that wins here, so other shapes' lessons
    # steer the picks (prefer, the cost model) but hold nothing out.
    held: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for i, (sched, ratio) in enumerate(_rows_here(ctx)):
        for fname, value in sched.items():
            held[(fname, ev.value_key(value))].append((i, ratio))
    even = {
        (fname, v)
        for fname, vals in ctx.lessons.choices.items()
        for v, s in vals.items()
        if s.get("even")
    }
    suspects = sorted(
        c
        for c, rows in held.items()
        if len(rows) >= 3
        and min(r for _, r in rows) > 1.05
        and sum(r for _, r in rows) / len(rows) > 1.5
        and c not in even
    )
    if not suspects:
        return {}
    listed: list[tuple[str, str]] = []
    explained: set[int] = set()  # the records that hold a listed value
    while True:
        left = {}
        for c in suspects:
            if c not in listed:
                rows = [(i, r) for i, r in held[c] if i not in explained]
                if len(rows) >= 3 and sum(r for _, r in rows) / len(rows) > 1.5:
                    left[c] = rows
        if not left:
            break
        worst = max(left, key=lambda c: sum(r for _, r in left[c]) / len(left[c]))
        same = {i for i, _ in left[worst]}
        for c, rows in left.items():
            if {i for i, _ in rows} == same:
                listed.append(c)
        explained |= {i for i, _ in held[worst]}
    avoid: dict[str, list] = {}
    for fname, v in listed:
        avoid.setdefault(fname, []).append(json.loads(v))
    return avoid


class OfflinePlanner:
    def plan(self, ctx: Context) -> Plan:
        pop = ctx.population
        notes = []
        if not ctx.items:
            return Plan(
                "freeform",
                0,
                0,
                notes=[f"no search space offline ({ctx.unsupported or 'no customer kernel'})"],
                lessons_text=ctx.lessons.text if ctx.lessons else "",
            )
        measured = ctx.objective_by_ptx()
        prefer = {}
        avoid = avoid_lists(ctx)
        if ctx.lessons:
            for fname in ctx.lessons.choices:
                prefer[fname] = ctx.lessons.preferred(fname)[:2]
        if ctx.generation == 0 or not measured:
            warm = self._warm(ctx)
            if warm:
                notes.append(f"warm start from {len(warm)} winners of similar past jobs")
                return Plan("warm_start", pop, 0, prefer, avoid, notes, ctx.lessons.text)
            notes.append("cold start: default schedule and a spread of the space")
            return Plan("explore", pop, 0, prefer, avoid, notes, ctx.lessons.text)
        history = self._best_by_generation(ctx)
        plateau = len(history) >= 2 and history[-1] >= history[-2] * 0.99
        if plateau:
            n_tuner = pop // 2
            notes.append("no gain last generation: half the population explores")
        else:
            n_tuner = max(1, math.ceil(pop * 0.6))
            notes.append("improving: most of the population tunes the best")
        return Plan("exploit", pop - n_tuner, n_tuner, prefer, avoid, notes, ctx.lessons.text)

    @staticmethod
    def _warm(ctx: Context) -> list[Item]:
        out = []
        for s in ev.warm_start_schedules(
            ctx.past_records,
            family=ctx.family,
            dtype=ctx.dtype,
            gpu=ctx.gpu,
            dims=ctx.dims_list[0],
            limit=max(ctx.population, 4),
        ):
            it = ctx.item_for(s)
            if it is not None:
                out.append(it)
        return out

    @staticmethod
    def _best_by_generation(ctx: Context) -> list[float]:
        per_gen: dict[int, float] = {}
        objective = ctx.objective_by_ptx()
        for t, r in objective.values():
            g = int(r.get("generation", 0))
            per_gen[g] = min(per_gen.get(g, math.inf), t)
        best, out = math.inf, []
        for g in sorted(per_gen):
            best = min(best, per_gen[g])
            out.append(best)
        return out


class OfflineWriter:
    """Chooses untried points of the spaces (see module doc)."""

    def __init__(
        self, explore_fraction: float = 0.25, oversample: int = 4, explore_band: float = 1.5
    ):
        self.explore_fraction = explore_fraction
        self.oversample = oversample
        self.explore_band = explore_band

    def write(self, ctx: Context, plan: Plan, n: int, taken: set[str]) -> list[CandidateDraft]:
        """With both a generator space and a customer kernel, a quarter of the writer's slots
        (at least one) go to edits of the customer's kernel, the rest to generator schedules;
        slots one pool cannot fill go to the other."""
        if n <= 0:
            return []
        if not (ctx.gen_items and ctx.edit_items):
            return self._write(ctx, plan, n, set(taken), None)
        n_edit = max(1, n // 4)
        out = self._write(ctx, plan, n - n_edit, set(taken), "generator")
        out += self._write(ctx, plan, n - len(out), set(taken), "edit")
        if len(out) < n:
            have = taken | {ev.schedule_key(d.schedule) for d in out}
            out += self._write(ctx, plan, n - len(out), have, "generator")
        return out

    def _write(self, ctx, plan, n, taken, kind) -> list[CandidateDraft]:
        if n <= 0:
            return []
        rng = random.Random(ctx.seed * 1000 + ctx.generation)
        tried = ctx.tried_keys() | taken
        tried_ptx = ctx.tried_ptx()
        pool = [it for it in ctx.items if kind is None or it.kind == kind]
        untried = [it for it in pool if it.key not in tried and not _avoided(it, plan)]
        untried = untried or [it for it in pool if it.key not in tried]
        picks: list[tuple[Item, str]] = []
        # The model's order of the untried space (predicting every item once: thousands of them)
        fitted = ctx.model is not None and ctx.model.fitted
        ranked = ctx.ranked(untried) if fitted else []
        if plan.strategy == "warm_start":
            warm = [
                it
                for it in OfflinePlanner._warm(ctx)
                if it.key not in tried and (kind is None or it.kind == kind)
            ]
            # The past winners ran at other shapes: the best layout moves with the shape (fewer
            # rows want more threads per row), so the two best are also reshaped.
            by_key = {it.key: it for it in pool}
            reshaped = []
            for w in warm[:2]:
                for change, why in _reshapes(ctx, w.value):
                    it = by_key.get(Item(w.kind, dataclasses.replace(w.value, **change)).key)
                    if it is not None and it.key not in tried:
                        reshaped.append((it, f"warm start: a past winner reshaped ({why})"))
            # A model fitted on the past evidence ranks the whole space at the new shape: on the
            # recorded H200 sweeps its four picks at an unseen suite shape held a schedule within
            # 1% of that shape's best, where the other shape's winner was 3.5-4.3% off
            # (bench/costmodel_eval.py).
            at_shape = [
                (it, "warm start: the cost model's pick at this shape")
                for it, _ in ranked[: max(1, n // 4 + 1)]
            ]
            winners = [(it, "warm start: a winner of a similar past job") for it in warm]
            # The generator's screened layouts are worked out at this shape (tile counts, waves,
            # split-K where the output has few tiles): the first two go beside the past winners.
            here = [
                (it, "warm start: a screened starting layout at this shape")
                for it in seed_items(ctx)[:2]
                if it.key not in tried and (kind is None or it.kind == kind)
            ]
            picks += winners[:2] + here + at_shape + reshaped + winners[2:]
        if (ctx.generation == 0 or not ctx.job_records) and kind != "edit":
            # cold (no past job left a winner to start from, whether or not it left records):
            # first the generator's screened starting layouts at this shape (the schedules the
            # benchmark suite times as ours; the default is usually first)
            cold = plan.strategy != "warm_start"
            if cold:
                # (three quarters of the slots at most: the rest explore, for the cost model)
                seeds = seed_items(ctx)[: max(1, 3 * n // 4)]
                picks += [(it, "a screened starting layout") for it in seeds]
            d = default_item(ctx)
            if d is not None and d.key not in tried:
                picks.append((d, "the generator's default schedule"))
            if d is not None and cold:
                # cold: the default is the generator's best guess, so half the start is its
                # one-field neighbours and the other half a spread of the space
                near = [it for it in _neighbours(ctx, d) if it.key not in tried]
                rng.shuffle(near)
                picks += [(it, "neighbour of the default") for it in near[: max(1, n // 2)]]
        if (ctx.generation == 0 or not ctx.job_records) and kind != "generator":
            if ctx.edit_items:
                # the customer's own kernel with each single safe edit: cheap, always valid
                picks += [(it, "edit of the customer kernel") for it in self._edit_seeds(ctx)]
        if fitted:
            n_model = max(1, round(n * (1 - self.explore_fraction)))
            # (in the model's order, `oversample` variants of one layout at most: see admit)
            per_layout: dict = {}
            model_picks, rest = [], []
            for it, us in ranked:
                if len(model_picks) >= n_model * self.oversample:
                    rest.append((it, us))
                    continue
                lay = _layout(ctx, it)
                k = per_layout[lay] = per_layout.get(lay, 0) + 1
                (model_picks if lay is None or k <= self.oversample else rest).append((it, us))
            picks += [(it, "cost model's pick") for it, _ in model_picks]
            if plan.avoid and ctx.generation > 0:
                # One slot re-tests what the avoid-lists hold out: the model's fastest untried
                # item among them (a value is avoided after a few slow records, whose slowness
                # may belong to the other choices they were tried with).
                held = [it for it in pool if it.key not in tried and _avoided(it, plan)]
                if held:
                    best_held = ctx.ranked(held)[:4]
                    picks += [(it, "re-test of an avoided choice") for it, _ in best_held]
            picks += [(it, "exploration") for it in self._explore(rest, 4 * n, rng)]
        else:
            picks += [(it, "spread of the space") for it in self._spread(untried, n * 2, rng)]
        model_cap = max(1, round(n * 0.75))

        def admit(pick, taken) -> bool:
            # The model's picks at most three quarters of the slots, and two at most of one
            # layout: its favourites cluster (four variants of one layout at LayerNorm
            # 16384x4999, all within 1% of each other's time and 48% slower than the best).
            if pick[1] != "cost model's pick":
                return True
            model = [p for p in taken if p[1] == "cost model's pick"]
            same = [p for p in model if _layout(ctx, p[0]) == _layout(ctx, pick[0])]
            return len(model) < model_cap and (_layout(ctx, pick[0]) is None or len(same) < 2)

        got = _take_screened(
            ctx,
            picks,
            n,
            tried,
            tried_ptx,
            lambda p: ctx.draft(p[0], role="writer", note=f"{p[1]}: {_describe(p[0])}"),
            admit,
        )
        return [d for _, d in got]

    def _explore(self, rest: list[tuple[Item, float]], k: int, rng: random.Random) -> list[Item]:
        """k exploration picks from `rest` (untried (item, predicted us), fastest first): a
        spread of the points the model puts within `explore_band` of its fastest prediction, or
        of its k fastest where the band holds fewer. Drawn at random from the whole rest, the 17
        timed explorations of eight recorded jobs (LayerNorm, RMSNorm, add+RMSNorm,
        cross-entropy; H100 and H200) took 1.13-7.2x their job's best time (839 us at LayerNorm
        16384x4999, best 117): none came within 13% of it.
        (k is four times the slots: the screen passes over what the reviewer would reject, and
        at LayerNorm 16384x4999 the model's first picks spilled, so that n explorations left
        slots to the drafts passed over; only what is needed is drafted.)"""
        if not rest:
            return []
        fastest = min(us for _, us in rest)
        band = [it for it, us in rest if us <= self.explore_band * fastest]
        if len(band) < k:
            band = [it for it, _ in rest[:k]]
        if len(band) > 512:  # (the spread's cost grows with its pool)
            band = rng.sample(band, 512)
        return self._spread(band, k, rng)

    @staticmethod
    def _edit_seeds(ctx: Context) -> list[Item]:
        from factory.agents.ptxedit import PtxEdit

        singles = [
            PtxEdit(ld_cache="nc"),
            PtxEdit(ld_cache="nc", st_cache="cs"),
            PtxEdit(block=256),
            PtxEdit(maxnreg=64),
        ]
        keys = {ev.schedule_key(e.to_schedule()) for e in singles}
        return [it for it in ctx.edit_items if it.key in keys]

    @staticmethod
    def _spread(items: list[Item], k: int, rng: random.Random) -> list[Item]:
        """Farthest-point sampling by field (Hamming) distance: a spread of the space."""
        if not items:
            return []
        pool = list(items)
        rng.shuffle(pool)
        chosen = [pool.pop()]
        if not pool or k <= 1:
            return chosen
        # _distance over the whole pool at once: each item's values as integer codes
        codes, lengths, kinds = _value_codes(pool + chosen)
        last = len(pool)  # the row of chosen[0]
        alive = np.ones(len(pool), dtype=bool)
        nearest = np.full(len(pool), 99, dtype=np.int64)
        while alive.any() and len(chosen) < k:
            nearest = np.minimum(nearest, _distances(codes, lengths, kinds, last)[: len(pool)])
            i = int(np.argmax(np.where(alive, nearest, -1)))  # the first of the farthest
            alive[i] = False
            chosen.append(pool[i])
            last = i
        return chosen


def _neighbours(ctx: Context, item: Item) -> list[Item]:
    """Space items that differ from `item` in one field by one step of that field's sorted
    values (every neighbour is valid: it is taken from the space)."""
    kind_items = [it for it in ctx.items if it.kind == item.kind]
    by_key = {it.key: it for it in kind_items}
    out = []
    for fname, vals in _space_field_values(ctx, item.kind).items():
        cur = getattr(item.value, fname)
        if cur not in vals:
            continue
        i = vals.index(cur)
        for j in (i - 1, i + 1):
            if 0 <= j < len(vals):
                child = dataclasses.replace(item.value, **{fname: vals[j]})
                it = by_key.get(Item(item.kind, child).key)
                if it is not None:
                    out.append(it)
    if not out:
        # `item` is outside the space (a default the space filters out, say): its nearest
        # points instead, one or two fields away
        near = sorted(kind_items, key=lambda it: _distance(it, item))
        out = [it for it in near[:24] if 0 < _distance(it, item) <= 2]
    return out


def _distance(a: Item, b: Item) -> int:
    if a.kind != b.kind or len(a.values) != len(b.values):
        return 99
    return sum(x != y for x, y in zip(a.values, b.values, strict=True))


def _value_codes(items: list[Item]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items' values as a matrix of integer codes (equal values, by ==, share a code; missing
    places -1), with each item's number of values and a code for its kind: what _distances
    needs to compute _distance of every item to one."""
    width = max(len(it.values) for it in items)
    table: dict = {}
    kind_codes: dict = {}
    codes = np.full((len(items), width), -1, dtype=np.int32)
    for row, it in enumerate(items):
        codes[row, : len(it.values)] = [table.setdefault(v, len(table)) for v in it.values]
    lengths = np.array([len(it.values) for it in items], dtype=np.int32)
    kinds = np.array([kind_codes.setdefault(it.kind, len(kind_codes)) for it in items])
    return codes, lengths, kinds


def _distances(codes: np.ndarray, lengths: np.ndarray, kinds: np.ndarray, row: int) -> np.ndarray:
    """_distance from every item to item `row`, as _value_codes encoded them."""
    differ = (codes != codes[row]).sum(axis=1)
    same = (lengths == lengths[row]) & (kinds == kinds[row])
    return np.where(same, differ, 99)


class OfflineTuner:
    """Mutates and recombines the best measured candidates (see module doc)."""

    def tune(self, ctx: Context, plan: Plan, n: int, taken: set[str]) -> list[CandidateDraft]:
        if n <= 0:
            return []
        parents = [r for r in ctx.best_records(4) if ctx.item_for(r.get("schedule"))]
        if not parents:
            return []
        tried = ctx.tried_keys() | taken
        tried_ptx = ctx.tried_ptx()
        space_keys = {it.key: it for it in ctx.items}
        children: list[tuple[Item, str, str]] = []
        for rank, rec in enumerate(parents):
            p = ctx.item_for(rec["schedule"])
            values = _space_field_values(ctx, p.kind)
            for fname, vals in values.items():
                cur = getattr(p.value, fname)
                if cur not in vals:
                    continue
                i = vals.index(cur)
                for j in (i - 1, i + 1):
                    if 0 <= j < len(vals):
                        child = dataclasses.replace(p.value, **{fname: vals[j]})
                        it = space_keys.get(Item(p.kind, child).key)
                        if it is not None:
                            children.append(
                                (
                                    it,
                                    f"mutant of #{rank + 1}: {fname}={vals[j]!r}",
                                    rec["ptx_sha256"],
                                )
                            )
            for change, why in _reshapes(ctx, p.value):
                it = space_keys.get(Item(p.kind, dataclasses.replace(p.value, **change)).key)
                if it is not None:
                    children.append((it, f"reshape of #{rank + 1}: {why}", rec["ptx_sha256"]))
        if len(parents) >= 2:
            a, b = (ctx.item_for(parents[0]["schedule"]), ctx.item_for(parents[1]["schedule"]))
            if a.kind == b.kind:
                diff = [
                    f.name
                    for f in dataclasses.fields(a.value)
                    if getattr(a.value, f.name) != getattr(b.value, f.name)
                ][:8]
                for mask in itertools.product((0, 1), repeat=len(diff)):
                    change = {f: getattr(b.value, f) for f, m in zip(diff, mask, strict=True) if m}
                    if not change or len(change) == len(diff):
                        continue
                    it = space_keys.get(Item(a.kind, dataclasses.replace(a.value, **change)).key)
                    if it is not None:
                        children.append(
                            (
                                it,
                                f"cross of #1 and #2: {sorted(change)} from #2",
                                parents[0]["ptx_sha256"],
                            )
                        )
        children = [c for c in children if c[0].key not in tried and not _avoided(c[0], plan)]
        children.sort(key=lambda c: ctx.predict_us(c[0]))

        def make(c):  # (the parent also on a draft turned away: it may still go out)
            d = ctx.draft(c[0], role="tuner", note=c[1])
            return dataclasses.replace(d, parent_ptx_sha256=c[2]) if d is not None else None

        got = _take_screened(ctx, children, n, tried, tried_ptx, make)
        return [dataclasses.replace(d, parent_ptx_sha256=c[2]) for c, d in got]


def _take_screened(ctx: Context, picks: list, n: int, tried, tried_ptx, make, admit=None):
    """Up to n (pick, draft) from `picks` (tuples whose first element is the Item), in order:
    each untried pick drafted by make(pick) and screened by `Context.screened` in batches of
    what is still needed (compiled side by side), so that a pick the compile checks would reject
    gives its slot to the next one instead of costing the generation a candidate (a third
    generation at LayerNorm 16384x4999 once sent eight kernels that all spilled). `admit(pick,
    the picks taken or being judged)` may hold a pick back before it is drafted: it is asked
    again for the next batch, since the picks judged may be turned away. The drafts passed over
    are kept in `ctx.passed_over` (see propose_offline)."""
    out: list[tuple] = []
    seen: set[str] = set()
    queue = list(picks)
    while len(out) < n:
        batch: list[tuple] = []
        waiting: list = []  # (in order) for the next batch
        for pick in queue:
            if len(batch) >= n - len(out):
                waiting.append(pick)
                continue
            it = pick[0]
            if it.key in tried or it.key in seen:
                continue
            if admit is not None and not admit(pick, [p for p, _ in out + batch]):
                # (not now: the picks it waits on may yet be turned away)
                waiting.append(pick)
                continue
            seen.add(it.key)
            d = make(pick)
            if d is None or d.ptx_sha256 in tried_ptx:
                continue
            tried_ptx.add(d.ptx_sha256)
            batch.append((pick, d))
        queue = waiting
        if not batch:
            break
        verdicts = ctx.screened([(p[0], d) for p, d in batch], exclude=tried | seen)
        for (pick, d), got in zip(batch, verdicts, strict=True):
            if got is None:
                ctx.passed_over.append(d)
                continue
            it, d = got
            if it is not pick[0]:  # recapped: another point of the space
                seen.add(it.key)
                tried_ptx.add(d.ptx_sha256)
                pick = (it, *pick[1:])
            out.append((pick, d))
    return out


def _layout(ctx: Context, item: Item) -> tuple | None:
    """How a generator schedule lays out the work (the family's `layout_fields`), without the
    hints and options that vary within it; None for other items."""
    fields = ctx.generator.layout_fields if ctx.generator is not None else ()
    s = item.schedule
    return tuple(s.get(f) for f in fields) if item.kind == "generator" and fields else None


def _reshapes(ctx: Context, value) -> list[tuple[dict, str]]:
    """The family's multi-field moves from `value` (each a change and why), [] without any."""
    return list(ctx.generator.moves(value)) if ctx.generator is not None else []


def _avoided(item: Item, plan: Plan) -> bool:
    s = item.schedule
    return any(s.get(f) in vals for f, vals in plan.avoid.items())


def _describe(item: Item) -> str:
    if item.kind == "edit":
        return item.value.describe()
    return ", ".join(f"{k}={v}" for k, v in item.schedule.items())


def propose_offline(ctx: Context) -> tuple[list[CandidateDraft], Plan]:
    plan = OfflinePlanner().plan(ctx)
    taken: set[str] = set()
    drafts = OfflineTuner().tune(ctx, plan, plan.n_tuner, taken)
    taken |= {ev.schedule_key(d.schedule) for d in drafts}
    writer = OfflineWriter(explore_fraction=float(ctx.settings.get("explore_fraction", 0.25)))
    drafts += writer.write(ctx, plan, ctx.population - len(drafts), taken)
    # Slots that no clean pick filled go to the picks passed over: the reviewer rejects them
    # with their reasons, which the job shows and records (so they are not proposed again),
    # rather than the generation going out short or empty (a customer kernel whose every edit
    # spills).
    have = {d.ptx_sha256 for d in drafts}
    for d in ctx.passed_over:  # (the writer may have turned away one the tuner did too)
        if len(drafts) < ctx.population and d.ptx_sha256 not in have:
            have.add(d.ptx_sha256)
            drafts.append(d)
    c = ctx.screen_counts
    if c["skipped"] or c["recapped"]:
        plan.notes.append(
            f"the reviewer's checks, compiled on the CPU: {c['skipped']} picks passed over, "
            f"{c['recapped']} given a register cap that passes"
        )
    return drafts[: ctx.population], plan
