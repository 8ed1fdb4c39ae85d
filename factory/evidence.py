"""Evidence memory: every candidate and result, across jobs, as plain dicts.

A record is the dict the portal builds from its database (docs/CONTRACTS.md, issue 6):

    {"job", "workload_sha256", "family", "signature", "dims", "dtype", "gpu", "schedule",
     "ptx_sha256", "status", "reason", "median_us", "tbps", "generation", "role", "backend"}

A kernel a model wrote also carries "ptx", "entry", "params", "launch", "parent_ptx_sha256",
"lineage", "model" and "usage" (CandidateDraft.evidence_fields), so later generations and jobs
can read it back by handle (factory.agents.handles) and sum its tokens (factory.agents.usage).

The portal keeps its own database-backed store returning the same dicts; `JsonlEvidenceStore`
is the in-process one (memory, optionally appended to a JSON-lines file) used by the local
driver, the benchmark runs and the tests.

Besides storage this module answers three questions the agents ask:
- which past records are about a *similar* problem (`similar`: same family and dtype and GPU,
  shape close in log2),
- which past winners should seed a new job (`warm_start_schedules`),
- what the evidence teaches (`distil_lessons`): which schedule choices win per family, shape
  class and GPU, and which failed and why, as text for prompts and as data for the planner.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from factory import families
from factory.agents import ptxedit

RECORD_KEYS = (
    "job",
    "workload_sha256",
    "family",
    "signature",
    "dims",
    "dtype",
    "gpu",
    "schedule",
    "ptx_sha256",
    "status",
    "reason",
    "median_us",
    "tbps",
    "generation",
    "role",
    "backend",
)


# --- describing a workload -------------------------------------------------------------------


def family_of(workload) -> str:
    """The operator family: a `family:<name>` tag if the manifest has one, else the name."""
    for tag in getattr(workload, "tags", ()) or ():
        if isinstance(tag, str) and tag.startswith("family:"):
            return tag.split(":", 1)[1].strip().lower()
    return str(getattr(workload, "name", "unknown")).strip().lower()


def signature_of(workload) -> str:
    """A structural hash of the operator: the output expressions with inputs renamed by position,
    so the same math uploaded under other tensor names has the same signature."""
    names = {t.name: f"in{i}" for i, t in enumerate(getattr(workload, "inputs", ()))}
    parts = []
    for out in getattr(workload, "outputs", ()):
        text = repr(out.expr)
        for name, canon in sorted(names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(f"name='{name}'", f"name='{canon}'")
        parts.append(f"{out.dtype}:{text}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def dtype_of(workload) -> str:
    """The workload's data type for evidence purposes: the first floating input's storage dtype."""
    for t in getattr(workload, "inputs", ()):
        if t.dtype in ("fp32", "bf16", "fp16"):
            return t.dtype
    outs = getattr(workload, "outputs", ())
    return outs[0].dtype if outs else "fp32"


def shape_class(dims: dict[str, int]) -> str:
    """A coarse bucket of a shape: every dim rounded to the nearest power of two, e.g.
    ``M=2^14,N=2^12``. Records in one class behave alike closely enough to share lessons."""
    parts = []
    for name in sorted(dims):
        value = max(int(dims[name]), 1)
        parts.append(f"{name}=2^{round(math.log2(value))}")
    return ",".join(parts)


def shape_distance(a: dict[str, int], b: dict[str, int]) -> float:
    """Distance between two shapes in log2 units (sum over dims; a missing dim costs 8)."""
    total = 0.0
    for name in set(a) | set(b):
        if name not in a or name not in b:
            total += 8.0
        else:
            total += abs(math.log2(max(a[name], 1)) - math.log2(max(b[name], 1)))
    return total


_ABSENT = object()


def _family_of(schedule: dict):
    """The family whose canonical form names `schedule`: its "family" field ("row" for a dict
    with none), None for an edit of a customer's kernel or a family unknown here."""
    if schedule.get("ptx_edit"):
        return None
    try:
        return families.get(schedule.get("family") or "row")
    except KeyError:
        return None


def untailed(schedule: dict) -> dict:
    """`schedule` without its tail: what names its layout at a shape where its rows are
    aligned, so that no shifted twin exists there."""
    return {k: v for k, v in schedule.items() if k != "tail"}


def schedule_key(schedule: dict | None) -> str:
    """A stable text key for a schedule dict (None for hand-written PTX)."""
    if schedule is None:
        return "none"
    plain = {k: v for k, v in schedule.items() if ptxedit.LATE_DEFAULTS.get(k, _ABSENT) != v}
    fam = _family_of(plain)
    if fam is not None and fam.canonical is not None:
        plain = fam.canonical(plain)
    return json.dumps(plain, sort_keys=True, default=str)


# --- the store -------------------------------------------------------------------------------


class EvidenceStore(Protocol):
    def add(self, records: list[dict]) -> None: ...

    def query(
        self,
        *,
        family: str | None = None,
        shape_class: str | None = None,
        dtype: str | None = None,
        gpu: str | None = None,
        job: str | None = None,
        workload_sha256: str | None = None,
        status: str | None = None,
    ) -> list[dict]: ...


class JsonlEvidenceStore:
    """Evidence in memory, appended to `path` (JSON lines) when one is given and reloaded from it.

    Records are deduplicated by (job, ptx_sha256, dims, generation), so a redelivered result is
    stored once."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        self._records: list[dict] = []
        self._keys: set[tuple] = set()
        if self.path and os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line:
                        self._remember(json.loads(line))

    @staticmethod
    def _key(r: dict) -> tuple:
        dims = json.dumps(r.get("dims") or {}, sort_keys=True)
        return (r.get("job"), r.get("ptx_sha256"), dims, r.get("generation"))

    def _remember(self, record: dict) -> bool:
        key = self._key(record)
        if key in self._keys:
            return False
        self._keys.add(key)
        self._records.append(record)
        return True

    def add(self, records: list[dict]) -> None:
        fresh = [dict(r) for r in records if self._remember(dict(r))]
        if self.path and fresh:
            with open(self.path, "a", encoding="utf-8") as fh:
                for r in fresh:
                    fh.write(json.dumps(r, sort_keys=True, default=str) + "\n")

    def all(self) -> list[dict]:
        return list(self._records)

    def query(
        self,
        *,
        family: str | None = None,
        shape_class: str | None = None,
        dtype: str | None = None,
        gpu: str | None = None,
        job: str | None = None,
        workload_sha256: str | None = None,
        status: str | None = None,
    ) -> list[dict]:
        want = {
            "family": family,
            "dtype": dtype,
            "gpu": gpu,
            "job": job,
            "workload_sha256": workload_sha256,
            "status": status,
        }
        out = []
        for r in self._records:
            if any(v is not None and r.get(k) != v for k, v in want.items()):
                continue
            if shape_class is not None and _shape_class_of(r) != shape_class:
                continue
            out.append(r)
        return out


def _shape_class_of(record: dict) -> str:
    return shape_class(record.get("dims") or {})


# --- reading evidence ------------------------------------------------------------------------


# The portal's statuses of a candidate not yet judged: written, compiled, or out to a GPU.
UNSETTLED = ("proposed", "compiled", "queued")


def passed(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "passed" and r.get("median_us")]


def similar(
    records: list[dict],
    *,
    family: str,
    dtype: str,
    gpu: str,
    dims: dict[str, int],
    exclude_job: str | None = None,
    max_distance: float = 2.0,
) -> list[dict]:
    """Records about a similar problem: same family, dtype and GPU, shape within `max_distance`
    log2 units, from other jobs than `exclude_job`."""
    return [
        r
        for r in records
        if r.get("family") == family
        and r.get("dtype") == dtype
        and r.get("gpu") == gpu
        and (exclude_job is None or r.get("job") != exclude_job)
        and shape_distance(r.get("dims") or {}, dims) <= max_distance
    ]


def best_by_schedule(records: list[dict]) -> list[tuple[dict | None, float, dict]]:
    """Passed records grouped by schedule, each group's best time, fastest first:
    a list of (schedule, best median_us, the best record)."""
    best: dict[str, tuple[dict | None, float, dict]] = {}
    for r in passed(records):
        key = schedule_key(r.get("schedule"))
        t = float(r["median_us"])
        if key not in best or t < best[key][1]:
            best[key] = (r.get("schedule"), t, r)
    return sorted(best.values(), key=lambda x: x[1])


def warm_start_schedules(
    records: list[dict],
    *,
    family: str,
    dtype: str,
    gpu: str,
    dims: dict[str, int],
    exclude_job: str | None = None,
    limit: int = 4,
) -> list[dict]:
    """Schedules that won similar past jobs, best first: each past job's winners, ranked by their
    time relative to that job's best (so jobs at other sizes compare fairly), nearest shapes
    first on ties."""
    near = similar(records, family=family, dtype=dtype, gpu=gpu, dims=dims, exclude_job=exclude_job)
    by_job_shape: dict[tuple, list[dict]] = defaultdict(list)
    for r in passed(near):
        if r.get("schedule") is None:
            continue
        by_job_shape[(r.get("job"), json.dumps(r.get("dims"), sort_keys=True))].append(r)
    scored: dict[str, tuple[float, float, dict]] = {}
    for group in by_job_shape.values():
        best_us = min(float(r["median_us"]) for r in group)
        for r in group:
            rel = float(r["median_us"]) / best_us
            dist = shape_distance(r.get("dims") or {}, dims)
            key = schedule_key(r["schedule"])
            score = (rel, dist)
            if key not in scored or score < scored[key][:2]:
                scored[key] = (rel, dist, r["schedule"])
    ranked = sorted(scored.values(), key=lambda x: (x[0], x[1]))
    return [s for _, _, s in ranked[:limit]]


@dataclass
class Lessons:
    """What the evidence teaches about one family / shape class / GPU.

    `choices[field][value]` = {"n", "wins", "mean_rel", "pairs", "even"}: how often a schedule
    with that value was within 5% of its job's best, and its mean time relative to the best;
    how many one-field pairs it was in (records of one job and shape whose schedules differ in
    that field only), and in how many it ran within 2% of the other or faster. `failures`
    counts reasons (first clause) of records that did not pass. `text` is the same in words,
    for prompts."""

    family: str
    gpu: str
    shape_class: str | None
    records: int
    best: list[dict] = field(default_factory=list)
    choices: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    text: str = ""

    def preferred(self, field_name: str) -> list[Any]:
        """Values of a schedule field ordered from most to least winning (JSON-decoded)."""
        stats = self.choices.get(field_name, {})
        ordered = sorted(
            stats.items(), key=lambda kv: (-kv[1]["wins"] / kv[1]["n"], kv[1]["mean_rel"])
        )
        return [json.loads(v) for v, _ in ordered]


def lesson_records(
    records: list[dict],
    *,
    family: str,
    gpu: str = "sm_90",
    dims: dict[str, int] | None = None,
    max_distance: float = 2.0,
) -> list[dict]:
    """The records lessons are distilled from: one family on one GPU, near `dims` if given."""
    rel = [r for r in records if r.get("family") == family and r.get("gpu") == gpu]
    if dims is not None:
        rel = [r for r in rel if shape_distance(r.get("dims") or {}, dims) <= max_distance]
    return rel


def _job_shape_groups(records: list[dict]) -> list[list[dict]]:
    """The passed records grouped by (job, shape): times compare only within a group."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in passed(records):
        groups[(r.get("job"), json.dumps(r.get("dims"), sort_keys=True))].append(r)
    return list(groups.values())


def _relative(group: list[dict]) -> list[tuple[dict, float]]:
    best_us = min(float(r["median_us"]) for r in group)
    return [(r, float(r["median_us"]) / best_us) for r in group]


def relative_times(records: list[dict]) -> list[tuple[dict, float]]:
    """Each passed record with its time over the best of its (job, shape), so that sizes mix
    fairly."""
    return [pair for group in _job_shape_groups(records) for pair in _relative(group)]


def distil_lessons(
    records: list[dict],
    *,
    family: str,
    gpu: str = "sm_90",
    dims: dict[str, int] | None = None,
    max_distance: float = 2.0,
) -> Lessons:
    """Distil lessons from evidence of one family on one GPU (optionally near one shape)."""
    rel = lesson_records(records, family=family, gpu=gpu, dims=dims, max_distance=max_distance)
    lessons = Lessons(
        family=family,
        gpu=gpu,
        shape_class=shape_class(dims) if dims else None,
        records=len(rel),
    )
    stats: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for group in _job_shape_groups(rel):
        for r, ratio in _relative(group):
            for fname, value in (r.get("schedule") or {}).items():
                vkey = value_key(value)
                s = stats[fname].setdefault(
                    vkey, {"n": 0, "wins": 0, "mean_rel": 0.0, "pairs": 0, "even": 0}
                )
                s["mean_rel"] = (s["mean_rel"] * s["n"] + ratio) / (s["n"] + 1)
                s["n"] += 1
                s["wins"] += 1 if ratio <= 1.05 else 0
        _count_pairs(group, stats)
    lessons.choices = {k: dict(v) for k, v in stats.items()}
    for r in rel:
        # A candidate still on its way (or left so by a cancelled job) has not failed anything.
        if r.get("status") not in ("passed", *UNSETTLED):
            reason = (r.get("reason") or r.get("status") or "unknown").split(":")[0].strip()
            key = f"{r.get('status')}: {reason}"[:120]
            lessons.failures[key] = lessons.failures.get(key, 0) + 1
    lessons.best = [
        {"schedule": s, "median_us": t, "dims": rec.get("dims"), "job": rec.get("job")}
        for s, t, rec in best_by_schedule(rel)[:5]
    ]
    lessons.text = _lessons_text(lessons)
    return lessons


def value_key(value) -> str:
    """A schedule value as the key of Lessons.choices (JSON)."""
    return json.dumps(value, sort_keys=True, default=str)


def _count_pairs(group: list[dict], stats: dict) -> None:
    """For records of one job and shape whose schedules differ in one field only, count for each
    side's value a pair, and an even one where it ran within 2% of the other side or faster.
    The mean over all records confounds a value with the layouts it was tried on (streaming
    stores were avoided at LayerNorm 16384x4999 for three slow layouts that had them, while the
    one-field pairs showed them level); the pairs do not.

    Two schedules differ in field f alone when they agree on every other field, so the records
    are bucketed, for each field f, by their values of all the other fields; within a bucket
    every record pairs with each record of another value of f. The even ones are counted by
    bisection over the bucket's sorted times, so a job of thousands of candidates costs
    n log n per field instead of n squared (a field left at its default is not written, and
    reads as None, as it did in the pairwise comparison)."""
    scheds = [(r.get("schedule") or {}, float(r["median_us"])) for r in group]
    fields = sorted({k for sch, _ in scheds for k in sch}, key=str)
    for f in fields:
        buckets: dict[tuple, list[tuple[Any, dict, float]]] = defaultdict(list)
        for sch, t in scheds:
            rest = tuple(_hashable(sch.get(k)) for k in fields if k != f)
            buckets[rest].append((_hashable(sch.get(f)), sch, t))
        for members in buckets.values():
            if len(members) < 2:
                continue
            every = sorted(t for _, _, t in members)
            by_value: dict[Any, list[float]] = defaultdict(list)
            for value, _, t in members:
                by_value[value].append(t)
            if len(by_value) < 2:
                continue
            for times in by_value.values():
                times.sort()
            for value, sch, mine in members:
                if f not in sch:  # (a field left at its default is not written)
                    continue
                s = stats[f].get(value_key(sch[f]))
                if s is None:
                    continue
                same = by_value[value]
                s["pairs"] += len(every) - len(same)
                # even: the other side took at least mine / 1.02 (mine <= 1.02 * other)
                floor = mine / 1.02
                at_least = len(every) - bisect.bisect_left(every, floor)
                at_least_same = len(same) - bisect.bisect_left(same, floor)
                s["even"] += at_least - at_least_same


def _hashable(value):
    """A schedule value as a dict key that is equal where the values compare equal."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    return value


def _lessons_text(lessons: Lessons) -> str:
    where = f"{lessons.family} on {lessons.gpu}"
    if lessons.shape_class:
        where += f" near {lessons.shape_class}"
    if not lessons.records:
        return f"No evidence yet for {where}."
    lines = [f"Evidence for {where}: {lessons.records} records."]
    for b in lessons.best[:3]:
        lines.append(
            f"- fast: {schedule_key(b['schedule'])} at {b['dims']}: {b['median_us']:.2f} us"
        )
    for fname, values in sorted(lessons.choices.items()):
        if len(values) < 2:
            continue
        ranked = sorted(values.items(), key=lambda kv: kv[1]["mean_rel"])
        good, bad = ranked[0], ranked[-1]
        lines.append(
            f"- {fname}: {good[0]} averages {good[1]['mean_rel']:.2f}x the best "
            f"({int(good[1]['n'])} runs); {bad[0]} averages {bad[1]['mean_rel']:.2f}x"
        )
    for reason, n in sorted(lessons.failures.items(), key=lambda kv: -kv[1])[:5]:
        lines.append(f"- failed {n}x: {reason}")
    return "\n".join(lines)
