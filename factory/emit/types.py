"""What every family's emitter returns."""

from __future__ import annotations

from dataclasses import dataclass

from factory.spec.types import KernelParam, Launch


@dataclass(frozen=True)
class Emitted:
    """One kernel: its PTX text, entry name, parameters in order, and launch as shape arithmetic
    over the workload's dims."""

    ptx: str
    entry: str
    params: tuple[KernelParam, ...]
    launch: Launch
