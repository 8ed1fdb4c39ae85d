"""Kernels a model may read and edit, each under a short handle.

- `default`: the generator's kernel for the job's default schedule;
- `seed1`..: the family's screened starting layouts for the job's shapes;
- `best1`..: this job's fastest verified candidates (generator kernels re-emitted from their
  schedule, model-written ones from the PTX their evidence records keep);
- `cand-<sha8>`: this job's other model-written kernels of earlier generations (failed ones
  too, with their reason);
- `past1`..: the fastest model-written kernels of earlier jobs of the same operator on this GPU,
  where the evidence store hands their PTX over (the local driver's JSON-lines store does; the
  portal's keeps PTX within a job, since evidence crosses organisations only as schedules and
  numbers);
- `customer`: the customer's kernel, when the job has one.

A kernel appears once, under its first handle. Generator kernels are emitted when the list is
built (the context keeps them, so the offline backend does not emit them again).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from factory import evidence as ev
from factory import families
from factory.agents.context import Context, default_item, seed_items
from factory.agents.types import launch_from_dict, params_from_list, ptx_sha256

MAX_SEEDS = 4
MAX_BEST = 5
MAX_CANDIDATES = 8
MAX_PAST = 3


@dataclass(frozen=True)
class Kernel:
    handle: str
    kind: str  # default | seed | best | candidate | past | customer
    ptx: str
    entry: str
    params: tuple
    launch: object
    schedule: dict | None
    about: str  # one line for the model: the layout, the measured time, the note
    sha: str = ""

    @property
    def lines(self) -> int:
        return self.ptx.count("\n") + 1

    def listing(self) -> dict:
        return {
            "handle": self.handle,
            "kind": self.kind,
            "about": self.about,
            "chars": len(self.ptx),
            "lines": self.lines,
            "ptx_sha256": self.sha[:12],
        }


class Kernels:
    """The handles of one generation's kernels (built once, on first use)."""

    def __init__(self, ctx: Context, ptx_by_sha: dict[str, str] | None = None):
        self.ctx = ctx
        self.ptx_by_sha = dict(ptx_by_sha or {})
        self._by_handle: dict[str, Kernel] | None = None

    # --- building ------------------------------------------------------------------------------

    def _build(self) -> dict[str, Kernel]:
        ctx = self.ctx
        out: dict[str, Kernel] = {}
        seen: set[str] = set()
        # model-written kernels as evidence keeps them: sha -> the record holding the PTX
        kept: dict[str, dict] = {}
        for r in (*ctx.past_records, *ctx.job_records):
            if r.get("ptx") and r.get("ptx_sha256"):
                kept[r["ptx_sha256"]] = r
        us_of = {sha: us for sha, (us, _) in ctx.objective_by_ptx().items()}

        def add(handle: str, kind: str, make: Callable[[], Kernel | None]) -> None:
            try:
                k = make()
            except Exception as exc:  # noqa: BLE001 - a kernel that cannot be built is not listed
                ctx.settings.setdefault("_emit_errors", []).append(f"{handle}: {exc}")
                return
            if k is None:
                return
            if k.sha in seen:  # the same kernel under an earlier handle: say so there
                first = next(h for h, o in out.items() if o.sha == k.sha)
                out[first] = replace(out[first], about=f"{out[first].about} (also {handle})")
                return
            seen.add(k.sha)
            out[handle] = k

        def generator(handle, kind, item, extra=""):
            def make():
                d = ctx.draft(item, role="tuner", note="") if item is not None else None
                if d is None:
                    return None
                about = families.label(d.schedule) or "generator kernel"
                if d.ptx_sha256 in us_of:
                    about += f"; measured {us_of[d.ptx_sha256]:.2f} us over the job's shapes"
                return Kernel(
                    handle,
                    kind,
                    d.ptx,
                    d.entry,
                    tuple(d.params),
                    d.launch,
                    dict(d.schedule) if d.schedule else None,
                    about + extra,
                    d.ptx_sha256,
                )

            add(handle, kind, make)

        def from_record(handle, kind, rec, ptx, extra=""):
            def make():
                meta = kept.get(rec.get("ptx_sha256")) or rec
                base = ctx.workload.baseline
                params = (
                    params_from_list(meta["params"])
                    if meta.get("params")
                    else (tuple(base.params) if base is not None else ())
                )
                launch = (
                    launch_from_dict(meta["launch"])
                    if meta.get("launch")
                    else (base.launch if base is not None else None)
                )
                if launch is None:
                    return None
                entry = meta.get("entry") or _entry(ptx) or ""
                note = (meta.get("lineage") or {}).get("tool") or rec.get("backend") or ""
                about = f"{rec.get('backend', '?')} kernel ({rec.get('role', '?')}"
                about += f", {note})" if note else ")"
                sched = rec.get("schedule")
                if sched:
                    about += f", layout {families.label(sched)}"
                return Kernel(
                    handle, kind, ptx, entry, params, launch, sched, about + extra, ptx_sha256(ptx)
                )

            add(handle, kind, make)

        generator("default", "default", default_item(ctx))
        for i, it in enumerate(seed_items(ctx)[:MAX_SEEDS], 1):
            generator(f"seed{i}", "seed", it)
        for i, rec in enumerate(ctx.best_records(MAX_BEST), 1):
            sha = rec["ptx_sha256"]
            extra = f"; best #{i} of this job"
            ptx = self.ptx_by_sha.get(sha) or (kept.get(sha) or {}).get("ptx")
            if ptx is None:
                generator(f"best{i}", "best", ctx.item_for(rec.get("schedule")), extra)
            else:
                us = us_of.get(sha)
                timing = f"; measured {us:.2f} us over the job's shapes" if us else ""
                from_record(f"best{i}", "best", rec, ptx, timing + extra)
        mine = [r for r in ctx.job_records if r.get("ptx") and r.get("ptx_sha256") not in seen]
        mine.sort(key=lambda r: r.get("generation") or 0, reverse=True)
        for rec in mine:
            if sum(1 for k in out.values() if k.kind == "candidate") >= MAX_CANDIDATES:
                break
            status = rec.get("status") or "?"
            why = f": {str(rec.get('reason'))[:120]}" if rec.get("reason") else ""
            extra = f"; generation {rec.get('generation')}, {status}{why}"
            from_record(f"cand-{rec['ptx_sha256'][:8]}", "candidate", rec, rec["ptx"], extra)
        past = [
            r
            for r in ev.passed(ctx.past_records)
            if r.get("ptx") and r.get("signature") == ctx.signature and r.get("gpu") == ctx.gpu
        ]
        past.sort(key=lambda r: float(r["median_us"]))
        n = 0
        for rec in past:
            if n >= MAX_PAST or rec["ptx_sha256"] in seen:
                continue
            n += 1
            extra = (
                f"; {float(rec['median_us']):.2f} us at {rec.get('dims')} in job {rec.get('job')}"
            )
            from_record(f"past{n}", "past", rec, rec["ptx"], extra)
        base = ctx.workload.baseline
        if base is not None:
            out_sha = ptx_sha256(base.ptx)
            if out_sha not in seen:
                out["customer"] = Kernel(
                    "customer",
                    "customer",
                    base.ptx,
                    base.entry,
                    tuple(base.params),
                    base.launch,
                    None,
                    "the customer's kernel (the baseline to beat)",
                    out_sha,
                )
        return out

    # --- reading -------------------------------------------------------------------------------

    @property
    def by_handle(self) -> dict[str, Kernel]:
        if self._by_handle is None:
            self._by_handle = self._build()
        return self._by_handle

    def get(self, handle: str) -> Kernel:
        k = self.by_handle.get(str(handle).strip())
        if k is None:
            known = ", ".join(self.by_handle) or "none"
            raise KeyError(f"no kernel with handle {handle!r}; the handles are: {known}")
        return k

    def handle_of(self, sha: str) -> str | None:
        return next((h for h, k in self.by_handle.items() if k.sha == sha), None)

    def listing(self) -> list[dict]:
        return [k.listing() for k in self.by_handle.values()]


def _entry(ptx: str) -> str | None:
    from factory.agents.kernel_edits import entry_of

    return entry_of(ptx)


__all__ = ["Kernel", "Kernels"]
