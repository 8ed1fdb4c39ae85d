"""What the memory-bound families share beyond the seam (factory.families.base): the dict form
of a frozen schedule, and the checked emit every family's `emit` is."""

from __future__ import annotations

from dataclasses import asdict, fields

from factory.emit.ptx import EmitError


class ScheduleDict:
    """Mixin for a frozen dataclass schedule: `to_dict` (every field) and `from_dict` (the
    fields this class has, others ignored: a stored dict may carry fields added later)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def checked_emit(name: str, archs, schedule_cls, is_valid, render, ir, schedule, arch: str):
    """`render(ir, schedule, arch)` once the schedule (a dict is read by `schedule_cls`) is
    valid for the family `name` and `arch` is one of `archs`; EmitError saying which not."""
    if isinstance(schedule, dict):
        schedule = schedule_cls.from_dict(schedule)
    if arch not in archs:
        raise EmitError(f"no {name} emitter for {arch}; known: {', '.join(archs)}")
    ok, why = is_valid(ir, schedule, None)
    if not ok:
        raise EmitError(f"invalid {name} schedule {schedule.tag()}: {why}")
    return render(ir, schedule, arch)


def seeds_from(default, changes, valid) -> list:
    """`default`, then `default` with each change (a dict of fields) applied, in order, where
    the result is new and `valid(schedule)` holds."""
    out = [default]
    for change in changes:
        s = type(default)(**{**default.to_dict(), **change})
        if s not in out and valid(s):
            out.append(s)
    return out
