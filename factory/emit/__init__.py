"""The PTX emitters' shared library: the builder (`factory.emit.ptx`), the table of elementwise
operations (`factory.emit.ops`) and what every emitter returns (`Emitted`).

`emit(ir, schedule, arch)` renders through the schedule's family (factory.families); each
family's emitter lives in its own folder and raises `EmitError` saying what it cannot render.
"""

from __future__ import annotations

from factory.emit.ptx import EmitError
from factory.emit.types import Emitted

__all__ = ["EmitError", "Emitted", "emit"]


def emit(ir, schedule, arch: str = "sm_90") -> Emitted:
    """Render `ir` with `schedule` for `arch` through the schedule's family."""
    from factory import families

    try:
        fam = families.of_schedule(schedule)
    except KeyError as e:
        raise EmitError(str(e)) from None
    return fam.emit(ir, schedule, arch)
