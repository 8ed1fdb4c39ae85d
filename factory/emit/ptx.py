"""A small PTX text builder: instructions, labels, and registers named from counters.

Registers are virtual (ptxas allocates the real ones), so the builder only hands out fresh names
per type and declares each family once, sized by its counter, when the kernel is finished.
"""

from __future__ import annotations

import math
import struct

# One register family per PTX type we use; names read like the ones in nvcc's output.
REG_PREFIX = {"f32": "%f", "b32": "%r", "b64": "%rd", "pred": "%p", "b16": "%h"}
REG_DECL_TYPE = {"f32": ".f32", "b32": ".b32", "b64": ".b64", "pred": ".pred", "b16": ".b16"}

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def f32_literal(value: float) -> str:
    """An exact f32 immediate in PTX's hex form (covers inf and nan)."""
    if math.isnan(value):
        return "0f7FC00000"
    bits = struct.unpack(">I", struct.pack(">f", float(value)))[0]
    return f"0f{bits:08X}"


class EmitError(Exception):
    """The emitter cannot render this IR with this schedule; the message says what and why."""


class Builder:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: dict[str, int] = dict.fromkeys(REG_PREFIX, 0)
        self._labels = 0

    def reg(self, kind: str) -> str:
        self.counts[kind] += 1
        return f"{REG_PREFIX[kind]}{self.counts[kind]}"

    def op(self, text: str) -> None:
        self.lines.append(f"    {text};")

    def comment(self, text: str) -> None:
        self.lines.append(f"    // {text}")

    def blank(self) -> None:
        self.lines.append("")

    def label(self, name: str) -> None:
        self.lines.append(f"{name}:")

    def new_label(self, stem: str) -> str:
        self._labels += 1
        return f"$L_{stem}_{self._labels}"

    def const_f32(self, value: float) -> str:
        r = self.reg("f32")
        self.op(f"mov.f32 {r}, {f32_literal(value)}")
        return r

    def declarations(self) -> list[str]:
        out = []
        for kind, n in self.counts.items():
            if n:
                out.append(f"    .reg {REG_DECL_TYPE[kind]} {REG_PREFIX[kind]}<{n + 1}>;")
        return out
