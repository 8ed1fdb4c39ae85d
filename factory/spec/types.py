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
    dim `name` as `ptx_type` u32/u64/s32), or "scalar" (the constant `value` as f32/f64)."""

    kind: str
    ptx_type: str
    name: str = ""
    value: float = 0.0


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
