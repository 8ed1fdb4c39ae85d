"""Lowering a workload onto the matmul family: `lower(workload) -> GemmIR`.

Accepted: one matrix product `a @ b` (or two sharing the left operand, as in SwiGLU's
`silu(x @ wg.T) * (x @ wu.T)`), whose operands are input tensors (the right one may be `w.T`, a
weight stored [N, K]), and outputs that are elementwise expressions of the product(s) and of
other inputs that broadcast against the [M, N] output as one of four roles:

- "col":    shape (N,) or (1, N): one value per output column (a Linear layer's bias);
- "row":    shape (M, 1): one value per output row (a per-token scale);
- "full":   shape (M, N) (with the batch axes, if any): one value per element (a residual);
- "scalar": shape (), (1,) or (1, 1).

Everything else raises `Unsupported` with a reason a customer can read: what the family cannot do
yet, named after the construct in the manifest.
"""

from __future__ import annotations

import dataclasses
import re

from factory.families.base import Unsupported
from factory.families.matmul.ir import (
    ACC,
    ACC2,
    OPERAND_DTYPES,
    OUTPUT_DTYPES,
    EpiInput,
    EpiOutput,
    GemmIR,
    Operand,
)
from factory.spec import expr as E
from factory.spec.parse import shape_text

MAX_MATMULS = 2
_ELEMENTWISE = (E.Input, E.Const, E.Unary, E.Binary, E.Compare, E.Where, E.Cast)


def matmuls_of(workload) -> list[E.MatMul]:
    """The distinct matrix products in the workload's outputs, in order of first appearance."""
    seen: dict[E.Node, None] = {}
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.MatMul):
                seen.setdefault(n, None)
    return list(seen)


def _contains(node: E.Node, cls) -> bool:
    return any(isinstance(n, cls) for n in E.walk(node))


def _operand(node: E.Node, side: str, what: str) -> tuple[str, E.Input]:
    """(layout, input) of a matmul operand: an input tensor, or `w.T` of one."""
    if isinstance(node, E.Input):
        return "row", node
    if isinstance(node, E.Transpose) and isinstance(node.x, E.Input):
        return "col", node.x
    if _contains(node, E.MatMul):
        raise Unsupported(
            f"{what}: the {side} operand is itself a matrix product; a chain of matmuls is two "
            "kernels, not fused yet (write one manifest per product)"
        )
    raise Unsupported(
        f"{what}: the {side} operand is an expression; a matmul's operands must be input "
        "tensors (or w.T of one): a prologue before the product is not fused yet"
    )


def _dim(d, what: str) -> str:
    if not isinstance(d, str):
        raise Unsupported(f"{what} is the literal {d}; the dims of a matmul must be named")
    return d


def _role(t, out_shape: tuple, m: str, n: str) -> str:
    """The role of an epilogue input of shape `t.shape` against an output of `out_shape`."""
    shape = tuple(t.shape)
    if all(d == 1 for d in shape):
        return "scalar"
    if shape == tuple(out_shape) or (shape == (m, n) and len(out_shape) == 2):
        return "full"
    core = shape
    while core and core[0] == 1:  # leading ones broadcast away
        core = core[1:]
    if core == (n,):
        return "col"
    if core == (m, 1):
        return "row"
    raise Unsupported(
        f"input {t.name} has shape {shape_text(shape)}; an input read after the matmul must "
        f"broadcast against the output {shape_text(tuple(out_shape))} as one value per column "
        f"({n},), per row ({m}, 1), per element {shape_text(tuple(out_shape))} or a scalar"
    )


def _substitute(node: E.Node, mapping: dict[E.Node, E.Node], memo: dict) -> E.Node:
    """`node` with every key of `mapping` replaced by its value (structure shared)."""
    if node in mapping:
        return mapping[node]
    if node in memo:
        return memo[node]
    changes = {}
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        if isinstance(v, E.Node):
            w = _substitute(v, mapping, memo)
            if w is not v:
                changes[f.name] = w
    out = dataclasses.replace(node, **changes) if changes else node
    memo[node] = out
    return out


def kernel_name(workload_name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", workload_name)[:40] or "gemm"
    return stem if stem[0].isalpha() else "k_" + stem


def lower(workload) -> GemmIR:
    """The GemmIR of `workload`; raises Unsupported(reason) for what the family cannot do yet."""
    mms = matmuls_of(workload)
    if not mms:
        raise Unsupported("no matrix product (a @ b) in the outputs")
    if len(mms) > MAX_MATMULS:
        raise Unsupported(
            f"{len(mms)} matrix products; the matmul family fuses one, or two sharing their "
            "left operand (x @ wg.T and x @ wu.T)"
        )
    for o in workload.outputs:
        for n in E.walk(o.expr):
            if isinstance(n, E.Reduce) and _contains(n.x, E.MatMul):
                raise Unsupported(
                    f"output {o.name}: {n.op}() of a matrix product; a reduction after the "
                    "matmul (a softmax, a norm, a loss) is not fused yet"
                )
            if isinstance(n, E.MatMul):
                if _contains(n.a, E.Reduce) or _contains(n.b, E.Reduce):
                    raise Unsupported(
                        f"output {o.name}: a reduction feeds the matmul; prologues are not fused"
                    )

    first = mms[0]
    what = "a @ b"
    a_layout, a_in = _operand(first.a, "left", what)
    b_layout, b_in = _operand(first.b, "right", what)
    if a_layout != "row":
        raise Unsupported(
            f"the left operand {a_in.name}.T is column-major; the matmul family reads the left "
            f"operand as stored [M, K] (declare {a_in.name} transposed and drop the .T)"
        )
    b2_in = None
    if len(mms) == 2:
        second = mms[1]
        a2_layout, a2_in = _operand(second.a, "left", what)
        b2_layout, b2_in = _operand(second.b, "right", what)
        if a2_in != a_in or a2_layout != a_layout:
            raise Unsupported(
                "two matrix products with different left operands; the family fuses two only "
                f"when they share it (x @ wg.T and x @ wu.T), not {a_in.name} and {a2_in.name}"
            )
        if b2_layout != b_layout or b2_in.shape != b_in.shape:
            raise Unsupported(
                f"the two right operands {b_in.name} and {b2_in.name} must have one shape and "
                "one layout (both w.T, or both plain)"
            )
        if second.shape != first.shape:
            raise Unsupported("the two matrix products must have the same shape")

    m = _dim(first.shape[-2], "the output's row count")
    n = _dim(first.shape[-1], "the output's column count")
    k = _dim(first.a.shape[-1], "the summed axis")
    if len({m, n, k}) < 3:
        raise Unsupported(
            f"the matmul's dims M={m}, N={n}, K={k} must be three different names (a dim "
            "shared by two roles would tie their sizes)"
        )
    batch = tuple(_dim(d, "a batch axis") for d in first.shape[:-2])
    if len(b_in.shape) > 2:
        raise Unsupported(
            f"the right operand {b_in.name} has batch axes {shape_text(b_in.shape)}; "
            "the family takes a weight shared by the batch (2-D)"
        )
    for op in (a_in, b_in) + ((b2_in,) if b2_in is not None else ()):
        if op.dtype not in OPERAND_DTYPES:
            raise Unsupported(
                f"input {op.name} has dtype {op.dtype}; the tensor cores take "
                f"{' or '.join(OPERAND_DTYPES)} operands"
            )
    if b_in.dtype != a_in.dtype or (b2_in is not None and b2_in.dtype != a_in.dtype):
        raise Unsupported("the matmul's operands must share one dtype (bf16 or fp16)")

    out_shape = first.shape
    mapping: dict[E.Node, E.Node] = {first: E.Input(ACC, out_shape, "fp32")}
    if b2_in is not None:
        mapping[mms[1]] = E.Input(ACC2, out_shape, "fp32")
    memo: dict = {}
    decls = {t.name: t for t in workload.inputs}
    operands = {a_in.name, b_in.name} | ({b2_in.name} if b2_in is not None else set())
    used: dict[str, EpiInput] = {}
    outputs = []
    for o in workload.outputs:
        if tuple(o.shape) != tuple(out_shape):
            raise Unsupported(
                f"output {o.name} has shape {shape_text(o.shape)}; every output of a matmul "
                f"kernel is per element of the product {shape_text(out_shape)}"
            )
        if o.dtype == "fp8e4m3":
            raise Unsupported(
                f"output {o.name} has dtype fp8e4m3: fp8 stores are not emitted yet for a job "
                "(the emitter writes e4m3 and the lab bench checks it, but the GPU worker does "
                "not yet poison, read back or judge fp8 outputs)"
            )
        if o.dtype not in OUTPUT_DTYPES:
            raise Unsupported(
                f"output {o.name} has dtype {o.dtype}: not written (the family writes "
                f"{', '.join(OUTPUT_DTYPES)})"
            )
        expr = _substitute(o.expr, mapping, memo)
        nodes = E.walk(expr)
        for node in nodes:  # what the epilogue cannot hold, before the inputs' roles
            if isinstance(node, E.Transpose):
                raise Unsupported(
                    f"output {o.name}: .T outside a matmul's right operand is not supported"
                )
            if isinstance(node, E.Reduce):
                raise Unsupported(
                    f"output {o.name}: {node.op}() beside the matmul; reductions are not fused"
                )
            if isinstance(node, E.Gather):
                raise Unsupported(f"output {o.name}: gather() is not fused with a matmul")
            if not isinstance(node, _ELEMENTWISE):
                raise Unsupported(f"output {o.name}: {type(node).__name__} is not elementwise")
        for node in nodes:
            if isinstance(node, E.Input) and node.name not in (ACC, ACC2):
                if node.name in operands:
                    raise Unsupported(
                        f"output {o.name}: the matmul operand {node.name} is also read in the "
                        "epilogue; pass it as a separate input"
                    )
                decl = decls[node.name]
                if decl.dtype not in E.FLOAT_DTYPES:
                    raise Unsupported(
                        f"input {decl.name} ({decl.dtype}): the epilogue reads float inputs only"
                    )
                if decl.name not in used:
                    used[decl.name] = EpiInput(decl.name, decl.dtype, _role(decl, out_shape, m, n))
        outputs.append(EpiOutput(o.name, o.dtype, expr))

    ir = GemmIR(
        name=kernel_name(workload.name),
        m=m,
        n=n,
        k=k,
        batch=batch,
        a=Operand(a_in.name, a_in.dtype, "row"),
        b=Operand(b_in.name, b_in.dtype, b_layout),
        b2=Operand(b2_in.name, b2_in.dtype, b_layout) if b2_in is not None else None,
        inputs=tuple(used.values()),
        outputs=tuple(outputs),
    )
    problems = ir.problems()
    if problems:
        raise Unsupported("; ".join(problems))
    _check_emittable(ir, workload)
    return ir


def _check_emittable(ir: GemmIR, workload) -> None:
    """Unsupported when no schedule of the family's space renders `ir` at every shape of the
    job (the emitter's own reason: batched GEMMs, B stored [K, N], K not a multiple of 8, ...)."""
    from factory.families.matmul.space import candidates, is_valid

    shapes = [dict(d) for d in (*workload.shapes, *workload.heldout_shapes)]
    reason = ""
    for s in candidates(ir):
        why = is_valid(ir, s)
        if why is None:
            for d in shapes:
                why = is_valid(ir, s, d)
                if why is not None:
                    where = ", ".join(f"{k}={v}" for k, v in d.items())
                    why = f"at {where}: {why}"
                    break
        if why is None:
            return
        reason = reason or why
    if "B must be stored [N, K]" in reason:
        reason = (
            f"the right operand {ir.b.name} is stored [K, N]; the tensor-core path reads a "
            f"weight stored [N, K]: declare {ir.b.name} with shape [{ir.n}, {ir.k}] and write "
            f"{ir.a.name} @ {ir.b.name}.T"
        )
    raise Unsupported(reason or "no schedule of the matmul family renders this workload")
