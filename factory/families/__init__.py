"""The registry of operator families: the one door between a family and everything else.

Built-in families are named here with the module that holds each one's `FAMILY` record and
imported on first use; a test or a plugin adds its own with `register`. `family_for(workload)`
asks the families in order and answers the first that lowers the workload, with its IR.

    from factory import families
    fam, ir = families.family_for(workload)       # or raises Unsupported with every reason
    fam.space(ir, dims_list); fam.emit(ir, schedule, "sm_90")
    families.get("row").label(schedule_dict)
"""

from __future__ import annotations

import importlib
import threading

from factory.families.base import Family, Roofline, Unsupported, io_bytes

# name -> the module whose FAMILY attribute is the family, in the order family_for asks them:
# the most specific first (a matmul's expression would otherwise be refused by the row family).
BUILTIN: dict[str, str] = {
    "attention": "factory.families.attention",
    "matmul": "factory.families.matmul",
    "colreduce": "factory.families.colreduce",
    "allreduce": "factory.families.allreduce",
    "segreduce": "factory.families.segreduce",
    "scan": "factory.families.scan",
    "argreduce": "factory.families.argreduce",
    "pool": "factory.families.pool",
    "segnorm": "factory.families.segnorm",
    # before the row family: pure elementwise work over the whole tensor, and few long rows
    "flat": "factory.families.flat",
    "rowsplit": "factory.families.rowsplit",
    "row": "factory.families.row",
}

_LOCK = threading.Lock()
_LOADED: dict[str, Family] = {}
_EXTRA: dict[str, Family] = {}  # registered at run time, asked before the built-in ones


def register(family: Family) -> Family:
    """Add (or replace) a family under `family.name`; it is asked before the built-in ones."""
    with _LOCK:
        _EXTRA[family.name] = family
    return family


def unregister(name: str) -> None:
    with _LOCK:
        _EXTRA.pop(name, None)


def _load(name: str) -> Family | None:
    fam = _LOADED.get(name)
    if fam is None:
        try:
            module = importlib.import_module(BUILTIN[name])
        except ModuleNotFoundError as e:
            if e.name and BUILTIN[name].startswith(e.name):
                return None  # a family folder not (yet) in this tree
            raise
        fam = getattr(module, "FAMILY", None)
        if fam is None:
            return None
        _LOADED[name] = fam
    return fam


def get(name: str) -> Family:
    """The family called `name`; KeyError naming the known families otherwise."""
    if name in _EXTRA:
        return _EXTRA[name]
    if name in BUILTIN:
        fam = _load(name)
        if fam is not None:
            return fam
    raise KeyError(f"no operator family {name!r}; known: {', '.join(names())}")


def names() -> list[str]:
    return [*_EXTRA, *(n for n in BUILTIN if n not in _EXTRA and _load(n) is not None)]


def all_families() -> list[Family]:
    return [get(n) for n in names()]


def family_for(workload):
    """(family, ir) of the first family that lowers `workload`. Raises Unsupported whose message
    gives each family's reason when none does."""
    reasons = []
    for fam in all_families():
        try:
            return fam, fam.lower(workload)
        except Unsupported as e:
            reasons.append(f"{fam.name}: {e}")
    if len(reasons) == 1:
        raise Unsupported(reasons[0].split(": ", 1)[1])
    raise Unsupported("; ".join(reasons) or "no operator family is registered")


def name_for(workload, default: str = "row") -> str:
    """The name of the family that lowers `workload`, or `default` where none does (a workload
    searched only through edits of the customer's kernel)."""
    try:
        return family_for(workload)[0].name
    except Unsupported:
        return default


def of_schedule(schedule) -> Family:
    """The family a schedule (a dataclass or its dict) belongs to; "row" when it names none."""
    fam = (
        schedule.get("family") if isinstance(schedule, dict) else getattr(schedule, "family", None)
    )
    return get(fam or "row")


def label(schedule: dict | None) -> str:
    """A schedule's human label through its family; "" for none, the dict's text when the family
    is unknown here."""
    if not schedule:
        return ""
    try:
        return of_schedule(schedule).label(schedule)
    except Exception:  # noqa: BLE001 - a label never breaks a page
        return ", ".join(f"{k}={v}" for k, v in sorted(schedule.items()))


def baselines_module(name: str):
    """The family's torch-side baseline module (importable without its emitter), or None."""
    fam = get(name)
    return importlib.import_module(fam.baselines_module) if fam.baselines_module else None


__all__ = [
    "BUILTIN",
    "Family",
    "Roofline",
    "Unsupported",
    "all_families",
    "baselines_module",
    "family_for",
    "get",
    "io_bytes",
    "label",
    "name_for",
    "names",
    "of_schedule",
    "register",
    "unregister",
]
