"""Hand-built expression DAGs (the catalogue's shapes of operator, and a few customer-style ones)
lowered to the kernel IR, plus a small float64 evaluator of DAGs used by the GPU checks.

These do not depend on factory.spec's parser: they build the frozen nodes directly.
"""

from __future__ import annotations

import numpy as np
import pytest

from factory.families.row.ir import (
    ROLE_COL,
    ROLE_ROW,
    ROLE_ROWSCALAR,
    OutputRef,
    TensorRef,
    Unsupported,
    lower_nodes,
)
from factory.spec import expr as E

S = ("M", "N")
R1 = ("M", 1)


def _x(name="x", dt="bf16"):
    return E.Input(name, S, dt)


def _lower(name, inputs, outputs, tol=1e-2):
    return lower_nodes(
        name=name,
        batch_dims=("M",),
        row_dim="N",
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        tolerance_rel_norm=tol,
    )


def softmax(dt="bf16", log=False):
    x = _x(dt=dt)
    m = E.Reduce("max", x, 1, True, R1)
    d = E.Binary("sub", x, m, S)
    e = E.Unary("exp", d, S)
    s = E.Reduce("sum", e, 1, True, R1)
    y = E.Binary("sub", d, E.Unary("log", s, R1), S) if log else E.Binary("div", e, s, S)
    return _lower(
        "log_softmax" if log else "softmax",
        [TensorRef("x", dt, ROLE_ROW)],
        [OutputRef("y", dt, ROLE_ROW, y)],
        1e-2 if dt != "fp32" else 1e-5,
    )


def layernorm(dt="bf16"):
    x, w, b = _x(dt=dt), E.Input("w", ("N",), dt), E.Input("b", ("N",), dt)
    mu = E.Reduce("mean", x, 1, True, R1)
    d = E.Binary("sub", x, mu, S)
    var = E.Reduce("mean", E.Binary("mul", d, d, S), 1, True, R1)
    r = E.Unary("rsqrt", E.Binary("add", var, E.Const(1e-5), R1), R1)
    y = E.Binary("add", E.Binary("mul", E.Binary("mul", d, r, S), w, S), b, S)
    ins = [TensorRef("x", dt, ROLE_ROW), TensorRef("w", dt, ROLE_COL), TensorRef("b", dt, ROLE_COL)]
    return _lower("layernorm", ins, [OutputRef("y", dt, ROLE_ROW, y)])


def add_rmsnorm(dt="bf16"):
    x, r, w = _x(dt=dt), _x("r", dt), E.Input("w", ("N",), dt)
    h = E.Binary("add", x, r, S)
    hc = E.Cast(h, dt, S)
    ms = E.Reduce("mean", E.Binary("mul", hc, hc, S), 1, True, R1)
    rs = E.Unary("rsqrt", E.Binary("add", ms, E.Const(1e-6), R1), R1)
    y = E.Binary("mul", E.Binary("mul", hc, rs, S), w, S)
    ins = [TensorRef("x", dt, ROLE_ROW), TensorRef("r", dt, ROLE_ROW), TensorRef("w", dt, ROLE_COL)]
    outs = [OutputRef("h", dt, ROLE_ROW, h), OutputRef("y", dt, ROLE_ROW, y)]
    return _lower("add_rmsnorm", ins, outs)


def silu_mul(dt="bf16"):
    a, b = _x("a", dt), _x("b", dt)
    y = E.Binary("mul", E.Binary("mul", a, E.Unary("sigmoid", a, S), S), b, S)
    ins = [TensorRef("a", dt, ROLE_ROW), TensorRef("b", dt, ROLE_ROW)]
    return _lower("silu_mul", ins, [OutputRef("y", dt, ROLE_ROW, y)])


def gelu_tanh(dt="bf16"):
    x = _x(dt=dt)
    x3 = E.Binary("pow", x, E.Const(3.0), S)
    inner = E.Binary(
        "mul",
        E.Const(0.7978845608028654),
        E.Binary("add", x, E.Binary("mul", E.Const(0.044715), x3, S), S),
        S,
    )
    y = E.Binary(
        "mul",
        E.Binary("mul", E.Const(0.5), x, S),
        E.Binary("add", E.Const(1.0), E.Unary("tanh", inner, S), S),
        S,
    )
    return _lower("gelu_tanh", [TensorRef("x", dt, ROLE_ROW)], [OutputRef("y", dt, ROLE_ROW, y)])


def cross_entropy():
    x, t = _x("logits", "bf16"), E.Input("target", ("M",), "int64")
    m = E.Reduce("max", x, 1, True, R1)
    s = E.Reduce("sum", E.Unary("exp", E.Binary("sub", x, m, S), S), 1, True, R1)
    lse = E.Binary("add", m, E.Unary("log", s, R1), R1)
    loss = E.Binary("sub", lse, E.Gather(x, t, ("M",)), ("M",))
    ins = [TensorRef("logits", "bf16", ROLE_ROW), TensorRef("target", "int64", ROLE_ROWSCALAR)]
    return _lower("cross_entropy", ins, [OutputRef("loss", "fp32", ROLE_ROWSCALAR, loss)], 1e-5)


def masked_scaled_sum():
    """A customer-style operator: where(mask > 0.5, x * scale[row], 0) summed and stored per
    row, plus the row minimum, with fp32 inputs and an erf along the way."""
    x, mask, sc = _x("x", "fp32"), _x("mask", "fp32"), E.Input("scale", ("M", 1), "fp32")
    v = E.Where(
        E.Compare("gt", mask, E.Const(0.5), S, "bool"),
        E.Binary("mul", E.Unary("erf", x, S), sc, S),
        E.Const(0.0),
        S,
    )
    total = E.Reduce("sum", v, 1, True, R1)
    lo = E.Reduce("min", x, 1, False, ("M",))
    ins = [
        TensorRef("x", "fp32", ROLE_ROW),
        TensorRef("mask", "fp32", ROLE_ROW),
        TensorRef("scale", "fp32", ROLE_ROWSCALAR),
    ]
    outs = [
        OutputRef("total", "fp32", ROLE_ROWSCALAR, total),
        OutputRef("lo", "fp32", ROLE_ROWSCALAR, lo),
    ]
    return _lower("masked_scaled_sum", ins, outs, 1e-5)


EXAMPLES = {
    "softmax": softmax,
    "log_softmax": lambda: softmax(log=True),
    "softmax_fp32": lambda: softmax("fp32"),
    "layernorm": layernorm,
    "add_rmsnorm": add_rmsnorm,
    "silu_mul": silu_mul,
    "gelu_tanh": gelu_tanh,
    "gelu_tanh_fp16": lambda: gelu_tanh("fp16"),
    "cross_entropy": cross_entropy,
    "masked_scaled_sum": masked_scaled_sum,
}


# ---------------------------------------------------------------- float64 DAG evaluation

_U = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda a: 1.0 / np.sqrt(a),
    "tanh": np.tanh,
    "sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a)),
    "abs": np.abs,
}
_B = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}
_C = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
_C |= {"eq": np.equal, "ne": np.not_equal}
_R = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _erf(a):
    import math

    return np.vectorize(math.erf)(a)


def _round_to(a, dt):
    if dt == "fp32":
        return a.astype(np.float32).astype(np.float64)
    if dt == "fp16":
        return a.astype(np.float16).astype(np.float64)
    return bf16_to_f64(f64_to_bf16(a))


def eval64(node, env: dict):
    """Evaluate a DAG in float64 over broadcastable arrays (M, N) / (N,) / (M, 1) / (M,)."""
    memo: dict = {}
    for n in E.walk(node):
        if isinstance(n, E.Input):
            v = env[n.name]
            if n.shape == ("M",):
                v = v.reshape(-1, 1) if v.dtype.kind == "f" else v
        elif isinstance(n, E.Const):
            v = np.float64(n.value)
        elif isinstance(n, E.Unary):
            v = _erf(memo[n.x]) if n.op == "erf" else _U[n.op](memo[n.x])
        elif isinstance(n, E.Binary):
            v = _B[n.op](memo[n.a], memo[n.b])
        elif isinstance(n, E.Compare):
            v = _C[n.op](memo[n.a], memo[n.b])
        elif isinstance(n, E.Where):
            v = np.where(memo[n.cond], memo[n.a], memo[n.b])
        elif isinstance(n, E.Reduce):
            v = _R[n.op](memo[n.x], axis=-1, keepdims=True)
        elif isinstance(n, E.Gather):
            idx = np.asarray(env[n.idx.name]).reshape(-1)
            v = memo[n.x][np.arange(idx.size), idx].reshape(-1, 1)
        elif isinstance(n, E.Cast):
            v = _round_to(memo[n.x], n.to)
        memo[n] = v
    return memo[node]


def f64_to_bf16(a) -> np.ndarray:
    """Round-to-nearest-even float64 -> bf16 bits (uint16)."""
    f = np.asarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f64(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


# ---------------------------------------------------------------- CPU tests of the lowering


def test_softmax_lowers_to_three_stages_with_an_online_pair():
    ir = softmax()
    assert ir.num_stages == 3
    assert len(ir.online) == 1 and ir.online[0].max_node.op == "max"
    assert [t.role for t in ir.inputs] == [ROLE_ROW]


def test_layernorm_has_dependent_reductions_and_column_vectors():
    ir = layernorm()
    assert [r.op for r in ir.reductions] == ["mean", "mean"]
    assert ir.num_stages == 3
    assert {t.name: t.role for t in ir.inputs} == {"x": "row", "w": "col", "b": "col"}
    assert ir.online == []


def test_cross_entropy_gathers_one_element_per_row_and_writes_a_row_scalar():
    ir = cross_entropy()
    assert len(ir.gathers) == 1
    assert ir.outputs[0].role == ROLE_ROWSCALAR
    assert ir.num_stages == 2  # max, then sum of exp; the loss itself is per-row arithmetic


def test_equal_subexpressions_are_shared():
    ir = silu_mul()
    inputs = [n for n in ir.order if isinstance(n, E.Input)]
    assert sorted(n.name for n in inputs) == ["a", "b"]


def test_a_reduction_along_the_batch_axis_is_unsupported():
    x = _x()
    col_sum = E.Reduce("sum", x, 0, True, (1, "N"))
    with pytest.raises(Unsupported, match="last axis"):
        _lower(
            "bad", [TensorRef("x", "bf16", ROLE_ROW)], [OutputRef("y", "fp32", ROLE_ROW, col_sum)]
        )


def test_a_per_row_output_that_varies_along_the_row_is_unsupported():
    with pytest.raises(Unsupported, match="varies along"):
        _lower(
            "bad",
            [TensorRef("x", "bf16", ROLE_ROW)],
            [OutputRef("y", "fp32", ROLE_ROWSCALAR, _x())],
        )


def test_the_float64_evaluator_matches_numpy_softmax():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 7))
    y = eval64(softmax("fp32").outputs[0].node, {"x": x})
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(1, keepdims=True))
