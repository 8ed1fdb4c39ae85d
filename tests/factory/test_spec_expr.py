"""The expression language: what each construct parses to (nodes from factory.spec.expr), shapes
under numpy broadcasting, and the node graph's structural sharing."""

import pickle

import pytest

from factory.spec.expr import (
    Binary,
    Cast,
    Compare,
    Const,
    Gather,
    Input,
    Reduce,
    Unary,
    Where,
    walk,
)
from factory.spec.parse import ExprError, ExprParser, broadcast_shapes

X = Input("x", ("M", "N"), "bf16")
W = Input("w", ("N",), "fp32")
T = Input("t", ("M",), "int64")
S = Input("s", (), "fp32")


def parse(text):
    return ExprParser({"x": X, "w": W, "t": T, "s": S, "k": Const(0.5)}).parse(text)


def test_arithmetic_broadcasts_like_numpy():
    n = parse("x * w + 1")
    assert n == Binary("add", Binary("mul", X, W, ("M", "N")), Const(1.0), ("M", "N"))
    assert parse("s - x").shape == ("M", "N")
    assert broadcast_shapes(("M", 1), (1, "N")) == ("M", "N")
    assert broadcast_shapes((), ("M",)) == ("M",)
    with pytest.raises(ExprError, match="cannot broadcast"):
        parse("x + t")  # (M, N) and (M,): numpy aligns from the right


@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs"])
def test_unary_functions(fn):
    assert parse(f"{fn}(x)") == Unary(fn, X, ("M", "N"))


def test_negation_folds_into_constants_and_becomes_neg_otherwise():
    assert parse("-3") == Const(-3.0)
    assert parse("-x") == Unary("neg", X, ("M", "N"))
    assert parse("+x") is X


def test_constant_arithmetic_is_folded():
    assert parse("2 * 3 + 1") == Const(7.0)
    assert parse("k * 4") == Const(2.0)
    with pytest.raises(ExprError, match="division by zero"):
        parse("1 / 0")


def test_max_and_min_with_two_arguments_are_elementwise():
    assert parse("max(x, 0)") == Binary("max", X, Const(0.0), ("M", "N"))
    assert parse("min(w, x)").shape == ("M", "N")


def test_max_with_one_argument_reduces_the_last_axis():
    assert parse("max(x)") == Reduce("max", X, 1, False, ("M",))
    assert parse("max(x, axis=0)") == Reduce("max", X, 0, False, ("N",))
    assert parse("min(x, axis=-1, keepdims=True)") == Reduce("min", X, 1, True, ("M", 1))


@pytest.mark.parametrize("fn", ["sum", "mean"])
def test_sum_and_mean_reduce_with_axis_and_keepdims(fn):
    assert parse(f"{fn}(x)").shape == ("M",)
    assert parse(f"{fn}(x, keepdims=True)").shape == ("M", 1)
    assert parse(f"{fn}(x, axis=-2, keepdims=True)") == Reduce(fn, X, 0, True, (1, "N"))
    with pytest.raises(ExprError, match="out of range"):
        parse(f"{fn}(x, axis=2)")
    with pytest.raises(ExprError, match="scalar"):
        parse(f"{fn}(s)")
    with pytest.raises(ExprError, match="keyword"):
        parse(f"{fn}(x, where=1)")
    with pytest.raises(ExprError, match="axis must be"):
        parse(f"{fn}(x, axis=k)")


def test_comparisons_give_masks_for_where_only():
    c = parse("x > w")
    assert c == Compare("gt", X, W, ("M", "N")) and c.dtype == "bool"
    assert parse("where(x >= 0, x, 0.0)") == Where(
        Compare("ge", X, Const(0.0), ("M", "N")), X, Const(0.0), ("M", "N")
    )
    for op, name in [("<", "lt"), ("<=", "le"), ("==", "eq"), ("!=", "ne")]:
        assert parse(f"x {op} 1").op == name


def test_index_inputs_compare_and_mix_with_floats():
    assert parse("where(t != 0, 1.0, 0.0)").shape == ("M",)
    assert parse("t * 2").dtype == "fp32"


def test_gather_reads_along_the_last_axis():
    assert parse("gather(x, t)") == Gather(X, T, ("M",))
    with pytest.raises(ExprError, match="int32/int64 input"):
        parse("gather(x, w)")
    with pytest.raises(ExprError, match="idx has shape"):
        parse("gather(w, t)")


def test_casts_round_to_storage_dtypes():
    assert parse("bf16(x * 2)") == Cast(
        Binary("mul", X, Const(2.0), ("M", "N")), "bf16", ("M", "N")
    )
    assert parse("f16(x)").to == "fp16" and parse("f32(x)").to == "fp32"


def test_power_takes_a_bounded_constant_exponent():
    assert parse("x ** 2") == Binary("pow", X, Const(2.0), ("M", "N"))
    assert parse("x ** -0.5").b == Const(-0.5)
    with pytest.raises(ExprError, match="exponent too large"):
        parse("x ** 17")


def test_equal_subexpressions_are_one_node():
    n = parse("exp(x - max(x, keepdims=True)) / sum(exp(x - max(x, keepdims=True)), keepdims=True)")
    assert n.a is n.b.x
    nodes = walk(n)
    assert len(nodes) == len(set(nodes))
    assert sum(isinstance(m, Unary) and m.op == "exp" for m in nodes) == 1


def test_deep_shared_graphs_hash_compare_and_pickle_in_linear_time():
    a = X
    for _ in range(200):  # a tree of 2**200 leaves, a DAG of 201 nodes
        a = Binary("add", a, a, ("M", "N"))
    b = pickle.loads(pickle.dumps(a))
    assert a == b and hash(a) == hash(b) and len(walk(b)) == 201
    assert "_hash" not in pickle.loads(pickle.dumps(X)).__dict__
    c = Binary("add", a, Const(1.0), ("M", "N"))
    assert c != Binary("add", b, Const(2.0), ("M", "N"))
