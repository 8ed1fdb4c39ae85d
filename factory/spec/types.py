"""The validated workload: what a manifest becomes once `load_manifest` accepts it.

These types are shared by the portal, the factory and the GPU worker; everything in them is plain
data (JSON-serialisable through `to_dict`) except the parsed expression nodes, which are rebuilt
from the manifest text (`Workload.manifest` is the source of truth, hashed in `sha256`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from factory.spec.expr import Node, Shape


class SpecError(ValueError):
    """A manifest, expression or kernel was refused. `errors` lists (field, problem) pairs; the
    field is a dotted path such as ``outputs.y.expr`` or ``shapes[2].N``."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{f}: {p}" for f, p in self.errors))


@dataclass(frozen=True)
class TensorDecl:
    name: str
    shape: Shape
    dtype: str
    # Range of the random values the judge draws (realistic for the operator). For index
    # tensors `high` may be a dim symbol: values are drawn in [low, dims[high]).
    low: float = -4.0
    high: float | str = 4.0


@dataclass(frozen=True)
class OutputDecl:
    name: str
    shape: Shape
    dtype: str
    expr: Node
    source: str = ""  # the expression text from the manifest, for display


@dataclass(frozen=True)
class Tolerance:
    """A result passes when ||out - ref|| / ||ref|| <= rel_norm and max|out - ref| <= atol +
    rtol * |ref| elementwise (computed in float64, NaN never passes)."""

    rel_norm: float
    atol: float
    rtol: float


@dataclass(frozen=True)
class KernelParam:
    """How one parameter of a kernel's entry point binds to the workload.
    kind: "tensor" (a device pointer to the input or output named `name`), "dim" (the value of
    dim `name` as `ptx_type` u32/u64/s32), "scalar" (the constant `value` as f32/f64), or
    "tmap" (a 128-byte CUtensorMap passed by value, `ptx_type` "b8x128": a tiled map over the
    row-major tensor `name` whose extents are the dim expressions `dims`, innermost first, read
    in boxes of `box` elements, innermost first, with a `swizzle` of 0/32/64/128 bytes; the GPU
    worker encodes it with gpuworker.tensormap)."""

    kind: str
    ptx_type: str
    name: str = ""
    value: float = 0.0
    box: tuple[int, ...] = ()
    dims: tuple[str, ...] = ()
    swizzle: int = 0


@dataclass(frozen=True)
class Launch:
    """Launch geometry as a function of the dims. Each entry is an int or a string in shape
    arithmetic over dim names (integers, + - * //, ceildiv(a, b), min, max), evaluated by
    `factory.spec.eval_dim_expr`."""

    grid: tuple[int | str, int | str, int | str]
    block: tuple[int, int, int]
    smem_bytes: int | str = 0
    cluster: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class BaselineKernel:
    """The customer's own kernel, always as PTX (CUDA C is compiled to PTX at upload)."""

    language: str  # "ptx" or "cuda" (the original upload's language)
    source: str  # the uploaded text
    ptx: str
    entry: str
    params: tuple[KernelParam, ...]
    launch: Launch


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[OutputDecl, ...]
    shapes: tuple[dict[str, int], ...]  # the shapes to optimise for, dim name -> size
    heldout_shapes: tuple[dict[str, int], ...]  # checked for correctness, never optimised for
    tolerance: dict[str, Tolerance]  # by output dtype
    target: str  # "sm_90"
    manifest: str  # the manifest text as accepted
    sha256: str  # of `manifest`, hex
    baseline: BaselineKernel | None = None
    tags: tuple[str, ...] = field(default=())

    @property
    def dim_names(self) -> tuple[str, ...]:
        """The dim symbols of the inputs in order of first appearance (a shapes row's keys)."""
        seen: dict[str, None] = {}
        for t in self.inputs:
            for d in t.shape:
                if isinstance(d, str):
                    seen.setdefault(d, None)
        return tuple(seen)

    def input(self, name: str) -> TensorDecl:
        """The input named `name` (KeyError when there is none)."""
        for t in self.inputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def output(self, name: str) -> OutputDecl:
        """The output named `name` (KeyError when there is none)."""
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    def to_dict(self) -> dict:
        """Plain JSON-serialisable data: everything but the parsed expression nodes (outputs
        carry their expression text; `manifest` rebuilds the rest)."""
        b = self.baseline
        return {
            "name": self.name,
            "description": self.description,
            "target": self.target,
            "tags": list(self.tags),
            "sha256": self.sha256,
            "inputs": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "range": [t.low, t.high]}
                for t in self.inputs
            ],
            "outputs": [
                {"name": o.name, "shape": list(o.shape), "dtype": o.dtype, "expr": o.source}
                for o in self.outputs
            ],
            "shapes": [dict(r) for r in self.shapes],
            "heldout_shapes": [dict(r) for r in self.heldout_shapes],
            "tolerance": {
                k: {"rel_norm": t.rel_norm, "atol": t.atol, "rtol": t.rtol}
                for k, t in self.tolerance.items()
            },
            "baseline": None
            if b is None
            else {
                "language": b.language,
                "entry": b.entry,
                "params": [
                    {"kind": p.kind, "ptx_type": p.ptx_type, "name": p.name, "value": p.value}
                    for p in b.params
                ],
                "launch": {
                    "grid": list(b.launch.grid),
                    "block": list(b.launch.block),
                    "smem_bytes": b.launch.smem_bytes,
                    "cluster": list(b.launch.cluster) if b.launch.cluster else None,
                },
            },
        }


class BaselineUnavailable(Exception):
    """A baseline does not exist for this workload or on this host (the reason says which).
    Raised by a family's baselines module, reported by the GPU worker as "unavailable"."""
