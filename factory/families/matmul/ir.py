"""GemmIR: what the matmul emitter consumes.

C[..., M, N] = epilogue(A[..., M, K] @ B[..., K, N]) with the product accumulated in fp32.

The lowering from a manifest builds one GemmIR per accepted workload; the emitter
(`factory.families.matmul.emit.emit`) renders it with a `GemmSchedule`.

Names of dims: `m`, `n`, `k` are the dim symbols used in the manifest's shapes ("M", "N", "K", or
whatever the customer called them); `batch` names leading batch axes (empty for a plain GEMM).

Operand layouts (how the bytes of the operand sit in memory):
- A, "row": stored [M, K], K contiguous (the only layout A takes for now).
- B, "row": stored [K, N], N contiguous (the textbook layout).
- B, "col": stored [N, K], K contiguous (a transposed weight, e.g. torch's Linear weight; the
  common case and the one the tensor cores read without a transpose).

Epilogue: every output is an expression tree of `factory.spec.expr` nodes (Input, Const, Unary,
Binary, Compare, Where, Cast) evaluated in f32 per output element, where
- `Input("acc", ...)` is the fp32 accumulator of A @ B at that element,
- `Input("acc2", ...)` is the fp32 accumulator of A @ B2 (only when `b2` is set: a second weight
  sharing the left operand, as in SwiGLU `silu(A @ Bg) * (A @ Bu)`),
- any other `Input(name, ...)` is the EpiInput of that name, broadcast by its role.
The expression's shapes are not used by the emitter (every node is per element); they may be
whatever the lowering finds convenient.
"""

from __future__ import annotations

from dataclasses import dataclass

from factory.spec import expr as E

ACC = "acc"
ACC2 = "acc2"

OPERAND_LAYOUTS = ("row", "col")
# Storage dtypes the tensor-core path takes for A and B (fp8 e4m3 is planned, not emitted yet).
OPERAND_DTYPES = ("bf16", "fp16")
# How an epilogue input broadcasts against the [M, N] output.
EPI_ROLES = ("col", "row", "full", "scalar")
# fp8e4m3: OCP e4m3fn bits, rounded to nearest even and saturated at 448 (cvt .satfinite)
OUTPUT_DTYPES = ("bf16", "fp16", "fp32", "fp8e4m3")


@dataclass(frozen=True)
class Operand:
    """A matrix operand: `name` is the manifest tensor's name, `dtype` its storage dtype,
    `layout` "row" or "col" as described in the module docstring."""

    name: str
    dtype: str
    layout: str = "row"


@dataclass(frozen=True)
class EpiInput:
    """A tensor the epilogue reads. role: "col" (shape (N,), one value per output column, e.g. a
    bias), "row" (shape (M,)), "full" (shape (M, N), e.g. a residual), "scalar" (shape () or (1,)).
    Batched GEMMs: a "full" input carries the batch axes too; "col"/"row"/"scalar" are shared
    across the batch."""

    name: str
    dtype: str
    role: str


# Columns that share one scale of a group-scaled fp8 output (see EpiOutput.group_scale).
SCALE_GROUP = 128


@dataclass(frozen=True)
class EpiOutput:
    """An output tensor [.., M, N] of dtype `dtype`, each element `expr` (see module docstring).

    group_scale (fp8e4m3 outputs only): the name of a second output, fp32 [rows, ceil(N / 128)],
    that receives one scale per row and group of SCALE_GROUP = 128 columns: s = amax / 448 over
    the group's values of `expr` (the columns below N), and the fp8 output holds e4m3(v / s)
    (0 where the group is all zero), so that v ~ q * s. A scale per row over all N columns would
    need every tile of a row finished before any could be quantised: a grid-wide dependency
    (a cross-CTA fix-up through a global workspace, which the worker's launch contract does not
    give a kernel) or a second pass re-reading the unquantised output (the traffic the fusion
    saves). The 128-column group is the tile's own (tile_n = 128 or 256): one pass, in
    registers, deterministic, and the layout fp8 GEMMs with per-group scales read."""

    name: str
    dtype: str
    expr: E.Node
    group_scale: str = ""


@dataclass(frozen=True)
class GemmIR:
    name: str  # the kernel's name stem (letters, digits, underscores)
    m: str  # dim symbol of the output rows
    n: str  # dim symbol of the output columns
    k: str  # dim symbol of the reduction axis
    batch: tuple[str, ...]  # dim symbols of leading batch axes, outermost first (may be empty)
    a: Operand
    b: Operand
    b2: Operand | None  # the second right operand (gated MLPs); its accumulator is "acc2"
    inputs: tuple[EpiInput, ...]
    outputs: tuple[EpiOutput, ...]

    def problems(self) -> list[str]:
        """What is wrong with this IR (empty when it is well formed)."""
        out = []
        if self.a.layout != "row":
            out.append(f"A must be row-major ([M, K], K contiguous), not {self.a.layout}")
        for op in (self.a, self.b) + ((self.b2,) if self.b2 else ()):
            if op.layout not in OPERAND_LAYOUTS:
                out.append(f"operand {op.name}: layout {op.layout!r} not in {OPERAND_LAYOUTS}")
            if op.dtype not in OPERAND_DTYPES:
                out.append(f"operand {op.name}: dtype {op.dtype!r} not in {OPERAND_DTYPES}")
        if self.b.dtype != self.a.dtype or (self.b2 and self.b2.dtype != self.a.dtype):
            out.append("A and B (and B2) must share one dtype")
        if self.b2 is not None and self.b2.layout != self.b.layout:
            out.append("B2 must have B's layout")
        names = {i.name for i in self.inputs}
        for i in self.inputs:
            if i.role not in EPI_ROLES:
                out.append(f"input {i.name}: role {i.role!r} not in {EPI_ROLES}")
            if i.name in (ACC, ACC2):
                out.append(f"input {i.name}: the names acc/acc2 are reserved")
        if not self.outputs:
            out.append("no outputs")
        for o in self.outputs:
            if o.dtype not in OUTPUT_DTYPES:
                out.append(f"output {o.name}: dtype {o.dtype!r} not in {OUTPUT_DTYPES}")
            if o.group_scale:
                if o.dtype != "fp8e4m3":
                    out.append(f"output {o.name}: group scales go with fp8e4m3 outputs")
                taken = {x.name for x in self.outputs} | names | {ACC, ACC2}
                if o.group_scale in taken:
                    out.append(f"output {o.name}: scale name {o.group_scale} is taken")
            for node in E.walk(o.expr):
                if isinstance(node, E.Input):
                    if node.name == ACC2 and self.b2 is None:
                        out.append(f"output {o.name}: reads acc2 but there is no b2")
                    elif node.name not in (ACC, ACC2) and node.name not in names:
                        out.append(f"output {o.name}: reads unknown input {node.name}")
                elif not isinstance(
                    node, E.Const | E.Unary | E.Binary | E.Compare | E.Where | E.Cast
                ):
                    out.append(f"output {o.name}: {type(node).__name__} is not elementwise")
        return out

    def input(self, name: str) -> EpiInput:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)


def acc(shape: E.Shape = ("M", "N")) -> E.Input:
    """The accumulator node (a convenience for lowering and tests)."""
    return E.Input(ACC, shape, "fp32")


def acc2(shape: E.Shape = ("M", "N")) -> E.Input:
    return E.Input(ACC2, shape, "fp32")


def plain(
    name: str = "gemm", dtype: str = "bf16", b_layout: str = "col", out_dtype: str = "bf16"
) -> GemmIR:
    """C = A @ B, the plain GEMM (for tests and the bench)."""
    return GemmIR(
        name,
        "M",
        "N",
        "K",
        (),
        Operand("a", dtype, "row"),
        Operand("b", dtype, b_layout),
        None,
        (),
        (
            EpiOutput(
                "c",
                out_dtype,
                E.Cast(acc(), out_dtype, ("M", "N")) if out_dtype != "fp32" else acc(),
            ),
        ),
    )
