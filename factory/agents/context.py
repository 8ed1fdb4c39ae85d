"""What every role sees for one generation of one job: the workload, its search spaces (the
generator's schedules and/or edits of the customer's kernel), this job's history and the
evidence of other jobs, the lessons distilled from it, and the cost model fitted on it."""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from factory import evidence as ev
from factory import families
from factory.agents.ptxedit import PtxEdit, apply_edit, edit_space
from factory.agents.review import review
from factory.agents.types import CandidateDraft, ptx_sha256
from factory.costmodel import CostModel
from factory.families import Family


def schedule_dict(schedule) -> dict:
    if hasattr(schedule, "to_dict"):
        return schedule.to_dict()
    return dataclasses.asdict(schedule) if dataclasses.is_dataclass(schedule) else dict(schedule)


def workload_bytes(workload, dims: dict[str, int]) -> float:
    """Fewest bytes the operator must move: every input read once, every output written once."""
    return families.io_bytes(workload, dims)


@dataclass
class Item:
    """One point of a search space: a generator schedule or an edit of the customer's kernel."""

    kind: str  # "generator" | "edit"
    value: Any  # the frozen dataclass
    schedule: dict = field(init=False, repr=False)
    key: str = field(init=False, repr=False)
    # every field's value, in the dataclass's order (defaults included, unlike `schedule`), so
    # that two items of a kind compare field by field (offline._distance)
    values: tuple = field(init=False, repr=False)

    def __post_init__(self):
        self.schedule, self.key, self.values = _describe(self.kind, self.value)


# What Item keeps of a frozen space point, kept while the point lives: every generation of a job
# makes Items of the same space again (a family keeps its last few spaces), and
# describing 100k points took seconds. Shared: neither the dict nor the tuple is changed after.
_DESCRIBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _describe(kind: str, value) -> tuple[dict, str, tuple]:
    try:
        hit = _DESCRIBED.get(value)
    except TypeError:  # unhashable or no weak references: described every time
        hit = None
    if hit is not None and hit[0] == kind:
        return hit[1]
    schedule = value.to_schedule() if kind == "edit" else schedule_dict(value)
    if dataclasses.is_dataclass(value):
        values = tuple(getattr(value, f.name) for f in dataclasses.fields(value))
    else:
        values = tuple(schedule.values())
    described = (schedule, ev.schedule_key(schedule), values)
    try:
        _DESCRIBED[value] = (kind, described)
    except TypeError:
        pass
    return described


@dataclass
class Context:
    workload: Any
    generation: int
    population: int
    seed: int
    settings: dict
    family: str
    signature: str
    dtype: str
    gpu: str
    dims_list: list[dict[str, int]]
    job_records: list[dict]
    past_records: list[dict]
    generator: Family | None = None  # the job's operator family (factory.families)
    # the shapes the worker also verifies at (the manifest's held-out shapes): a kernel that
    # cannot serve one of them is refused there, so the space holds none
    heldout_list: list[dict[str, int]] = field(default_factory=list)
    ir: Any = None
    unsupported: str = ""
    gen_items: list[Item] = field(default_factory=list)
    edit_items: list[Item] = field(default_factory=list)
    model: CostModel | None = None
    lessons: ev.Lessons | None = None
    _emitted: dict[str, CandidateDraft | None] = field(default_factory=dict)
    _by_key: dict[str, Item] = field(default_factory=dict)
    _by_key_of: int = -1  # how many items _by_key was built from (keys may repeat)
    _kind_values: dict = field(default_factory=dict)  # see offline._space_field_values
    # what `screened` did this generation: picks kept off the GPU, and picks given another cap
    screen_counts: dict = field(default_factory=lambda: {"skipped": 0, "recapped": 0})
    passed_over: list = field(default_factory=list)  # the drafts `screened` turned away

    # --- the spaces ---------------------------------------------------------------------------

    @property
    def items(self) -> list[Item]:
        return self.gen_items + self.edit_items

    def item_for(self, schedule: dict | None) -> Item | None:
        """The space item whose schedule dict equals `schedule` (from evidence)."""
        if schedule is None:
            return None
        items = self.items
        if self._by_key_of != len(items):
            # Two items whose schedules differ only in a fitted field share a key, and the
            # last stands for both: counted by items, not keys, so that such a space is
            # indexed once and not at every call.
            self._by_key = {it.key: it for it in items}
            self._by_key_of = len(items)
        found = self._by_key.get(ev.schedule_key(schedule))
        if found is None and schedule.get("tail") == "shifted":
            # a shifted row from a shape whose rows were misaligned: at this job's shapes it
            # may have no twin, and its layout is the one fitted here
            found = self._by_key.get(ev.schedule_key(ev.untailed(schedule)))
        return found

    def tried_keys(self) -> set[str]:
        return {ev.schedule_key(r.get("schedule")) for r in self.job_records if r.get("schedule")}

    def tried_ptx(self) -> set[str]:
        return {r.get("ptx_sha256") for r in self.job_records}

    # --- measured ------------------------------------------------------------------------------

    def objective_by_ptx(self) -> dict[str, tuple[float, dict]]:
        """This job's passed candidates: ptx_sha256 -> (sum of median_us over the job's shapes,
        a representative record). Candidates missing a shape are left out."""
        need = {ev.schedule_key(d) for d in self.dims_list}
        per: dict[str, dict[str, float]] = {}
        rep: dict[str, dict] = {}
        for r in ev.passed(self.job_records):
            per.setdefault(r["ptx_sha256"], {})[ev.schedule_key(r.get("dims"))] = float(
                r["median_us"]
            )
            rep[r["ptx_sha256"]] = r
        return {sha: (sum(t.values()), rep[sha]) for sha, t in per.items() if need <= set(t)}

    def best_records(self, k: int) -> list[dict]:
        ranked = sorted(self.objective_by_ptx().values(), key=lambda x: x[0])
        return [r for _, r in ranked[:k]]

    # --- prediction ----------------------------------------------------------------------------

    def _roof(self, dims: dict) -> tuple[float, float]:
        """(bytes, flops) of one call at `dims`: the family's roofline."""
        if self.generator is None:
            return workload_bytes(self.workload, dims), 0.0
        r = self.generator.roofline_of(self.workload, dims)
        return r.bytes, r.flops

    def predict_us(self, item: Item) -> float:
        """Cost-model time summed over the job's shapes (the roofline prior when unfitted)."""
        model = self.model or CostModel()
        return sum(model.predict_us(item.schedule, d, *self._roof(d)) for d in self.dims_list)

    def ranked(self, items: list[Item]) -> list[tuple[Item, float]]:
        """`items` with their predict_us, fastest first (computed together: see
        CostModel.predict_many)."""
        model = self.model or CostModel()
        total = [0.0] * len(items)
        scheds = [it.schedule for it in items]
        for d in self.dims_list:
            us = model.predict_many(scheds, d, *self._roof(d))
            total = [a + b for a, b in zip(total, us, strict=True)]
        order = sorted(range(len(items)), key=total.__getitem__)
        return [(items[i], total[i]) for i in order]

    def _fitted_prediction(self, item: Item) -> float | None:
        """What a draft records as the model's prediction: None until the model is fitted (the
        roofline prior alone ranks every layout of a shape the same, which says nothing)."""
        return self.predict_us(item) if self.model is not None and self.model.fitted else None

    # --- drafting ------------------------------------------------------------------------------

    def draft(self, item: Item, *, role: str, note: str, backend: str = "offline"):
        """Emit (or edit) the item into a CandidateDraft; None when it cannot be built."""
        if item.key in self._emitted and self._emitted[item.key] is None:
            return None
        if item.kind == "generator":
            try:
                em = self.generator.emit(self.ir, item.value)
            except Exception as exc:  # noqa: BLE001 - a schedule the emitter refuses is skipped
                self._emitted[item.key] = None
                self.settings.setdefault("_emit_errors", []).append(f"{item.key}: {exc}")
                return None
            d = CandidateDraft(
                ptx=em.ptx,
                entry=em.entry,
                params=tuple(em.params),
                launch=em.launch,
                schedule=dict(item.schedule),
                parent_ptx_sha256=None,
                role=role,
                backend=backend,
                note=note,
                predicted_us=self._fitted_prediction(item),
            )
        else:
            base = self.workload.baseline
            inputs = {t.name for t in self.workload.inputs}
            done = apply_edit(base.ptx, tuple(base.params), base.launch, item.value, inputs)
            if done is None:
                self._emitted[item.key] = None
                return None
            ptx, launch, why = done
            d = CandidateDraft(
                ptx=ptx,
                entry=base.entry,
                params=tuple(base.params),
                launch=launch,
                schedule=dict(item.schedule),
                parent_ptx_sha256=ptx_sha256(base.ptx),
                role=role,
                backend=backend,
                note=f"{note}: {why}",
                predicted_us=self._fitted_prediction(item),
            )
        self._emitted[item.key] = d
        return d

    def screened(
        self, pending: list[tuple[Item, CandidateDraft]], exclude: set[str] = frozenset()
    ) -> list[tuple | None]:
        """The drafts judged by the reviewer (factory.agents.review: spills, stack, the register
        file, warps per SM, ...) on their compile reports, all compiled side by side on the CPU,
        before they take a slot of the generation: each (item, draft) as it is, or for a
        generator layout turned away for its registers, the same layout under another register
        cap (the family's `recap`) where the reviewer passes that and its key is not in
        `exclude`; None where neither passes. Kept as they are without a compiler (a fake
        generator in tests)."""
        gen = self.generator
        if gen is None or gen.reports is None or not pending:
            return list(pending)
        reports = gen.reports([d.ptx for _, d in pending])
        out: list[tuple | None] = []
        for (it, d), rep in zip(pending, reports, strict=True):
            ok, reason = review(d, rep)
            if ok:
                out.append((it, d))
                continue
            other = None
            if it.kind == "generator" and gen.recap is not None and rep.ok:
                s = gen.recap(self.ir, it.value)
                other = self.item_for(schedule_dict(s)) if s is not None else None
            if other is not None and other.key in exclude:
                other = None
            d2 = self.draft(other, role=d.role, note=d.note, backend=d.backend) if other else None
            if d2 is not None and review(d2, gen.reports([d2.ptx])[0])[0]:
                # (recap compiled it: its compile is cached)
                self.screen_counts["recapped"] += 1
                cap = other.schedule.get("min_threads_per_sm")
                now = f"capped for {cap} threads" if cap else "uncapped"
                note = f"{d.note}; {now}, since it gave {reason}"
                out.append((other, dataclasses.replace(d2, note=note)))
            else:
                self.screen_counts["skipped"] += 1
                out.append(None)
        return out


def _valid(verdict) -> bool:
    """is_valid may answer a bool or (bool, reason)."""
    return bool(verdict[0]) if isinstance(verdict, tuple) else bool(verdict)


def build_context(
    workload,
    *,
    generation: int,
    population: int,
    evidence: list[dict],
    seed: int,
    settings: dict,
) -> Context:
    settings = settings if settings is not None else {}
    family = ev.family_of(workload)
    gpu = getattr(workload, "target", "sm_90") or "sm_90"
    dtype = ev.dtype_of(workload)
    job = settings.get("job")
    if job is not None:
        job_records = [r for r in evidence if r.get("job") == job]
    else:
        job_records = [r for r in evidence if r.get("workload_sha256") == workload.sha256]
    job_ids = {r.get("job") for r in job_records}
    past = [r for r in evidence if r.get("job") not in job_ids]
    ctx = Context(
        workload=workload,
        generation=generation,
        population=population,
        seed=seed,
        settings=settings,
        family=family,
        signature=ev.signature_of(workload),
        dtype=dtype,
        gpu=gpu,
        dims_list=[dict(d) for d in workload.shapes],
        heldout_list=[dict(d) for d in getattr(workload, "heldout_shapes", ()) or ()],
        job_records=job_records,
        past_records=past,
    )
    gen = settings.get("generator", "auto")
    if gen == "auto":
        try:
            ctx.generator, ctx.ir = families.family_for(workload)
        except families.Unsupported as exc:
            ctx.generator = families.get("row")  # its space stays empty: edits alone
            ctx.unsupported = f"Unsupported: {exc}"
    else:
        ctx.generator = gen
    if ctx.generator is not None and not settings.get("no_generator") and not ctx.unsupported:
        try:
            if ctx.ir is None:
                ctx.ir = ctx.generator.lower(workload)
            sched = admissible_space(ctx.generator, ctx.ir, ctx.dims_list, ctx.heldout_list)
            only = settings.get("space_filter")
            if only is not None:
                # a replay whose space is a measured sample: the job's space is that sample
                sched = [s for s in sched if only(schedule_dict(s))]
            ctx.gen_items = [Item("generator", s) for s in sched]
        except Exception as exc:  # noqa: BLE001 - Unsupported (or a generator bug) -> no space
            ctx.unsupported = f"{type(exc).__name__}: {exc}"
            ctx.ir = None
    elif ctx.generator is None:
        ctx.unsupported = "the generator is not available"
    if workload.baseline is not None:
        ctx.edit_items = [Item("edit", e) for e in edit_space()]
    similar = [r for r in evidence if r.get("family") == family and r.get("gpu") == gpu]
    # the same operator's evidence teaches the model most; the family's when that is too little
    same_op = [r for r in similar if r.get("signature") == ctx.signature]
    order = list(workload.shapes[0]) if workload.shapes else []
    kind = ctx.generator.name if ctx.generator is not None else "row"
    if kind not in families.names():
        kind = "row"  # a stand-in family in tests: the row family's features
    ctx.model = CostModel(dim_order=order, family=kind).fit(same_op)
    if not ctx.model.fitted:
        ctx.model = CostModel(dim_order=order, family=kind).fit(similar)
    ctx.lessons = ev.distil_lessons(evidence, family=family, gpu=gpu, dims=ctx.dims_list[0])
    return ctx


def default_item(ctx: Context) -> Item | None:
    """The generator's default schedule for the job, as a space item (if it has one)."""
    if ctx.generator is None or ctx.ir is None or ctx.generator.default_schedule is None:
        return None
    for args in ((ctx.ir, ctx.dims_list), (ctx.ir, ctx.dims_list[0]), (ctx.ir,)):
        try:
            s = ctx.generator.default_schedule(*args)
        except TypeError:
            continue
        except Exception:  # noqa: BLE001
            return None
        if ctx.heldout_list and not _serves_heldout(ctx, s):
            # the default of the job's shapes alone (a matmul's output stored by TMA, say) cannot
            # run at a held-out shape: the default of every shape the worker verifies at
            try:
                s = ctx.generator.default_schedule(ctx.ir, ctx.dims_list + ctx.heldout_list)
            except Exception:  # noqa: BLE001
                return None
            if not _serves_heldout(ctx, s):
                return None
        found = ctx.item_for(schedule_dict(s))
        if found is None and ctx.settings.get("space_filter") is not None:
            return None  # the default is outside the (filtered) space
        return found or Item("generator", s)
    return None


def _fits_fn(generator):
    """The generator's predicate "this schedule runs at every one of these shapes"."""
    return generator.fits or (
        lambda ir, sch, dl: all(_valid(generator.is_valid(ir, sch, d)) for d in dl)
    )


def admissible_space(generator, ir, dims_list, heldout_list=()) -> list:
    """The schedules a job may run: the generator's space at the job's shapes, each valid there
    and at every held-out shape the worker verifies at (a kernel that cannot run at a held-out
    shape cannot ship). The search replay (lab/search/replay.py) keeps to the same set."""
    fits = _fits_fn(generator)
    sched = generator.space(ir, dims_list)
    if not generator.space_fits:
        sched = [s for s in sched if fits(ir, s, dims_list)]
    if heldout_list:
        sched = [s for s in sched if fits(ir, s, heldout_list)]
    return sched


def _serves_heldout(ctx: Context, s) -> bool:
    try:
        return bool(_fits_fn(ctx.generator)(ctx.ir, s, ctx.heldout_list))
    except Exception:  # noqa: BLE001 - a predicate that fails serves nothing
        return False


def seed_items(ctx: Context) -> list[Item]:
    """The family's screened starting layouts (its `seeds`) at the job's first two shapes,
    as space items (valid at every shape of the job), best first, each once. Empty where the
    generator has none or fails (a job then starts from the default and a spread)."""
    if ctx.generator is None or ctx.ir is None or ctx.generator.seeds is None:
        return []
    out: list[Item] = []
    for dims in ctx.dims_list[:2]:
        try:
            seeds = ctx.generator.seeds(ctx.ir, dims)
        except Exception:  # noqa: BLE001 - a screen that fails costs the seeds, not the job
            return out
        for s in seeds:
            it = ctx.item_for(schedule_dict(s))
            if it is not None and it not in out:
                out.append(it)
    return out


def log2_distance(a: float, b: float) -> float:
    return abs(math.log2(max(a, 1e-9)) - math.log2(max(b, 1e-9)))


__all__ = [
    "Context",
    "Item",
    "PtxEdit",
    "build_context",
    "default_item",
    "seed_items",
]
