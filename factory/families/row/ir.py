"""The kernel IR: a workload's expression DAG lowered onto one row-wise execution model.

Every operator the expression language writes over rows fits one shape of kernel: a group of
threads owns one row of length N (the last dim); the leading dims are flattened into rows. Values
live at one of two levels:

- row level: varies along the row (a row tensor [*, N], a per-column vector [N], anything
  elementwise over them);
- scalar level: one value per row (a per-row tensor [*] or [*, 1], a constant, a reduction along
  the row, a gather of one element of the row).

A reduction is a barrier: everything that depends on its result waits for it. The *stage* of a
node counts the reductions on its longest dependency chain, so LayerNorm is three stages (x; mean;
variance), and the kernel makes one pass over the row per stage that has row-level work. CSE is
free: nodes are frozen dataclasses, so equal sub-expressions are the same key.

Lowering is general over the DAG (never keyed on a catalogue name); what the model cannot express
raises `Unsupported` with a reason a customer can read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from factory.families.base import Unsupported
from factory.spec import expr as E

ROW = "row"
SCALAR = "scalar"

# Tensor roles, from the shape relative to the batch dims and the row dim.
ROLE_ROW = "row"  # (*batch, N)
ROLE_COL = "col"  # (N,) or (1, ..., 1, N): one value per column, shared by all rows
ROLE_ROWSCALAR = "rowscalar"  # (*batch,) or (*batch, 1)
ROLE_SCALAR = "scalar"  # () or all ones


@dataclass(frozen=True)
class TensorRef:
    name: str
    dtype: str
    role: str

    @property
    def elem_bytes(self) -> int:
        return E.DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class OutputRef:
    name: str
    dtype: str
    role: str  # ROLE_ROW or ROLE_ROWSCALAR
    node: E.Node


@dataclass(frozen=True)
class OnlinePair:
    """sum(exp(F - max(F))) next to max(F): one streaming pass can carry both (running max and
    a sum rescaled whenever the max grows), instead of one pass per reduction."""

    max_node: E.Reduce
    sum_node: E.Reduce
    f_node: E.Node  # the row-level F


@dataclass(frozen=True)
class MomentPair:
    """mean(X) next to mean((X - mean(X))^2) (LayerNorm's mean and variance): one pass can carry
    both, each thread's (count, mean, squared deviations) merged across threads by Chan's
    update, instead of a second pass and a second reduction across the row."""

    mean_node: E.Reduce
    var_node: E.Reduce
    x_node: E.Node  # the row-level X


@dataclass
class KernelIR:
    name: str
    batch_dims: tuple[str, ...]
    row_dim: str
    inputs: tuple[TensorRef, ...]
    outputs: tuple[OutputRef, ...]
    order: list[E.Node]  # every node, operands first
    level: dict[E.Node, str]
    stage: dict[E.Node, int]
    users: dict[E.Node, list[E.Node]]
    reductions: list[E.Reduce]
    gathers: list[E.Gather]
    online: list[OnlinePair]
    tolerance_rel_norm: float  # the strictest output tolerance (decides fast-math)
    input_by_name: dict[str, TensorRef] = field(default_factory=dict)
    moments: list[MomentPair] = field(default_factory=list)
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # derived facts, cached

    @property
    def num_stages(self) -> int:
        """Passes over the row: one per stage that has row-level work to do."""
        return 1 + max(
            [self.stage[r.x] for r in self.reductions]
            + [self.stage[o.node] for o in self.outputs if o.role == ROLE_ROW]
            + [0]
        )

    @property
    def has_reductions(self) -> bool:
        return bool(self.reductions)

    def min_elem_bytes(self) -> int:
        """The narrowest row-level dtype among inputs and outputs (sets the vector width)."""
        hit = self.memo.get("min_elem_bytes")  # asked for about a million times a space
        if hit is None:
            sizes = [t.elem_bytes for t in self.inputs if t.role in (ROLE_ROW, ROLE_COL)]
            sizes += [E.DTYPE_BYTES[o.dtype] for o in self.outputs if o.role == ROLE_ROW]
            hit = self.memo["min_elem_bytes"] = min(sizes) if sizes else 4
        return hit

    def row_inputs(self) -> list[TensorRef]:
        return [t for t in self.inputs if t.role in (ROLE_ROW, ROLE_COL)]

    def bytes_per_row(self, n: int) -> int:
        """Bytes a perfect kernel moves per row (each input read once, each output written once;
        per-column vectors are counted once per kernel, so not here)."""
        total = 0
        for t in self.inputs:
            if t.role == ROLE_ROW:
                total += n * t.elem_bytes
            elif t.role == ROLE_ROWSCALAR:
                total += t.elem_bytes
        for o in self.outputs:
            total += (n if o.role == ROLE_ROW else 1) * E.DTYPE_BYTES[o.dtype]
        return total


def _strip_ones(shape: E.Shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def _classify_dims(workload) -> tuple[tuple[str, ...], str]:
    """The row dim is the last dim of the widest tensor; the batch dims are its leading dims."""
    shapes = [t.shape for t in workload.inputs] + [o.shape for o in workload.outputs]
    widest = max(shapes, key=len)
    if not widest:
        raise Unsupported("every tensor is a scalar: there is no row to work along")
    row_dim = widest[-1]
    if row_dim == 1:
        raise Unsupported("the last axis of the widest tensor is 1: there is no row to work along")
    if not isinstance(row_dim, str):
        raise Unsupported("the row dim must be a named dim")
    batch = tuple(d for d in widest[:-1] if d != 1)
    for d in batch:
        if not isinstance(d, str):
            raise Unsupported(f"leading dim {d!r} must be a named dim")
    return batch, row_dim


def _role(shape: E.Shape, batch: tuple[str, ...], row_dim: str, what: str) -> str:
    core = _strip_ones(shape)
    if core == ():
        return ROLE_SCALAR
    if core == (*batch, row_dim) and shape[-1] == row_dim:
        return ROLE_ROW
    if core == (row_dim,) and shape[-1] == row_dim:
        return ROLE_COL
    if core == batch and row_dim not in shape:
        return ROLE_ROWSCALAR
    raise Unsupported(
        f"{what} has shape {shape}: a row kernel needs (*{batch}, {row_dim}), ({row_dim},), "
        f"(*{batch}) or (*{batch}, 1)"
    )


def _node_role(node: E.Node, batch, row_dim) -> str:
    return _role(node.shape, batch, row_dim, type(node).__name__)


def lower(workload) -> KernelIR:
    """Lower a validated `Workload` to a `KernelIR`; raises `Unsupported(reason)`."""
    if any(isinstance(n, E.MatMul | E.Transpose) for o in workload.outputs for n in E.walk(o.expr)):
        raise Unsupported("a matrix product (a @ b, w.T) is not a row operator")
    batch, row_dim = _classify_dims(workload)
    inputs = tuple(
        TensorRef(t.name, t.dtype, _role(t.shape, batch, row_dim, f"input {t.name}"))
        for t in workload.inputs
    )
    outputs = []
    for o in workload.outputs:
        role = _role(o.shape, batch, row_dim, f"output {o.name}")
        if role == ROLE_COL:
            raise Unsupported(
                f"output {o.name} has shape {o.shape}, one value per column: that reduces across "
                "rows, which a row kernel (one row per thread group) cannot produce"
            )
        if role not in (ROLE_ROW, ROLE_ROWSCALAR):
            raise Unsupported(f"output {o.name} must be per element or per row, not {role}")
        if o.dtype not in E.FLOAT_DTYPES:
            raise Unsupported(f"output {o.name} has dtype {o.dtype}: only float outputs")
        outputs.append(OutputRef(o.name, o.dtype, role, o.expr))
    # The strictest tolerance among the dtypes actually written decides what math is allowed.
    rels = [workload.tolerance[o.dtype].rel_norm for o in outputs if o.dtype in workload.tolerance]
    rels = rels or [t.rel_norm for t in workload.tolerance.values()] or [1e-5]
    return lower_nodes(
        name=workload.name,
        batch_dims=batch,
        row_dim=row_dim,
        inputs=inputs,
        outputs=tuple(outputs),
        tolerance_rel_norm=min(rels),
    )


def lower_nodes(
    *,
    name: str,
    batch_dims: tuple[str, ...],
    row_dim: str,
    inputs: tuple[TensorRef, ...],
    outputs: tuple[OutputRef, ...],
    tolerance_rel_norm: float = 1e-2,
) -> KernelIR:
    """Lower hand-built outputs (the part of `lower` after shapes are classified)."""
    by_name = {t.name: t for t in inputs}
    order: list[E.Node] = []
    seen: set[E.Node] = set()
    for o in outputs:
        for n in E.walk(o.node):
            if n not in seen:
                seen.add(n)
                order.append(n)

    level: dict[E.Node, str] = {}
    stage: dict[E.Node, int] = {}
    users: dict[E.Node, list[E.Node]] = {n: [] for n in order}
    reductions: list[E.Reduce] = []
    gathers: list[E.Gather] = []
    for n in order:
        for c in E.children(n):
            users[c].append(n)
        if isinstance(n, E.Input):
            ref = by_name.get(n.name)
            if ref is None:
                raise Unsupported(f"expression uses undeclared input {n.name}")
            level[n] = ROW if ref.role in (ROLE_ROW, ROLE_COL) else SCALAR
            stage[n] = 0
            if ref.dtype in E.INDEX_DTYPES and level[n] == ROW:
                pass  # index data used as numbers: converted to f32 on load
        elif isinstance(n, E.Const):
            level[n] = SCALAR
            stage[n] = 0
        elif isinstance(n, E.Reduce):
            if n.op not in E.REDUCE_OPS:
                raise Unsupported(f"reduction {n.op} is not supported")
            if level[n.x] != ROW:
                raise Unsupported("a reduction over a per-row value (size-1 axis) is not supported")
            if n.axis != len(n.x.shape) - 1:
                raise Unsupported(
                    f"reduction along axis {n.axis} of {n.x.shape}: only the last axis (the row)"
                )
            level[n] = SCALAR
            stage[n] = stage[n.x] + 1
            reductions.append(n)
        elif isinstance(n, E.Gather):
            if level[n.x] != ROW:
                raise Unsupported("gather needs a per-element source along the row")
            if not isinstance(n.idx, E.Input) or by_name[n.idx.name].role != ROLE_ROWSCALAR:
                raise Unsupported("gather index must be a per-row index input")
            if by_name[n.idx.name].dtype not in E.INDEX_DTYPES:
                raise Unsupported("gather index must be int32 or int64")
            level[n] = SCALAR
            stage[n] = stage[n.x]
            gathers.append(n)
        elif isinstance(n, E.Unary | E.Binary | E.Compare | E.Where | E.Cast):
            if isinstance(n, E.Unary) and n.op not in E.UNARY_OPS:
                raise Unsupported(f"unary op {n.op} is not supported")
            if isinstance(n, E.Binary) and n.op not in E.BINARY_OPS:
                raise Unsupported(f"binary op {n.op} is not supported")
            if isinstance(n, E.Binary) and n.op == "pow" and not isinstance(n.b, E.Const):
                raise Unsupported("pow needs a constant exponent")
            if isinstance(n, E.Cast) and n.to not in E.FLOAT_DTYPES:
                raise Unsupported(f"cast to {n.to} is not supported")
            cs = E.children(n)
            level[n] = ROW if any(level[c] == ROW for c in cs) else SCALAR
            stage[n] = max(stage[c] for c in cs)
        else:
            raise Unsupported(f"node {type(n).__name__} is not supported")
        if level[n] == ROW:
            role = _node_role(n, batch_dims, row_dim) if n.shape else ROLE_SCALAR
            if role not in (ROLE_ROW, ROLE_COL):
                raise Unsupported(f"{type(n).__name__} of shape {n.shape} mixes rows oddly")

    for o in outputs:
        if o.role == ROLE_ROW and level[o.node] != ROW:
            pass  # a per-row value broadcast over the row: still stored per element
        if o.role == ROLE_ROWSCALAR and level[o.node] == ROW:
            raise Unsupported(f"output {o.name} is per row but its expression varies along it")

    online = _find_online_pairs(reductions, stage)
    return KernelIR(
        name=name,
        batch_dims=tuple(batch_dims),
        row_dim=row_dim,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        order=order,
        level=level,
        stage=stage,
        users=users,
        reductions=reductions,
        gathers=gathers,
        online=online,
        tolerance_rel_norm=tolerance_rel_norm,
        input_by_name=by_name,
        moments=_find_moment_pairs(reductions),
    )


def _find_online_pairs(reductions: list[E.Reduce], stage) -> list[OnlinePair]:
    """Spot sum(exp(F - max(F))) (softmax, log-softmax, logsumexp, cross-entropy)."""
    maxes = [r for r in reductions if r.op == "max"]
    pairs = []
    for r in reductions:
        if r.op != "sum" or not isinstance(r.x, E.Unary) or r.x.op != "exp":
            continue
        inner = r.x.x
        if not (isinstance(inner, E.Binary) and inner.op == "sub"):
            continue
        for m in maxes:
            if m.x == inner.a and inner.b == m:
                pairs.append(OnlinePair(max_node=m, sum_node=r, f_node=inner.a))
                break
    return pairs


def _find_moment_pairs(reductions: list[E.Reduce]) -> list[MomentPair]:
    """Spot mean((X - mean(X)) * (X - mean(X))) next to mean(X) (also with ** 2)."""
    means = [r for r in reductions if r.op == "mean"]
    pairs = []
    for v in means:
        sq = v.x
        if isinstance(sq, E.Binary) and sq.op == "mul" and sq.a == sq.b:
            d = sq.a
        elif (
            isinstance(sq, E.Binary)
            and sq.op == "pow"
            and isinstance(sq.b, E.Const)
            and float(sq.b.value) == 2.0
        ):
            d = sq.a
        else:
            continue
        if not (isinstance(d, E.Binary) and d.op == "sub"):
            continue
        for m in means:
            if m is not v and m.x == d.a and d.b == m:
                pairs.append(MomentPair(mean_node=m, var_node=v, x_node=m.x))
                break
    return pairs


def reduction_aliases(reductions: list[E.Reduce]) -> dict[E.Reduce, E.Reduce]:
    """Reductions that differ only in keepdims are one value: map each to the first."""
    first: dict[tuple, E.Reduce] = {}
    alias = {}
    for r in reductions:
        key = (r.op, r.x)
        if key in first:
            alias[r] = first[key]
        else:
            first[key] = r
    return alias
